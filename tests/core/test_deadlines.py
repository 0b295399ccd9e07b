"""A waiter's own deadline: `acquire(..., deadline=)` bounds the wait with the limit's timeout
(the sooner wins), a past deadline or one the measured hand-over rate cannot meet is refused
at once, and every path (admitted in time, timed out, cancelled, chosen and heavy) leaves no
timer and no slot behind."""

from __future__ import annotations

import asyncio
import time

import pytest

from gym_concurrency import DeadlineExceededError, MeteredSemaphore
from gym_concurrency.deadline import within_deadline


async def settle(rounds: int = 6) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def timers(sem: MeteredSemaphore) -> int:
    return 0 if sem._queue._deadlines is None else len(sem._queue._deadlines.timers)


@pytest.mark.parametrize(
    ("limit_timeout", "deadline", "bound", "error"),
    [
        (None, 0.1, 0.1, DeadlineExceededError),
        (5, 0.1, 0.1, DeadlineExceededError),
        (0.1, 5, 0.1, TimeoutError),  # the limit's own timeout: no deadline refusal
    ],
)
async def test_the_sooner_of_timeout_and_deadline_bounds_the_wait(  # type: ignore[no-untyped-def]
    limit_timeout, deadline, bound, error
) -> None:
    sem = MeteredSemaphore(1, timeout=limit_timeout)
    await sem.acquire()
    started = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        await sem.acquire(deadline=deadline)
    assert type(raised.value) is error  # the deadline's own refusal, still a TimeoutError
    assert bound * 0.9 <= time.monotonic() - started < bound + 1.0
    assert (sem.admission_timeouts, sem.queue_depth, timers(sem)) == (1, 0, 0)


async def test_a_wait_ends_deadline_when_its_own_deadline_ends_it() -> None:
    sem = MeteredSemaphore(1, timeout=30)
    await sem.acquire()
    assert sem.enqueue(deadline=0).result() == "deadline"  # past: refused at once
    assert await sem.enqueue(deadline=0.05) == "deadline"  # passed while it waited
    timed_out = MeteredSemaphore(1, timeout=0.05)
    await timed_out.acquire()
    assert await timed_out.enqueue(deadline=30) == "timeout"  # the limit's timeout came first
    assert (sem.admission_timeouts, timed_out.admission_timeouts) == (2, 1)


async def test_a_past_deadline_is_refused_at_once_and_counted_as_a_timeout() -> None:
    sem = MeteredSemaphore(1)
    await sem.acquire()
    for deadline in (0, -1.5):
        with pytest.raises(DeadlineExceededError, match="no slot within the deadline"):
            await sem.acquire(deadline=deadline)
    assert (sem.admission_timeouts, sem.queue_depth) == (2, 0)
    sem.release()
    assert await sem.acquire(deadline=0)  # a free slot is taken, whatever the deadline


async def test_admitted_in_time_leaves_no_timer() -> None:
    sem = MeteredSemaphore(1)
    await sem.acquire()
    waiting = asyncio.ensure_future(sem.acquire(deadline=5))
    await settle()
    assert timers(sem) == 1
    sem.release()
    await waiting
    assert (timers(sem), sem.active, sem.admission_timeouts) == (0, 1, 0)


async def test_cancelled_with_a_deadline_leaves_no_timer() -> None:
    sem = MeteredSemaphore(1)
    await sem.acquire()
    waiting = asyncio.ensure_future(sem.acquire(deadline=5))
    await settle()
    waiting.cancel()
    await settle()
    assert (timers(sem), sem.queue_depth, sem.admission_cancelled) == (0, 0, 1)


async def test_a_deadline_the_hand_over_rate_cannot_meet_is_refused_at_once() -> None:
    sem = MeteredSemaphore(2)
    stop = asyncio.Event()

    async def worker() -> None:  # hands over about 2 / 0.02 s = 100 slots a second
        while not stop.is_set():
            async with sem:
                await asyncio.sleep(0.02)

    workers = [asyncio.create_task(worker()) for _ in range(40)]
    await asyncio.sleep(0.3)
    await sem.acquire(deadline=30)  # the rate is measured from here on
    sem.release()
    await asyncio.sleep(2.1)  # a whole second measured, after a second's warm-up
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError):  # ~40 ahead at ~100 / s: not within 0.05 s
        await sem.acquire(deadline=0.05)
    assert time.monotonic() - started < 0.02  # refused as it arrived, not at its end
    assert await sem.acquire(deadline=10)  # one that can be met waits and gets in
    sem.release()
    stop.set()
    await asyncio.gather(*workers)
    assert (sem.active, sem.queue_depth, timers(sem)) == (0, 0, 0)


