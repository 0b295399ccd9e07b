"""MeteredSemaphore: drop-in behaviour, exact counts, FIFO, and every failure path."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from gym_concurrency import MeteredSemaphore, QueueFullError


async def settle(rounds: int = 5) -> None:
    """Let every ready task run: handed-over waiters resume, cancellations land."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def hold(sem: MeteredSemaphore, release: asyncio.Event, log: list[str], name: str) -> None:
    async with sem:
        log.append(name)
        await release.wait()


def test_is_a_bounded_semaphore() -> None:
    assert isinstance(MeteredSemaphore(3), asyncio.BoundedSemaphore)


async def test_async_with_acquire_release_and_locked() -> None:
    sem = MeteredSemaphore(2)
    assert await sem.acquire() is True
    assert not sem.locked()
    async with sem:
        assert sem.locked()
        assert (sem.active, sem.available) == (2, 0)
    sem.release()
    assert (sem.limit, sem.active, sem.available, sem.queue_depth) == (2, 0, 2, 0)


async def test_state_while_full_and_queued() -> None:
    sem = MeteredSemaphore(2)
    release = asyncio.Event()
    log: list[str] = []
    tasks = [asyncio.create_task(hold(sem, release, log, str(i))) for i in range(5)]
    await settle()
    assert (sem.limit, sem.active, sem.available, sem.queue_depth) == (2, 2, 0, 3)
    release.set()
    await asyncio.gather(*tasks)
    assert (sem.active, sem.available, sem.queue_depth) == (0, 2, 0)


async def test_fifo_order() -> None:
    sem = MeteredSemaphore(1)
    await sem.acquire()
    order: list[int] = []

    async def take(i: int) -> None:
        async with sem:
            order.append(i)

    tasks = []
    for i in range(10):
        tasks.append(asyncio.create_task(take(i)))
        await asyncio.sleep(0)  # each queues before the next is made
    sem.release()
    await asyncio.gather(*tasks)
    assert order == list(range(10))


async def test_release_hands_the_slot_to_the_waiter_not_a_newcomer() -> None:
    sem = MeteredSemaphore(1)
    await sem.acquire()
    waiter = asyncio.create_task(sem.acquire())
    await settle()
    sem.release()
    # The slot now belongs to the waiter even though it has not resumed yet.
    assert sem.locked()
    newcomer = asyncio.create_task(sem.acquire())
    await settle()
    assert waiter.done()
    assert not newcomer.done()
    assert (sem.active, sem.queue_depth) == (1, 1)
    sem.release()
    await newcomer
    sem.release()
    assert sem.active == 0


async def test_try_acquire_takes_a_free_slot_but_never_jumps_the_queue() -> None:
    sem = MeteredSemaphore(2)
    assert sem.try_acquire() is True
    assert sem.try_acquire() is True
    assert sem.try_acquire() is False  # full
    waiter = asyncio.create_task(sem.acquire())
    await settle()
    sem.release()  # handed to the waiter, which has not resumed yet
    assert sem.try_acquire() is False  # the slot is the waiter's, not a newcomer's
    await waiter
    sem.release()
    assert sem.try_acquire() is True  # free, and nobody waits
    assert (sem.active, sem.queue_depth, sem.admission_shed) == (2, 0, 0)


async def test_over_release_raises_and_changes_nothing() -> None:
    sem = MeteredSemaphore(2)
    await sem.acquire()
    sem.release()
    with pytest.raises(ValueError, match="no slot held"):
        sem.release()
    assert (sem.active, sem.available) == (0, 2)
    async with sem:
        pass


async def test_timeout_raises_builtin_timeout_error_and_counts_a_timeout() -> None:
    sem = MeteredSemaphore(1, timeout=0.05)
    await sem.acquire()
    with pytest.raises(TimeoutError, match=r"no slot within 0\.05 s"):
        await sem.acquire()
    assert (sem.admission_timeouts, sem.admission_cancelled, sem.queue_depth) == (1, 0, 0)
    assert sem.active == 1
    sem.release()
    async with sem:  # the limit still works after a timeout
        assert sem.active == 1


async def test_timeout_does_not_fire_once_admitted() -> None:
    sem = MeteredSemaphore(1, timeout=0.1)
    await sem.acquire()
    waiter = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0.02)
    sem.release()
    assert await waiter is True
    await asyncio.sleep(0.15)  # past the deadline: the cancelled timer must not fire
    assert (sem.admission_timeouts, sem.active, sem.queue_depth) == (0, 1, 0)


async def test_outer_wait_for_counts_a_cancellation_not_a_timeout() -> None:
    sem = MeteredSemaphore(1, timeout=10)
    await sem.acquire()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(sem.acquire(), 0.02)
    assert (sem.admission_timeouts, sem.admission_cancelled, sem.queue_depth) == (0, 1, 0)


async def test_cancel_while_waiting_counts_and_reraises() -> None:
    sem = MeteredSemaphore(1)
    await sem.acquire()
    waiter = asyncio.create_task(sem.acquire())
    await settle()
    assert sem.queue_depth == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (sem.admission_cancelled, sem.queue_depth, sem.active) == (1, 0, 1)


