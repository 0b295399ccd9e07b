"""A sliding RateBudget's allowance for the rest of the second (budget_allowance.py), on a
clock the test moves: calls charged in full take from it once a charge has opened it, it is
charged into the window and closed before the budget reads its meters again (a resize, a
provider's report, a wait it does not hold itself), a settlement inside its second keeps it and
an overrun shrinks it, statistics count what it took, and a token bucket never opens one."""

from __future__ import annotations

import asyncio

import pytest

from gym_concurrency.limits.budget_allowance import GUARD_MARGIN
from gym_concurrency.limits.rate_budget import RateBudget, Reservation
from tests.core.clock import ManualClockLoop


class Clock:
    def __init__(self, now: float = 1000.2) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def remaining(budget: RateBudget) -> int:
    tokens = budget.statistics().tokens
    assert tokens is not None
    return tokens.remaining


def test_a_charge_opens_it_and_the_calls_after_take_from_it() -> None:
    clock = Clock()
    budget = RateBudget(tokens_per_minute=100, requests_per_minute=4, clock=clock)
    assert not budget.allowance.is_open
    assert budget.take(10) == 0.0  # through the window: it opens with what is left
    assert budget.allowance.is_open
    assert budget.take(20) == 0.0
    assert budget.take(30) == 0.0
    assert (budget.allowance.taken_tokens, budget.allowance.taken_requests) == (50, 2)
    assert remaining(budget) == 40  # counted before it reaches the window
    requests = budget.statistics().requests
    assert requests is not None
    assert requests.remaining == 1
    assert budget.take(50) > 0.0  # more than is left: the budget says when
    assert not budget.allowance.is_open  # it was charged into the window and closed
    assert remaining(budget) == 40


def test_it_ends_with_its_second() -> None:
    clock = Clock(1000.2)
    budget = RateBudget(tokens_per_minute=100, clock=clock)
    assert budget.take(10) == 0.0
    clock.now = 1000.999
    assert budget.allowance.take(5)
    clock.now = 1001.0  # the next second: the window must be asked
    assert not budget.allowance.take(5)
    assert budget.take(5) == 0.0
    assert remaining(budget) == 80


def test_a_resize_or_a_report_closes_it() -> None:
    clock = Clock()
    budget = RateBudget(tokens_per_minute=100, clock=clock)
    assert budget.take(10) == 0.0
    budget.resize("tokens", 30)
    assert not budget.allowance.take(5)
    assert budget.take(25) > 0.0  # 10 of 30 spent: 25 does not fit the new size
    assert budget.take(20) == 0.0
    budget.report("tokens", remaining=0, reset_at=clock.now + 30.0)
    assert not budget.allowance.is_open
    assert budget.take(0) == 0.0  # (nothing asked: always)
    assert not budget.allowance.is_open  # a provider's word is in force: none opens
    assert budget.take(1) > 0.0


def test_a_settlement_in_its_second_keeps_it_and_an_overrun_shrinks_it() -> None:
    clock = Clock()
    budget = RateBudget(tokens_per_minute=100, clock=clock)
    first = budget.reserve(10)
    assert isinstance(first, Reservation)
    second = budget.reserve(40)  # from the allowance
    assert isinstance(second, Reservation)
    assert budget.allowance.taken_tokens == 40
    budget.settle(second, 10)  # 30 back
    assert budget.allowance.is_open
    assert remaining(budget) == 80
    budget.settle(first, 30)  # 20 over its estimate: taken off the allowance too
    assert budget.allowance.is_open
    assert remaining(budget) == 60
    assert not budget.allowance.take(31)  # it allowed 90: 40 taken, 20 overrun, 30 left
    assert budget.take(60) == 0.0  # the window has the refund: it holds 60


def test_it_never_takes_a_negative_amount() -> None:
    budget = RateBudget(tokens_per_minute=100, clock=Clock())
    assert budget.take(50) == 0.0
    assert not budget.allowance.take(-1000)
    with pytest.raises(ValueError, match="int >= 0"):
        budget.take(-1000)
    assert budget.take(51) > 0.0


def test_what_it_took_leaves_the_statistics_with_the_window() -> None:
    clock = Clock()
    budget = RateBudget(tokens_per_minute=100, clock=clock)
    assert budget.take(10) == 0.0
    assert budget.allowance.take(30)
    clock.now += 59.0
    assert remaining(budget) == 60
    clock.now += 2.0  # 61 s: its second has left the window (nothing read the meters)
    assert remaining(budget) == 100


