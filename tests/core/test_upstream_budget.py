"""A MeteredSemaphore with a rate budget (`budget=`), on an event loop whose clock the test
moves (the budget reads the same clock): one admission takes slots and budget together; a
waiter the budget cannot hold yet keeps the slots held for it and is admitted by the limit's
timer when it can; refusals "budget" at once (with an honest retry_after) and at a timeout;
cancellation, leave() and hold() give back or settle the reservation."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits import Held, QueueFullError, UpstreamCapacityError
from gym_concurrency.limits.rate_budget import BudgetStatistics, RateBudget, Reservation
from gym_concurrency.usage import Usage
from tests.core.clock import ManualClockLoop, spin, started_at

T = TypeVar("T")


@pytest.fixture
def loop() -> Iterator[ManualClockLoop]:
    yield from started_at(1000.0)


def run(loop: ManualClockLoop, coro: Coroutine[Any, Any, T]) -> T:
    return loop.run_until_complete(coro)


def advance(loop: ManualClockLoop, seconds: float) -> None:
    loop.now += seconds
    spin(loop)


def tokens(budget: RateBudget) -> BudgetStatistics:
    statistics = budget.statistics().tokens
    assert statistics is not None
    return statistics


def start(loop: ManualClockLoop, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    task = loop.create_task(coro)
    spin(loop)
    return task


async def holding(sem: MeteredSemaphore, release: asyncio.Event, **ask: Any) -> None:
    """acquire(**ask) (charged in full), hold until `release` is set."""
    await sem.acquire(**ask)
    try:
        await release.wait()
    finally:
        sem.release(ask.get("weight", 1), ask.get("flow"))


def test_uncontended_admissions_take_the_budget_at_once(loop: ManualClockLoop) -> None:
    budget = RateBudget(tokens_per_minute=1000, clock=loop.time)
    sem = MeteredSemaphore(2, budget=budget)
    assert (sem.budget, sem.engine) == (budget, None)

    async def main() -> Reservation | None:
        async with sem:  # the weight (1) is the estimate, charged in full
            pass
        assert sem.try_acquire(tokens=100)
        sem.release()
        waiter = sem.enqueue(tokens=300)  # admitted at once: a done future
        assert waiter.done()
        assert waiter.result() == "admitted"
        reservation = sem.settle(waiter)
        sem.release()
        await sem.acquire(2, tokens=50)
        sem.release(2)
        return reservation

    reservation = run(loop, main())
    assert isinstance(reservation, Reservation)
    assert reservation.estimate("tokens") == 300
    assert (tokens(budget).remaining, tokens(budget).reserved) == (549, 300)
    budget.settle(reservation, 120)  # 180 of 300 back
    assert (tokens(budget).remaining, tokens(budget).reserved) == (729, 0)
    assert sem.active == 0
    assert sem.queue_depth == 0


def test_async_with_takes_the_budgets_allowance_and_stops_where_the_budget_does(
    loop: ManualClockLoop,
) -> None:
    budget = RateBudget(tokens_per_minute=1000, requests_per_minute=5, clock=loop.time)
    sem = MeteredSemaphore(1, budget=budget, timeout=120.0)

    async def one() -> None:
        async with sem:
            pass

    for _ in range(5):  # the first through the budget, which opens its allowance for the rest
        run(loop, one())
    # One through `take_one` (a second's share of 5 a minute is 1), guarded; the rest read
    # the clock (`take`, which counts that one as its own).
    assert (budget.allowance.ones, budget.allowance.taken_requests) == (0, 4)
    advance(loop, 0.99)  # the guard fires before its second ends: charged into that second
    assert not budget.allowance.is_open
    statistics = budget.statistics()
    assert statistics.requests is not None
    assert (statistics.requests.remaining, tokens(budget).remaining) == (0, 995)
    sixth = start(loop, one())
    assert not sixth.done()  # the minute's 5 requests are spent: it waits for the window
    assert sem.queue_depth == 1
    advance(loop, 59.0)
    assert not sixth.done()
    advance(loop, 2.0)  # the second of the first five has left the window
    assert sixth.done()
    assert sem.active == 0
    statistics = budget.statistics()
    assert statistics.requests is not None
    assert statistics.requests.remaining == 4


def test_a_waiter_waits_for_the_budget_with_its_slots_held_then_its_timer_admits_it(
    loop: ManualClockLoop,
) -> None:
    budget = RateBudget(tokens_per_minute=100, clock=loop.time)
    sem = MeteredSemaphore(4, budget=budget)
    assert sem.try_acquire(tokens=90)
    sem.release()  # every slot free, 10 tokens left of the minute
    first = start(loop, sem.acquire(tokens=60))
    second = start(loop, sem.acquire(tokens=10))  # fits the budget, but may not pass
    assert (sem.queue_depth, sem.active, sem.locked()) == (2, 0, True)
    assert not sem.try_acquire(tokens=1)  # never ahead of a waiter
    advance(loop, 59.0)
    assert not first.done()
    assert not second.done()
    advance(loop, 2.0)  # the charge of 90 left the window: no release, the limit's timer
    assert first.done()
    assert second.done()
    assert (sem.active, sem.queue_depth, tokens(budget).remaining) == (2, 0, 30)


def test_refused_at_once_when_the_budget_holds_it_only_after_the_timeout(
    loop: ManualClockLoop,
) -> None:
    budget = RateBudget(tokens_per_minute=100, clock=loop.time)
    sem = MeteredSemaphore(4, budget=budget, timeout=5.0)
    assert sem.try_acquire(tokens=100)
    advance(loop, 10.25)
    with pytest.raises(UpstreamCapacityError) as refused:
        run(loop, sem.acquire(tokens=50))
    assert refused.value.reason == "budget"
    assert isinstance(refused.value, TimeoutError)
    retry_after = refused.value.retry_after
    assert retry_after == pytest.approx(50.75)  # the charge at 1000.0 leaves at 1061.0
    assert (sem.admission_budget, sem.admission_timeouts, sem.queue_depth) == (1, 1, 0)
    # Honest: just before it the budget does not hold 50, at it it does.
    advance(loop, retry_after - 0.01)
    assert budget.wait_for(50) > 0
    advance(loop, 0.01)
    assert budget.wait_for(50) == 0.0
    # A deadline of its own bounds the wait the same way.
    assert sem.try_acquire(tokens=100)
    with pytest.raises(UpstreamCapacityError):
        run(loop, sem.acquire(tokens=1, deadline=3.0))
    assert sem.statistics().admission_budget == 2


def test_a_timeout_while_the_budget_holds_the_head_back_ends_budget_not_timeout(
    loop: ManualClockLoop,
) -> None:
    budget = RateBudget(tokens_per_minute=100, clock=loop.time)
    sem = MeteredSemaphore(2, budget=budget, timeout=70.0)
    assert sem.try_acquire(tokens=100)
    sem.release()
    first = start(loop, sem.acquire(tokens=100))  # fits at +61 s: within its timeout
    second = start(loop, sem.acquire(tokens=100))  # so would it, were it alone: it waits
    advance(loop, 61.0)
    assert first.done()
    assert first.exception() is None
    advance(loop, 9.5)  # its timeout passes; slots free, the budget holds it back
    error = second.exception()
    assert isinstance(error, UpstreamCapacityError)
    assert error.reason == "budget"
    assert error.retry_after == pytest.approx(61.0 - 9.5)
    assert (sem.admission_budget, sem.admission_timeouts) == (1, 1)


def test_a_timeout_while_slots_hold_it_back_stays_a_timeout(loop: ManualClockLoop) -> None:
    sem = MeteredSemaphore(1, budget=RateBudget(tokens_per_minute=100, clock=loop.time), timeout=1)
    release = asyncio.Event()
    start(loop, holding(sem, release))
    waiter = start(loop, sem.acquire())
    advance(loop, 1.5)
    error = waiter.exception()
    assert type(error) is TimeoutError
    assert (sem.admission_budget, sem.admission_timeouts) == (0, 1)


def test_cancelling_the_waiter_the_budget_holds_back_moves_the_slots_on(
    loop: ManualClockLoop,
) -> None:
    budget = RateBudget(tokens_per_minute=100, clock=loop.time)
    sem = MeteredSemaphore(4, budget=budget)
    assert sem.try_acquire(tokens=90)
    blocked = start(loop, sem.acquire(tokens=50))
    behind = start(loop, sem.acquire(tokens=10))
    assert not behind.done()
    blocked.cancel()
    spin(loop)
    assert behind.done()
    assert behind.exception() is None
    assert sem.admission_cancelled == 1
    assert (tokens(budget).remaining, tokens(budget).reserved) == (0, 0)  # 90 + 10: none for it
    advance(loop, 120.0)  # nothing armed for the cancelled one takes anything later
    assert (sem.active, sem.queue_depth, tokens(budget).remaining) == (2, 0, 100)


def test_leave_after_admission_cancels_the_reservation(loop: ManualClockLoop) -> None:
    budget = RateBudget(tokens_per_minute=100, requests_per_minute=10, clock=loop.time)
    sem = MeteredSemaphore(1, budget=budget)

    async def main() -> None:
        waiter = sem.enqueue(tokens=40)
        assert waiter.result() == "admitted"
        sem.leave(waiter)  # the call is never sent
        assert sem.active == 0
        assert sem.admission_cancelled == 1
        # A slot and reservation handed over at the moment its task is cancelled come back.
        assert sem.try_acquire(tokens=10)
        handed = sem.enqueue(tokens=30)
        sem.release()  # hands the slot, and 30 tokens, to the waiter
        assert handed.result() == "admitted"
        sem.leave(handed)
        assert sem.active == 0

    run(loop, main())
    requests = budget.statistics().requests
    assert requests is not None
    assert requests.remaining == 9
    assert (tokens(budget).remaining, tokens(budget).reserved) == (90, 0)
    assert tokens(budget).refunded_total == 70


def test_hold_settles_or_charges_in_full_or_cancels(loop: ManualClockLoop) -> None:
    budget = RateBudget(tokens_per_minute=1000, clock=loop.time)
    sem = MeteredSemaphore(1, budget=budget)

    async def main() -> None:
        async with sem.hold(tokens=100) as held:
            assert isinstance(held, Held)
            assert held.reservation is not None
            held.settle(Usage(input_tokens=10, output_tokens=20))
        assert tokens(budget).remaining == 970
        async with sem.hold(tokens=100):  # left open: the call may have cost all of it
            pass
        assert tokens(budget).remaining == 870
        with pytest.raises(RuntimeError):
            async with sem.hold(tokens=100):
                raise RuntimeError("the call failed")
        assert tokens(budget).remaining == 770
        async with sem.hold(tokens=100) as held:
            held.cancel()  # never sent
        assert tokens(budget).remaining == 770
        async with MeteredSemaphore(1).hold(tokens=5) as plain:  # no budget: nothing to close
            assert plain.reservation is None
            plain.settle(3)

    run(loop, main())
    assert (sem.active, tokens(budget).reserved) == (0, 0)


def test_estimates_are_checked_and_capped_at_the_minute(loop: ManualClockLoop) -> None:
    budget = RateBudget(tokens_per_minute=1000, clock=loop.time)
    sem = MeteredSemaphore(2, budget=budget)
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        sem.try_acquire(tokens=-1)
    with pytest.raises(TypeError, match="tokens must be an int"):
        sem.try_acquire(tokens="5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        MeteredSemaphore(1).try_acquire(tokens=-1)  # checked without a budget too
    assert sem.try_acquire(tokens=5000)  # could never fit: capped at 1000, counted
    assert (sem.admission_capped, tokens(budget).remaining) == (1, 0)


def test_plain_fifo_waiters_respect_the_budget_too(loop: ManualClockLoop) -> None:
    budget = RateBudget(requests_per_minute=2, clock=loop.time)
    sem = MeteredSemaphore(10, budget=budget)
    order: list[int] = []

    async def call(i: int) -> None:
        async with sem:
            order.append(i)

    tasks = [start(loop, call(i)) for i in range(5)]
    assert order == [0, 1]
    advance(loop, 61.0)
    assert order == [0, 1, 2, 3]
    advance(loop, 61.0)
    assert order == [0, 1, 2, 3, 4]
    assert all(t.done() for t in tasks)


def test_a_full_queue_sheds_while_the_budget_holds_its_oldest_back(loop: ManualClockLoop) -> None:
    budget = RateBudget(requests_per_minute=1, clock=loop.time)
    sem = MeteredSemaphore(4, budget=budget, max_queue=1)

    async def one() -> None:
        async with sem:
            pass

    run(loop, one())
    second = start(loop, one())  # slots are free, the minute's request is spent: it waits
    assert (sem.active, sem.queue_depth) == (0, 1)
    with pytest.raises(QueueFullError):
        run(loop, one())
    assert (sem.queue_depth, sem.admission_shed) == (1, 1)
    advance(loop, 61.0)
    assert second.done()
    assert second.exception() is None


def test_a_resized_budget_holds_what_it_says_from_then_on(loop: ManualClockLoop) -> None:
    budget = RateBudget(tokens_per_minute=100, clock=loop.time)
    sem = MeteredSemaphore(4, budget=budget)
    assert sem.try_acquire(tokens=100)
    waiter = start(loop, sem.acquire(tokens=100))
    budget.resize("tokens", 300)
    sem.release()  # any admission step sees the new size
    spin(loop)
    assert waiter.done()
    assert tokens(budget).limit == 300
    budget.resize("tokens", 50)  # a queued estimate over the new minute is capped at it
    capped = start(loop, sem.acquire(tokens=80))
    advance(loop, 61.0)
    assert capped.done()
    assert tokens(budget).remaining == 0
    with pytest.raises(ValueError, match="no requests budget"):
        budget.resize("requests", 10)
    with pytest.raises(ValueError, match="int >= 1"):
        budget.resize("tokens", 0)


def test_a_dropped_limit_with_a_budget_is_collected(loop: ManualClockLoop) -> None:
    budget = RateBudget(tokens_per_minute=100, clock=loop.time)
    sem = MeteredSemaphore(1, budget=budget)
    assert sem.try_acquire(tokens=100)
    sem.release()

    run(loop, queue_and_leave(sem))
    ref = weakref.ref(sem)
    del sem
    gc.collect()
    assert ref() is None
    advance(loop, 61.0)  # the timer finds nothing to wake


async def queue_and_leave(sem: MeteredSemaphore) -> None:
    waiter = sem.enqueue(tokens=50)  # arms the budget's timer
    sem.leave(waiter)


def test_the_upstream_needs_a_budget_or_an_engine() -> None:
    from gym_concurrency.limits.upstream import Upstream

    with pytest.raises(ValueError, match="a budget, an engine or both"):
        Upstream()
    with pytest.raises(TypeError, match="budget must be a RateBudget"):
        MeteredSemaphore(1, budget=100)  # type: ignore[arg-type]
