"""The limit's timeout timer (queue_timer.py), on an event loop whose clock the test moves:
it fires once for the oldest waiter, is armed again for the next one due, and stays armed
when ending the waits raises (the waiters left still time out)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits.queue_timer import QueueTimer
from tests.core.clock import ManualClockLoop


@pytest.fixture
def loop() -> Iterator[ManualClockLoop]:
    loop = ManualClockLoop()
    yield loop
    loop.close()


def advance(loop: ManualClockLoop, seconds: float) -> None:
    loop.now += seconds
    for _ in range(3):
        loop.run_until_complete(asyncio.sleep(0))


def test_fires_for_each_due_time_and_is_armed_once(loop: ManualClockLoop) -> None:
    due = [10.0, 25.0]
    fired: list[float] = []

    def expire(now: float) -> None:
        fired.append(now)
        while due and due[0] <= now:
            due.pop(0)

    timer = QueueTimer(expire, lambda: due[0] if due else None)
    timer.arm(loop, 10.0)
    timer.arm(loop, 25.0)  # armed already, for the sooner one
    advance(loop, 9.0)
    assert fired == []
    advance(loop, 1.0)
    assert len(fired) == 1
    assert fired[0] >= 10.0
    advance(loop, 15.0)  # armed again by itself for the next one due
    assert len(fired) == 2
    assert due == []
    advance(loop, 100.0)
    assert len(fired) == 2  # nothing due: not armed


def test_armed_again_when_expiring_raises(loop: ManualClockLoop) -> None:
    due = [1.0, 2.0]
    fired: list[float] = []

    def expire(now: float) -> None:
        fired.append(now)
        due.pop(0)
        if len(fired) == 1:
            raise RuntimeError("ending a wait failed")

    timer = QueueTimer(expire, lambda: due[0] if due else None)
    timer.arm(loop, 1.0)
    errors: list[object] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context["exception"]))
    advance(loop, 1.0)
    assert len(errors) == 1
    advance(loop, 1.0)  # the second waiter still times out
    assert len(fired) == 2


def test_a_limit_times_out_each_waiter_at_its_own_time(loop: ManualClockLoop) -> None:
    sem = MeteredSemaphore(1, timeout=10.0)
    assert sem.try_acquire()
    first = loop.create_task(sem.acquire())
    advance(loop, 0.0)  # queued at 0: due at 10
    advance(loop, 4.0)
    second = loop.create_task(sem.acquire())
    advance(loop, 0.0)  # queued at 4: due at 14
    advance(loop, 5.0)
    assert not first.done()
    advance(loop, 1.0)
    assert isinstance(first.exception(), TimeoutError)
    assert not second.done()
    advance(loop, 4.0)
    assert isinstance(second.exception(), TimeoutError)
    assert (sem.admission_timeouts, sem.queue_depth, sem.active) == (2, 0, 1)


def test_a_fault_that_lasts_fires_it_again_no_sooner_than_a_tenth_of_a_second(
    loop: ManualClockLoop,
) -> None:
    """A waiter long overdue whose end keeps raising: the timer is armed again after each
    failure, but 0.1 s on, not at once (which would spin the loop on tracebacks)."""
    fired: list[float] = []

    def expire(now: float) -> None:
        fired.append(now)
        raise RuntimeError("ending a wait failed")

    timer = QueueTimer(expire, lambda: 0.5)  # never ends: due long ago
    errors: list[object] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context["exception"]))
    timer.arm(loop, 0.5)
    loop.now = 1.0
    for _ in range(50):
        loop.run_until_complete(asyncio.sleep(0))
    assert len(fired) == 1  # not again within the same moment
    advance(loop, 0.1)
    assert len(fired) == 2
    assert fired[1] - fired[0] >= 0.1
    assert len(errors) == 2
