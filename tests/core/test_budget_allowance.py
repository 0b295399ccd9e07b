"""A sliding RateBudget's allowance for the rest of the second (budget_allowance.py), on a
clock the test moves: calls charged in full take from it once a charge has opened it, it is
charged into the window and closed before the budget reads its meters again (a resize, a
provider's report, a wait), a settlement inside its second keeps it and an overrun shrinks
it, statistics count what it took, and a token bucket never opens one."""

from __future__ import annotations

import pytest

from gym_concurrency.limits.rate_budget import RateBudget, Reservation


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