def test_a_bucket_never_opens_one() -> None:
    budget = RateBudget(tokens_per_minute=100, shape="bucket", clock=Clock())
    assert budget.take(10) == 0.0
    assert not budget.allowance.is_open
    assert not budget.allowance.take(1)


# --- take_one: the uncontended `async with`, guarded by a timer instead of the clock ---------


def spin(loop: ManualClockLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0))


def test_take_one_takes_only_while_a_guard_is_armed_on_a_running_loop() -> None:
    clock = Clock()
    budget = RateBudget(tokens_per_minute=6000, clock=clock)  # a second's share: 100
    assert budget.take(10) == 0.0  # opened outside any loop: no guard
    assert not budget.allowance.take_one()
    assert budget.allowance.take(1)  # (the clock-checked way still takes)
    clock.now += 1.0  # the next second: the budget is asked again
    loop = ManualClockLoop()

    async def ones(count: int) -> list[bool]:
        assert budget.take(1) == 0.0  # a charge on a running loop: opened again, guarded
        return [budget.allowance.take_one() for _ in range(count)]

    try:
        assert loop.run_until_complete(ones(3)) == [True, True, True]
        assert budget.allowance.ones == 3
        assert remaining(budget) == 6000 - 11 - 1 - 3  # counted before they reach the window
    finally:
        loop.close()


def test_take_one_stops_where_the_room_does() -> None:
    loop = ManualClockLoop()
    loop.now = 1000.2
    budget = RateBudget(tokens_per_minute=6000, clock=loop.time)
    assert budget.take(5900) == 0.0  # (outside the loop)
    loop.now = 1001.2

    async def ones() -> list[bool]:
        assert budget.take(96) == 0.0  # through the window: opened with 4 left, guarded
        return [budget.allowance.take_one() for _ in range(6)]

    try:
        assert loop.run_until_complete(ones()) == [True] * 4 + [False] * 2
        assert remaining(budget) == 0
        assert budget.take(1) > 0.0  # the budget agrees: charged into the window first
        assert budget.allowance.ones == 0
        assert remaining(budget) == 0
    finally:
        loop.close()


def test_a_take_or_an_overrun_ends_take_one_for_the_rest_of_the_second() -> None:
    loop = ManualClockLoop()
    loop.now = 1000.2
    budget = RateBudget(tokens_per_minute=6000, clock=loop.time)

    async def run() -> None:
        first = budget.reserve(10)
        assert isinstance(first, Reservation)
        assert budget.allowance.take_one()
        assert budget.take(5980) == 0.0  # through the allowance, which `take_one` held room in
        assert not budget.allowance.take_one()  # the rest of the second is `take`'s
        assert budget.allowance.take(9)
        assert not budget.allowance.take(1)  # 10 + 1 + 5980 + 9: all of it

    try:
        loop.run_until_complete(run())
        assert remaining(budget) == 0
    finally:
        loop.close()


def test_an_overrun_in_its_second_ends_take_one_too() -> None:
    loop = ManualClockLoop()
    loop.now = 1000.2
    budget = RateBudget(tokens_per_minute=6000, clock=loop.time)  # a second's share: 100

    async def run() -> None:
        first = budget.reserve(10)
        assert isinstance(first, Reservation)
        assert budget.allowance.take_one()
        budget.settle(first, 5985)  # 5975 over its estimate, in the allowance's second
        assert budget.allowance.is_open
        assert not budget.allowance.take_one()  # 10 + 1 + 5975 leave 14: `take` knows
        assert budget.allowance.take(14)
        assert not budget.allowance.take(1)

    try:
        loop.run_until_complete(run())
        assert remaining(budget) == 0
    finally:
        loop.close()


def test_the_guard_charges_the_ones_into_their_second_before_it_ends() -> None:
    loop = ManualClockLoop()
    loop.now = 1000.2
    budget = RateBudget(tokens_per_minute=6000, clock=loop.time)

    async def ones() -> None:
        assert budget.take(10) == 0.0
        assert all([budget.allowance.take_one() for _ in range(5)])

    try:
        loop.run_until_complete(ones())
        loop.now = 1001.0 - GUARD_MARGIN  # the guard is due: the loop runs on time
        spin(loop)
        assert not budget.allowance.is_open  # charged and closed within its second
        assert remaining(budget) == 5985
        loop.now = 1060.999  # the second before 1061: 1000's charges still counted
        assert remaining(budget) == 5985
        loop.now = 1061.0  # ... and gone: the ones were charged into second 1000
        assert remaining(budget) == 6000
    finally:
        loop.close()