async def test_a_quiet_flow_is_not_refused_for_a_floods_queue() -> None:
    sem = MeteredSemaphore(2)
    stop = asyncio.Event()

    async def flooder() -> None:
        while not stop.is_set():
            async with sem.hold(flow="flood"):
                await asyncio.sleep(0.02)

    flood = [asyncio.create_task(flooder()) for _ in range(40)]
    await asyncio.sleep(0.3)
    await sem.acquire(flow="quiet", deadline=30)
    sem.release(flow="quiet")
    await asyncio.sleep(2.1)
    # The flood's queue is long, but the quiet flow has nobody ahead of it: it gets in.
    assert await sem.acquire(flow="quiet", deadline=0.1)
    sem.release(flow="quiet")
    stop.set()
    await asyncio.gather(*flood)


async def test_a_heavy_waiter_whose_deadline_passes_frees_what_was_held_for_it() -> None:
    sem = MeteredSemaphore(3)
    await sem.acquire(weight=2)
    heavy = asyncio.ensure_future(sem.acquire(weight=3, flow="heavy", deadline=0.1))
    await settle()
    light = asyncio.ensure_future(sem.acquire(flow="light"))
    await settle()
    assert not light.done()  # the free slot is held for the heavy waiter
    with pytest.raises(DeadlineExceededError):
        await heavy
    await light
    assert (sem.active, sem.admission_timeouts, timers(sem)) == (3, 1, 0)


@pytest.mark.parametrize("deadline", ["1", float("nan"), True])
async def test_a_bad_deadline_names_it(deadline) -> None:  # type: ignore[no-untyped-def]
    sem = MeteredSemaphore(1)
    await sem.acquire()
    with pytest.raises((TypeError, ValueError), match="deadline must be a number of seconds"):
        await sem.acquire(deadline=deadline)
    assert (sem.queue_depth, sem.admission_timeouts) == (0, 0)


async def test_a_wait_inside_a_request_with_a_deadline_ends_with_it() -> None:
    sem = MeteredSemaphore(1, timeout=30)
    await sem.acquire()
    loop = asyncio.get_running_loop()
    with within_deadline(loop.time() + 0.1):  # as the middleware sets it around the app
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError, match="no slot within the deadline"):
            async with sem:
                pass
        with pytest.raises(TimeoutError):
            await sem.acquire(flow="tool")
        assert time.monotonic() - started < 1.0
    waiting = asyncio.ensure_future(sem.acquire())  # outside the request: no deadline
    await asyncio.sleep(0.2)
    assert not waiting.done()
    sem.release()
    await waiting
    assert (sem.admission_timeouts, timers(sem)) == (2, 0)


async def test_no_early_refusal_at_the_onset_of_queueing() -> None:
    # The rate is of hand-overs, which happen only while waiters queue: right after a queue
    # forms it would read far too low, so nothing is refused early until it has stood 2 s.
    sem = MeteredSemaphore(100)
    await sem.acquire(weight=100)
    seen = asyncio.ensure_future(sem.acquire(deadline=5.0))  # a deadline seen: measured
    await settle()
    sem.release(weight=100)
    await seen
    sem.release()
    await asyncio.sleep(2.5)  # idle

    async def hold(i: int) -> None:
        async with sem:
            await asyncio.sleep(0.3 + i * 0.005)

    holders = [asyncio.create_task(hold(i)) for i in range(160)]  # 60 queue behind 100
    await asyncio.sleep(0.35)
    started = time.monotonic()
    assert await sem.acquire(deadline=1.0)  # ~50 ahead at ~200 / s: it makes it in time
    assert time.monotonic() - started < 1.0
    sem.release()
    for task in holders:
        task.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    assert sem.admission_timeouts == 0


@pytest.mark.parametrize("flow", [None, "a"])
async def test_a_waiter_past_its_deadline_is_not_handed_a_slot_when_the_loop_runs_late(
    flow: str | None,
) -> None:
    sem = MeteredSemaphore(1)
    await sem.acquire()
    waiting = asyncio.ensure_future(sem.acquire(flow=flow, deadline=0.05))
    await asyncio.sleep(0.045)
    time.sleep(0.02)  # noqa: ASYNC251 - the loop busy past the deadline, its timer not run
    sem.release()
    with pytest.raises(DeadlineExceededError):
        await waiting
    assert (sem.active, sem.admission_timeouts, timers(sem)) == (0, 1, 0)


async def test_a_deadline_that_leaves_no_time_for_the_work_is_refused_at_once() -> None:
    # Little's law: with the limit full, a unit of weight is held limit / rate seconds; a
    # waiter admitted later than its deadline less that could not finish in time.
    sem = MeteredSemaphore(4)
    stop = asyncio.Event()

    async def worker() -> None:  # each holds 0.2 s: 20 hand-overs a second
        while not stop.is_set():
            async with sem:
                await asyncio.sleep(0.2)

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    await asyncio.sleep(0.1)
    await sem.acquire(deadline=30)  # a deadline waits: the rate is measured from here
    sem.release()
    await asyncio.sleep(2.5)
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError):  # 4 ahead, 0.2 s each: start, not finish
        await sem.acquire(deadline=0.25)
    assert time.monotonic() - started < 0.05
    stop.set()
    await asyncio.gather(*workers)
