"""RateBudget by example, on a clock the test sets: what a reservation takes and when a
refused one would fit, settlement, provider reports, bad input; both shapes
(tests/core/test_rate_budget_stateful.py proves the bounds, test_rate_budget_use.py measures
what a steady demand gets out of them)."""

from __future__ import annotations

import dataclasses

import pytest

from gym_concurrency.limits.rate_budget import RateBudget, Reservation
from gym_concurrency.usage import Usage


class Clock:
    def __init__(self, now: float = 100.25) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def budget(clock: Clock, **sizes: int) -> RateBudget:
    return RateBudget(clock=clock, **sizes)


def taken(result: Reservation | float) -> Reservation:
    assert isinstance(result, Reservation), f"refused: fits in {result} s"
    return result


def test_a_bucket_refills_continuously_and_keeps_what_was_left_idle() -> None:
    clock = Clock(100.0)
    tokens = budget(clock, tokens_per_minute=1200, shape="bucket")  # type: ignore[arg-type]
    taken(tokens.reserve(1200))  # starts full: the whole minute at once
    assert tokens.reserve(600) == pytest.approx(30.0)  # 20 a second
    clock.now = 115.0
    taken(tokens.reserve(300))  # a quarter minute refilled 300
    clock.now = 400.0
    assert tokens.statistics().tokens.remaining == 1200  # type: ignore[union-attr]
    early = taken(tokens.reserve(1000))
    tokens.settle(early, 100)  # the unused 900 return at once, never past the size
    assert tokens.statistics().tokens.remaining == 1100  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="shape must be 'sliding' or 'bucket', not 'leaky'"):
        RateBudget(tokens_per_minute=1, shape="leaky")  # type: ignore[arg-type]


def test_a_full_minute_refills_only_as_its_charges_leave_the_window() -> None:
    clock = Clock(100.25)
    tokens = budget(clock, tokens_per_minute=1000)
    taken(tokens.reserve(1000))  # the whole minute in one burst: allowed, no more
    clock.now = 130.0
    # A token bucket would have refilled half by now; no 60 s may hold more than 1000.
    assert tokens.reserve(1) == pytest.approx(31.0)  # slot 100 leaves at 161
    clock.now = 160.999
    assert isinstance(tokens.reserve(1), float)
    clock.now = 161.0
    taken(tokens.reserve(1000))


def test_a_refusal_says_exactly_when_every_budget_holds_it() -> None:
    clock = Clock(100.5)
    both = budget(clock, tokens_per_minute=1000, requests_per_minute=2)
    taken(both.reserve(300))
    clock.now = 110.5
    taken(both.reserve(300))
    clock.now = 120.5
    wait = both.reserve(100)  # tokens would fit; the requests budget is spent until 161
    assert wait == pytest.approx(40.5)
    assert both.statistics().tokens.reserved == 600  # type: ignore[union-attr]
    clock.now = 120.5 + wait - 1e-6
    assert isinstance(both.reserve(100), float)
    clock.now = 120.5 + wait
    taken(both.reserve(100))


def test_nothing_is_taken_from_any_budget_when_one_refuses() -> None:
    clock = Clock()
    split = budget(clock, tokens_per_minute=1000, output_tokens_per_minute=100)
    taken(split.reserve(150, input_tokens=100, output_tokens=50))
    before = split.statistics()
    assert isinstance(split.reserve(150, input_tokens=90, output_tokens=60), float)
    assert split.statistics() == before
    assert before.output_tokens is not None
    assert before.output_tokens.remaining == 50


def test_settling_refunds_the_unused_estimate_and_charges_an_overrun_now() -> None:
    clock = Clock(100.5)
    tokens = budget(clock, tokens_per_minute=1000, input_tokens_per_minute=800)
    reservation = taken(tokens.reserve(600, input_tokens=200))
    clock.now = 150.5
    tokens.settle(reservation, Usage(input_tokens=150, output_tokens=100))
    stats = tokens.statistics()
    assert stats.tokens is not None
    assert stats.input_tokens is not None
    assert (stats.tokens.remaining, stats.tokens.refunded_total) == (750, 350)
    assert (stats.input_tokens.remaining, stats.input_tokens.refunded_total) == (650, 50)
    over = taken(tokens.reserve(100))
    tokens.settle(over, 400)  # a total only: the input budget keeps its estimate
    clock.now = 161.0  # the first call's slot left the window; the overrun (150 s) stays
    stats = tokens.statistics()
    assert stats.tokens is not None
    assert stats.tokens.remaining == 1000 - 400
    assert stats.tokens.reserved == 0


def test_a_call_without_usage_keeps_its_estimate_and_one_never_sent_returns_all() -> None:
    clock = Clock()
    both = budget(clock, tokens_per_minute=1000, requests_per_minute=10)
    aborted = taken(both.reserve(400))
    both.charge_in_full(aborted)
    unsent = taken(both.reserve(400))
    both.cancel(unsent)
    stats = both.statistics()
    assert stats.tokens is not None
    assert stats.requests is not None
    assert (stats.tokens.remaining, stats.tokens.reserved) == (600, 0)
    assert (stats.requests.remaining, stats.requests.refunded_total) == (9, 1)
    assert (aborted.open, unsent.open) == (False, False)


