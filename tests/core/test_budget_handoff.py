"""A limit with a rate budget whose queue is plain FIFO (every waiter an `async with`: weight 1
of the default flow, an estimate of 1) hands freed slots to the oldest waiter through the
budget's allowance (`take_one`), without a reservation; where the allowance cannot, through
the budget itself (`_admit_fairly`). A waiter refused on the way (its deadline passed while
the loop ran late), a queue of cancelled waiters, or a waiter whose task is cancelled before
it resumes gives back what the allowance let go, while that allowance is open."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits import DeadlineExceededError
from gym_concurrency.limits.rate_budget import BudgetStatistics, RateBudget
from tests.core.clock import ManualClockLoop, spin, started_at

T = TypeVar("T")


@pytest.fixture
def loop() -> Iterator[ManualClockLoop]:
    yield from started_at(1000.25)  # early in a second: the guard fires 0.73 s from now


def run(loop: ManualClockLoop, coro: Coroutine[Any, Any, T]) -> T:
    return loop.run_until_complete(coro)


def requests(budget: RateBudget) -> BudgetStatistics:
    statistics = budget.statistics().requests
    assert statistics is not None
    return statistics


def test_freed_slots_go_to_the_oldest_through_the_allowance(loop: ManualClockLoop) -> None:
    budget = RateBudget(tokens_per_minute=6000, requests_per_minute=600, clock=loop.time)
    sem = MeteredSemaphore(1, budget=budget)
    order: list[int] = []
    release = asyncio.Event()

    async def call(i: int) -> None:
        async with sem:
            order.append(i)
            await release.wait()

    async def main() -> None:
        tasks = [asyncio.ensure_future(call(i)) for i in range(4)]
        await asyncio.sleep(0)  # the first charges the budget (which opens its allowance)
        assert (order, sem.queue_depth) == ([0], 3)
        ones = budget.allowance.ones
        release.set()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3]  # FIFO
        assert budget.allowance.ones == ones + 3  # each hand-off a take_one: no reservation
        assert requests(budget).reserved == 0

    run(loop, main())
    loop.now += 0.75  # the guard charges the allowance into its second
    spin(loop)
    assert not budget.allowance.is_open
    assert requests(budget).remaining == 596


def test_a_waiter_late_for_its_deadline_gives_back_what_the_allowance_let_go(
    loop: ManualClockLoop,
) -> None:
    budget = RateBudget(tokens_per_minute=6000, requests_per_minute=600, clock=loop.time)
    sem = MeteredSemaphore(1, budget=budget)

    async def main() -> None:
        await sem.acquire()  # charged through the budget: its allowance opens
        late = asyncio.ensure_future(sem.acquire(deadline=0.05))
        behind = asyncio.ensure_future(sem.acquire())
        await asyncio.sleep(0)
        ones = budget.allowance.ones
        time.sleep(0.06)  # noqa: ASYNC251 - the loop busy past the deadline, its timer not run
        sem.release()  # the oldest is refused on the way; the one behind it admitted
        assert budget.allowance.ones == ones + 1  # one taken for it, none for the late one
        with pytest.raises(DeadlineExceededError):
            await late
        await behind
        assert (sem.active, sem.admission_timeouts) == (1, 1)
        sem.release()

    run(loop, main())


def test_a_queue_of_cancelled_waiters_takes_nothing(loop: ManualClockLoop) -> None:
    budget = RateBudget(tokens_per_minute=6000, requests_per_minute=600, clock=loop.time)
    sem = MeteredSemaphore(1, budget=budget)

    async def main() -> None:
        async with sem:  # the budget's allowance opens
            waiters = [sem.enqueue(in_full=True) for _ in range(2)]
            for waiter in waiters:
                waiter.cancel()  # cancelled with their tasks, which have not left yet
            ones = budget.allowance.ones
        # The exit handed nothing: the allowance took one for the oldest, and got it back.
        assert budget.allowance.ones == ones
        assert (sem.active, sem.queue_depth) == (0, 0)
        for waiter in waiters:
            sem.leave(waiter)
        assert sem.admission_cancelled == 2
        sem.resize(2)  # nobody waits: nothing is taken
        # Of the second's share (10), the first call went through the budget, and the one
        # taken for the cancelled waiters is not taken again: 9 are left to take_one.
        assert sum(budget.allowance.take_one() for _ in range(20)) == 9

    run(loop, main())


def test_the_oldest_the_budget_holds_back_goes_through_the_budget_the_next_its_allowance(
    loop: ManualClockLoop,
) -> None:
    # Two limits share a budget of 5 requests a minute: `b` spends what `a` leaves.
    budget = RateBudget(requests_per_minute=5, clock=loop.time)
    a, b = MeteredSemaphore(2, budget=budget), MeteredSemaphore(1, budget=budget)

    def spend_on_b(calls: int) -> None:
        for _ in range(calls):
            assert b.try_acquire()
            b.release()

    async def main() -> None:
        assert a.try_acquire()
        spend_on_b(4)  # the minute's 5 requests are spent
        held_back = a.enqueue(in_full=True)  # a slot is free for it; the budget holds it back
        assert not held_back.done()
        loop.now += 61.0  # the window moved on (the limit's timer has not run yet)
        spend_on_b(1)  # the budget's allowance opens
        a.release()  # the one held back is admitted through the budget: a reservation
        assert held_back.result() == "admitted"
        reservation = a.settle(held_back)
        assert reservation is not None
        reservation.charge_in_full()
        assert a.try_acquire()  # the third request of this minute (a `take`: it ends take_one)
        third = a.enqueue(in_full=True)
        loop.now += 1.0
        await asyncio.sleep(0)  # the allowance's guard charges and closes it
        spend_on_b(1)  # the fourth: the next second's allowance opens
        a.release()  # nothing held back: the allowance hands it the slot, no reservation
        assert third.result() == "admitted"
        assert a.settle(third) is None
        assert requests(budget).remaining == 0
        fourth = a.enqueue(in_full=True)
        a.release()  # the allowance has nothing left, and the budget holds it back
        assert (fourth.done(), a.active, a.queue_depth) == (False, 1, 1)
        loop.now += 61.0
        await asyncio.sleep(0)  # the budget's timer admits it
        await asyncio.sleep(0)
        assert fourth.result() == "admitted"
        last = a.settle(fourth)
        assert last is not None
        last.charge_in_full()

    run(loop, main())


def test_a_waiter_that_settles_gets_its_reservation_in_a_queue_of_async_with(
    loop: ManualClockLoop,
) -> None:
    budget = RateBudget(tokens_per_minute=6000, requests_per_minute=600, clock=loop.time)
    sem = MeteredSemaphore(1, budget=budget)
    release = asyncio.Event()

    async def plain() -> None:
        async with sem:
            await release.wait()

    async def settled() -> int | None:
        async with sem.hold() as held:  # an estimate of 1, settled from what the call used
            estimate = None if held.reservation is None else held.reservation.estimate("tokens")
            held.settle(500)  # an overrun: charged
            return estimate

    async def main() -> int | None:
        holder = asyncio.ensure_future(plain())
        await asyncio.sleep(0)
        waiters = [asyncio.ensure_future(plain()), asyncio.ensure_future(settled())]
        await asyncio.sleep(0)
        release.set()
        await holder
        estimate = await waiters[1]
        await waiters[0]
        return estimate

    assert run(loop, main()) == 1  # a reservation of 1 token, settled
    loop.now += 0.75
    spin(loop)
    tokens = budget.statistics().tokens
    assert tokens is not None
    assert tokens.remaining == 6000 - 1 - 1 - 500  # the two plain calls and the settled one
    assert tokens.reserved == 0  # the plain one handed a reservation charged it in full


def cancelled_as_handed(
    loop: ManualClockLoop, budget: RateBudget, between: Callable[[], object]
) -> None:
    """On one slot: `first` and `second` queue behind a holder; the holder's release hands the
    slot to `first` through the allowance, `between()` runs, and `first`'s task is cancelled
    before it resumes. The slot passes on to `second`."""
    sem = MeteredSemaphore(1, budget=budget)
    admitted: list[int] = []

    async def call(i: int) -> None:
        async with sem:
            admitted.append(i)
            await asyncio.sleep(0)

    async def main() -> None:
        await sem.acquire()
        first, second = (asyncio.ensure_future(call(i)) for i in (1, 2))
        await asyncio.sleep(0)
        ones = budget.allowance.ones
        sem.release()  # handed to `first`, whose task is cancelled before it resumes
        assert budget.allowance.ones == ones + 1
        between()
        first.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
        assert first.cancelled()
        assert admitted == [2]
        assert (sem.active, sem.admission_cancelled) == (0, 1)

    run(loop, main())
    loop.now += 0.75
    spin(loop)


def test_a_waiter_cancelled_as_the_allowance_hands_it_a_slot_gives_its_call_back(
    loop: ManualClockLoop,
) -> None:
    budget = RateBudget(tokens_per_minute=6000, requests_per_minute=600, clock=loop.time)
    cancelled_as_handed(loop, budget, lambda: None)
    # Charged: the holder and `second`; `first`'s call, never sent, went back to the allowance.
    assert requests(budget).remaining == 598
    tokens = budget.statistics().tokens
    assert tokens is not None
    assert tokens.remaining == 6000 - 2


def test_a_call_handed_out_is_not_given_back_once_its_allowance_is_charged(
    loop: ManualClockLoop,
) -> None:
    """Closed between the hand-off and the cancellation (a resize charges the allowance) and
    opened again (a charge), one taken from the new one: `first`'s call stays charged, and
    what the new allowance let go stays counted: never less."""
    budget = RateBudget(tokens_per_minute=6000, requests_per_minute=600, clock=loop.time)
    generation = budget.allowance.generation

    def close_and_take_from_the_next() -> None:
        budget.resize("requests", 600)
        assert budget.take(1) == 0.0
        assert budget.allowance.take_one()

    cancelled_as_handed(loop, budget, close_and_take_from_the_next)
    assert budget.allowance.generation > generation
    # The holder, `first`, the two calls taken in between and `second`.
    assert requests(budget).remaining == 595


def test_a_call_handed_out_goes_back_after_a_take_counted_it_as_its_own(
    loop: ManualClockLoop,
) -> None:
    """A `take` of another size between the hand-off and the cancellation counts what
    `take_one` let go as its own (the allowance still open): `first`'s call goes back from
    there."""
    budget = RateBudget(tokens_per_minute=6000, requests_per_minute=600, clock=loop.time)
    generation = budget.allowance.generation

    def take_five() -> None:
        assert budget.take(5) == 0.0
        assert budget.allowance.ones == 0  # counted as `take`'s

    cancelled_as_handed(loop, budget, take_five)
    assert budget.allowance.generation > generation  # (charged when the second ended)
    assert requests(budget).remaining == 600 - 3  # the holder, the take and `second`
    tokens = budget.statistics().tokens
    assert tokens is not None
    assert tokens.remaining == 6000 - 1 - 5 - 1
