"""MeteredSemaphore's non-raising admission (`enqueue` / `leave`) and `resize`, clause by clause."""

from __future__ import annotations

import asyncio

import pytest

from gym_concurrency import MeteredSemaphore, QueueFullError


async def steps(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_full_queue_is_a_shed_future_at_once_not_an_exception():
    sem = MeteredSemaphore(1, max_queue=0)
    assert sem.try_acquire()
    waiter = sem.enqueue()
    assert waiter.done()
    assert waiter.result() == "shed"
    assert (sem.admission_shed, sem.queue_depth) == (1, 0)
    sem.leave(waiter)  # leaving a wait that already ended counts nothing more
    assert (sem.admission_shed, sem.admission_cancelled) == (1, 0)


async def test_a_released_slot_resolves_the_oldest_waiter_admitted():
    sem = MeteredSemaphore(1)
    assert sem.try_acquire()
    first, second = sem.enqueue(), sem.enqueue()
    sem.release()
    assert (first.result(), second.done(), sem.active, sem.queue_depth) == ("admitted", False, 1, 1)


async def test_a_deadline_resolves_timeout_counted_once():
    sem = MeteredSemaphore(1, timeout=0.05)
    assert sem.try_acquire()
    waiter = sem.enqueue()
    assert await asyncio.wait_for(waiter, 2) == "timeout"
    sem.leave(waiter)
    assert (sem.admission_timeouts, sem.admission_cancelled, sem.queue_depth) == (1, 0, 0)


async def test_one_timer_times_out_each_waiter_at_its_own_deadline():
    sem = MeteredSemaphore(1, timeout=0.2)
    assert sem.try_acquire()
    loop = asyncio.get_running_loop()
    started = loop.time()
    early = sem.enqueue()
    await asyncio.sleep(0.1)
    late = sem.enqueue()
    assert await early == "timeout"
    early_at = loop.time() - started
    assert not late.done()
    assert await late == "timeout"
    late_at = loop.time() - started
    assert 0.19 <= early_at < late_at
    assert late_at - early_at >= 0.08


async def test_leaving_while_queued_counts_a_cancel_and_frees_the_place():
    sem = MeteredSemaphore(1, max_queue=1)
    assert sem.try_acquire()
    waiter = sem.enqueue()
    sem.leave(waiter)
    assert (sem.admission_cancelled, sem.queue_depth, waiter.cancelled()) == (1, 0, True)
    assert sem.enqueue().done() is False  # its place in the queue is free again


async def test_leaving_just_after_being_handed_a_slot_passes_the_slot_on():
    sem = MeteredSemaphore(1)
    assert sem.try_acquire()
    first, second = sem.enqueue(), sem.enqueue()
    sem.release()  # handed to `first`, which gives up in the same moment
    sem.leave(first)
    assert second.result() == "admitted"
    assert (sem.active, sem.admission_cancelled) == (1, 1)


async def test_leaving_uncounted_is_for_a_request_that_failed_on_its_own():
    sem = MeteredSemaphore(1)
    assert sem.try_acquire()
    waiter = sem.enqueue()
    sem.leave(waiter, cancelled=False)
    assert (sem.admission_cancelled, sem.queue_depth) == (0, 0)


async def test_growing_admits_waiters_at_once_in_order():
    sem = MeteredSemaphore(1)
    assert sem.try_acquire()
    waiters = [sem.enqueue() for _ in range(4)]
    sem.resize(3)
    assert [w.done() for w in waiters] == [True, True, False, False]
    assert (sem.limit, sem.active, sem.available, sem.queue_depth) == (3, 3, 0, 2)


async def test_shrinking_revokes_nothing_and_admits_nobody_until_below_the_limit():
    sem = MeteredSemaphore(3)
    for _ in range(3):
        assert sem.try_acquire()
    waiter = sem.enqueue()
    sem.resize(1)
    assert (sem.limit, sem.active, sem.available) == (1, 3, 0)
    sem.release()
    sem.release()
    assert not waiter.done()  # 1 still held: at the limit
    sem.release()
    assert waiter.result() == "admitted"
    assert sem.active == 1


async def test_zero_pauses_admission_while_timeouts_still_run():
    sem = MeteredSemaphore(2, timeout=0.05)
    sem.resize(0)
    assert not sem.try_acquire()
    waiter = sem.enqueue()
    assert await asyncio.wait_for(waiter, 2) == "timeout"
    patient = sem.enqueue()
    sem.resize(1)
    assert patient.result() == "admitted"


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_resize_refuses_what_is_not_a_slot_count(bad: object):
    sem = MeteredSemaphore(1)
    with pytest.raises((TypeError, ValueError), match="must be"):
        sem.resize(bad)  # type: ignore[arg-type]
    assert sem.limit == 1


async def test_acquire_still_raises_as_documented():
    sem = MeteredSemaphore(1, timeout=0.02, max_queue=1)
    assert sem.try_acquire()
    waiting = asyncio.create_task(sem.acquire())
    await steps()
    with pytest.raises(QueueFullError, match="max_queue=1"):
        await sem.acquire()
    with pytest.raises(TimeoutError):
        await waiting


async def test_a_request_is_not_shed_while_a_slot_is_free_for_a_hand_over() -> None:
    # Two holders release while one waits: the waiter is handed a slot (not yet resumed), one
    # slot is free. Two requests arriving then wait for the hand-over; none is shed.
    sem = MeteredSemaphore(2, max_queue=1)
    await sem.acquire()
    await sem.acquire()
    waiter = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0)
    sem.release()
    sem.release()
    first = asyncio.create_task(sem.acquire())
    second = asyncio.create_task(sem.acquire())
    assert await waiter is True
    assert await first is True
    sem.release()
    assert await second is True
    assert sem.admission_shed == 0
    assert (sem.active, sem.queue_depth) == (2, 0)


async def test_a_slot_handed_over_is_held_back_until_its_waiter_settles() -> None:
    # asyncio.Semaphore's FIFO: a slot handed to a waiter whose task has not resumed yet is not
    # taken by a task that arrives meanwhile; settle() (the waiter's task resuming) ends that.
    sem = MeteredSemaphore(2)
    assert sem.try_acquire()
    assert sem.try_acquire()
    first, second = sem.enqueue(), sem.enqueue()
    sem.release()
    assert first.result() == "admitted"
    sem.release()  # `second` gets the other slot: both handed, none resumed
    assert second.result() == "admitted"
    sem.settle(first)
    assert sem.locked()  # full: both slots are the waiters'
    sem.release()  # `first` is done with its slot, `second` has not resumed yet
    assert not sem.try_acquire()  # held back for the hand-over still under way
    sem.settle(second)
    assert sem.try_acquire()  # nothing is held back once every waiter resumed


async def test_settle_is_a_no_op_for_a_wait_that_was_not_handed_a_slot() -> None:
    sem = MeteredSemaphore(1, timeout=0.01)
    assert sem.try_acquire()
    waiter = sem.enqueue()
    assert await waiter == "timeout"
    sem.settle(waiter)
    sem.settle(waiter)
    sem.release()
    assert sem.try_acquire()