def test_a_usage_past_the_minute_is_charged_as_one_minute_at_most() -> None:
    clock = Clock(100.5)
    tokens = budget(clock, tokens_per_minute=1000)
    tokens.settle(taken(tokens.reserve(10)), 10**30)  # an upstream's nonsense
    assert tokens.reserve(1) == pytest.approx(60.5)  # a minute of debt, not forever


def test_closing_twice_or_in_another_budget_raises() -> None:
    clock = Clock()
    first, second = budget(clock, tokens_per_minute=10), budget(clock, tokens_per_minute=10)
    reservation = taken(first.reserve(5))
    with pytest.raises(ValueError, match="not made by this RateBudget"):
        second.settle(reservation, 1)
    first.settle(reservation, 1)
    with pytest.raises(ValueError, match="already closed"):
        first.charge_in_full(reservation)
    with pytest.raises(ValueError, match="already closed"):
        first.cancel(reservation)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({}, "at least one of tokens_per_minute"),
        ({"tokens_per_minute": 0}, "tokens_per_minute must be an int >= 1, not 0"),
        ({"requests_per_minute": 2.5}, "requests_per_minute must be an int >= 1, not 2.5"),
        ({"output_tokens_per_minute": True}, "output_tokens_per_minute must be an int >= 1"),
    ],
)
def test_a_bad_size_is_named(sizes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RateBudget(**sizes)  # type: ignore[arg-type]


def test_a_bad_or_impossible_estimate_is_named() -> None:
    tokens = budget(Clock(), tokens_per_minute=100, input_tokens_per_minute=50)
    with pytest.raises(ValueError, match="tokens must be an int >= 0, not -1"):
        tokens.reserve(-1)
    with pytest.raises(ValueError, match=r"input_tokens must be an int >= 0, not 1\.5"):
        tokens.reserve(10, input_tokens=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="101 tokens is more than tokens_per_minute=100"):
        tokens.reserve(101, input_tokens=1)
    # Without a split the whole estimate is the input's: it must fit that budget too.
    with pytest.raises(ValueError, match="60 input_tokens is more than input_tokens_per_minute"):
        tokens.reserve(60)
    with pytest.raises(ValueError, match="usage must be an int >= 0"):
        tokens.settle(taken(tokens.reserve(10)), -5)


def test_a_provider_report_tightens_until_its_reset_and_never_loosens() -> None:
    clock = Clock(100.0)
    tokens = budget(clock, tokens_per_minute=1000)
    tokens.report("tokens", remaining=300, reset_at=110.0)
    taken(tokens.reserve(200))
    assert tokens.reserve(200) == pytest.approx(10.0)  # 100 left of what the provider said
    stats = tokens.statistics().tokens
    assert stats is not None
    assert (stats.remaining, stats.reported_remaining) == (100, 300)
    clock.now = 110.0  # the provider's reset: only the budget's own window counts now
    stats = tokens.statistics().tokens
    assert stats is not None
    assert (stats.remaining, stats.reported_remaining) == (800, None)
    tokens.report("tokens", remaining=5000, reset_at=120.0)  # more than configured
    assert tokens.statistics().tokens.remaining == 800  # type: ignore[union-attr]
    tokens.report("requests", remaining=0, reset_at=120.0)  # a budget not configured: ignored
    taken(tokens.reserve(800))


def test_the_freshest_report_wins_and_one_already_reset_is_ignored() -> None:
    clock = Clock(100.0)
    tokens = budget(clock, tokens_per_minute=1000)
    tokens.report("tokens", remaining=500, reset_at=130.0, observed_at=99.0)
    tokens.report("tokens", remaining=900, reset_at=130.0, observed_at=98.0)  # older: ignored
    assert tokens.statistics().tokens.reported_remaining == 500  # type: ignore[union-attr]
    tokens.report("tokens", remaining=0, reset_at=100.0)  # resets now: says nothing
    tokens.report("tokens", remaining=0, reset_at=float("nan"))
    assert tokens.statistics().tokens.reported_remaining == 500  # type: ignore[union-attr]
    tokens.report("tokens", remaining=400, reset_at=120.0)  # observed now: fresher
    assert tokens.statistics().tokens.remaining == 400  # type: ignore[union-attr]


def test_the_wait_holds_where_floating_point_subtraction_rounds_down() -> None:
    # now + (reset_at - now) < reset_at for these two floats (a tie rounded to even): the
    # wait is rounded up so that reserving at now + wait is at or past the reset.
    now, reset_at = 2.0**-53, 1.0 + 2.0**-52
    assert now + (reset_at - now) < reset_at
    clock = Clock(now)
    tokens = budget(clock, tokens_per_minute=1000)
    tokens.report("tokens", remaining=0, reset_at=reset_at)
    wait = tokens.reserve(1)
    assert isinstance(wait, float)
    clock.now = now + wait
    taken(tokens.reserve(1))


def test_statistics_is_one_frozen_value_of_the_configured_budgets() -> None:
    both = budget(Clock(), tokens_per_minute=10, requests_per_minute=2)
    stats = both.statistics()
    assert [b.budget for b in stats.budgets()] == ["tokens", "requests"]
    assert stats.input_tokens is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.tokens = None  # type: ignore[misc]
    assert both.limits == {"tokens": 10, "requests": 2}