async def test_slot_handed_to_a_waiter_cancelled_in_the_same_step_passes_on() -> None:
    sem = MeteredSemaphore(1)
    await sem.acquire()
    first = asyncio.create_task(sem.acquire())
    second = asyncio.create_task(sem.acquire())
    await settle()
    sem.release()  # hands the slot to `first`...
    first.cancel()  # ...which is cancelled before it can resume
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second is True
    assert (sem.active, sem.queue_depth, sem.admission_cancelled) == (1, 0, 1)
    sem.release()
    assert sem.active == 0


async def test_slot_handed_to_the_last_waiter_cancelled_in_the_same_step_is_freed() -> None:
    sem = MeteredSemaphore(1)
    await sem.acquire()
    only = asyncio.create_task(sem.acquire())
    await settle()
    sem.release()
    only.cancel()
    with pytest.raises(asyncio.CancelledError):
        await only
    assert (sem.active, sem.available, sem.admission_cancelled) == (0, 1, 1)


@pytest.mark.parametrize("release_first", [True, False], ids=["release-first", "timeout-first"])
async def test_release_and_timeout_in_one_loop_step_lose_no_slot(release_first: bool) -> None:
    # The holder's release and the first waiter's deadline become due while the loop is
    # blocked, so both run in the same loop step, in the order of their due times. Either
    # way the first waiter is admitted or timed out exactly once, and the slot reaches the
    # second waiter.
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    sem = MeteredSemaphore(1, timeout=0.2)
    await sem.acquire()
    started = loop.time()
    first = asyncio.create_task(sem.acquire())  # its deadline: started + 0.2 (+ a step)
    await asyncio.sleep(0.05)
    second = asyncio.create_task(sem.acquire())  # deadline started + 0.25: not due yet
    await asyncio.sleep(0)
    loop.call_at(started + (0.18 if release_first else 0.22), sem.release)
    loop.call_at(started + 0.1, time.sleep, 0.14)  # blocks the loop past both
    results = await asyncio.gather(first, return_exceptions=True)
    if release_first:
        assert results == [True]
        assert sem.admission_timeouts == 0
        sem.release()  # the first waiter's slot goes on to the second
    else:
        assert isinstance(results[0], TimeoutError)
        assert sem.admission_timeouts == 1
    assert await second is True
    assert (sem.active, sem.queue_depth) == (1, 0)
    sem.release()
    assert sem.active == 0
    assert errors == []


async def test_max_queue_sheds_at_once() -> None:
    sem = MeteredSemaphore(1, max_queue=2)
    await sem.acquire()
    waiters = [asyncio.create_task(sem.acquire()) for _ in range(2)]
    await settle()
    with pytest.raises(QueueFullError, match="2 tasks already waiting"):
        await sem.acquire()
    assert (sem.admission_shed, sem.queue_depth) == (1, 2)
    sem.release()
    await waiters[0]
    sem.release()
    await waiters[1]
    sem.release()
    assert (sem.active, sem.queue_depth, sem.admission_shed) == (0, 0, 1)


async def test_max_queue_zero_never_waits() -> None:
    sem = MeteredSemaphore(1, max_queue=0)
    async with sem:
        with pytest.raises(QueueFullError):
            await sem.acquire()
    assert sem.admission_shed == 1
    async with sem:  # free again: admitted without waiting
        pass


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"value": -1}, ValueError, "value must be >= 0"),
        ({"value": "3"}, TypeError, "value must be an int"),
        ({"value": True}, TypeError, "value must be an int"),
        ({"timeout": 0}, ValueError, "timeout must be > 0"),
        ({"timeout": -1.5}, ValueError, "timeout must be > 0"),
        ({"timeout": float("inf")}, ValueError, "finite"),
        ({"timeout": float("nan")}, ValueError, "timeout must be > 0"),
        ({"timeout": "1"}, TypeError, "timeout must be a number"),
        ({"max_queue": -1}, ValueError, "max_queue must be >= 0"),
        ({"max_queue": 1.5}, TypeError, "max_queue must be an int"),
    ],
)
def test_bad_arguments_name_what_was_wrong(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        MeteredSemaphore(**kwargs)  # type: ignore[arg-type]


async def test_storm_of_timeouts_and_cancellations_keeps_exact_counts() -> None:
    rng = random.Random(1234)
    limit, tasks_n = 7, 3000
    sem = MeteredSemaphore(limit, timeout=0.1)
    admitted = 0
    peak = 0

    async def worker() -> None:
        nonlocal admitted, peak
        async with sem:
            admitted += 1
            peak = max(peak, sem.active)
            await asyncio.sleep(rng.random() * 0.004)

    tasks = [asyncio.create_task(worker()) for _ in range(tasks_n)]
    for _ in range(200):
        await asyncio.sleep(0.001)
        for task in rng.sample(tasks, 5):
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert (sem.active, sem.queue_depth, sem.available) == (0, 0, limit)
    assert peak <= limit
    assert sem.admission_timeouts > 0
    assert sem.admission_cancelled > 0
    assert admitted + sem.admission_timeouts + sem.admission_cancelled == tasks_n