def test_a_guard_that_fires_late_charges_the_ones_into_its_own_second() -> None:
    loop = ManualClockLoop()
    loop.now = 1000.2
    budget = RateBudget(tokens_per_minute=6000, clock=loop.time)

    async def ones() -> None:
        assert budget.take(10) == 0.0
        assert all([budget.allowance.take_one() for _ in range(5)])

    try:
        loop.run_until_complete(ones())
        loop.now = 1003.5  # the loop ran late: ones may have been taken after 1001
        assert budget.allowance.late_ones(loop.now) == 5
        spin(loop)
        assert not budget.allowance.is_open
        loop.now = 1061.0  # `take(10)` was charged into 1000 and has left; the ones have not
        assert remaining(budget) == 5995
        loop.now = 1064.0  # charged into 1003, later than taken: counted longer, never less
        assert remaining(budget) == 6000
    finally:
        loop.close()


@pytest.mark.parametrize("read", ["resize", "wait_for"])
def test_a_budget_read_after_its_second_charges_the_ones_late_too(read: str) -> None:
    loop = ManualClockLoop()
    loop.now = 1000.2
    budget = RateBudget(tokens_per_minute=6000, clock=loop.time)

    async def ones() -> None:
        assert budget.take(10) == 0.0
        assert all([budget.allowance.take_one() for _ in range(5)])

    try:
        loop.run_until_complete(ones())
        loop.now = 1002.5  # before the guard runs, the budget is asked
        if read == "resize":
            budget.resize("tokens", 6000)
        else:  # the allowance's second has ended: it holds nothing, the window answers
            assert budget.wait_for(1) == 0.0
        assert not budget.allowance.is_open
        loop.now = 1061.0
        assert remaining(budget) == 5995
        loop.now = 1063.0
        assert remaining(budget) == 6000
    finally:
        loop.close()


def test_a_guard_that_never_fires_lets_take_one_take_a_seconds_share_at_most() -> None:
    # asyncio.run() per call: the first loop's guard never fires once that loop is closed.
    # What `take_one` takes meanwhile is charged late, so it is bounded: a 60th of the minute.
    clock = Clock(1000.2)
    budget = RateBudget(tokens_per_minute=600, clock=clock)  # a second's share: 10

    async def ones(count: int) -> list[bool]:
        taken = [budget.allowance.take_one() for _ in range(count)]
        if not taken[-1]:
            assert budget.take(1) == 0.0  # charges what was taken, opens on this loop
            taken.append(budget.allowance.take_one())
        return taken

    assert asyncio.run(ones(1)) == [False, True]  # opened by `take(1)`, on the first loop
    assert asyncio.run(ones(2)) == [True, True]  # that loop is closed: its guard never fires
    clock.now = 1030.5
    assert asyncio.run(ones(10)) == [True] * 7 + [False] * 3 + [True]  # 10 in all, charged
    assert budget.allowance.ones == 1  # opened again, guarded on this loop
    clock.now = 1061.0  # 1000's charge has left; the 10 ones were charged late, into 1030
    assert remaining(budget) == 600 - 10 - 1 - 1
    clock.now = 1091.0
    assert remaining(budget) == 600 - 1  # the one still open is counted until charged


def test_asking_how_long_keeps_it_open_while_it_holds_the_call() -> None:
    loop = ManualClockLoop()
    loop.now = 1000.2
    budget = RateBudget(tokens_per_minute=6000, requests_per_minute=3, clock=loop.time)

    async def asked() -> list[float]:
        assert budget.take(10) == 0.0  # opened: 2 requests left, 1 of them to take_one
        assert budget.allowance.take_one()
        waits = [budget.wait_for(5900)]  # 1 request left, and 5,989 tokens: it holds it
        assert budget.allowance.is_open
        assert budget.allowance.take_one() is False  # (its second's share is taken)
        waits.append(budget.wait_for(5990))  # more tokens than it holds: the window says
        return waits

    try:
        waits = loop.run_until_complete(asked())
        assert waits[0] == 0.0
        assert waits[1] > 0.0
        assert not budget.allowance.is_open  # the second answer charged it and closed it
        requests = budget.statistics().requests
        assert requests is not None
        assert requests.remaining == 1
        assert remaining(budget) == 5989
    finally:
        loop.close()
