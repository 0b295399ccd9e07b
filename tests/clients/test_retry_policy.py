"""RetryPolicy, the delay before a retry and the retry budget, as plain values: what a
misconfiguration is told, and the invariants (never before the server's word, full jitter's
range, the budget's bound over every window) over generated inputs."""

from __future__ import annotations

import email.utils
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gym_concurrency.clients import RetryBudget, RetryPolicy
from gym_concurrency.clients.retry import (
    backoff_delay,
    retry_after_delay,
    retry_after_seconds,
    server_says_retry,
)


@pytest.mark.parametrize(
    ("fields", "error", "names"),
    [
        ({"max_attempts": 0}, ValueError, "max_attempts"),
        ({"max_attempts": 2.5}, TypeError, "max_attempts"),
        ({"statuses": (429, 700)}, ValueError, "700"),
        ({"backoff_seconds": -1}, ValueError, "backoff_seconds"),
        ({"backoff_max_seconds": float("inf")}, ValueError, "backoff_max_seconds"),
        ({"max_retry_after_seconds": "60"}, TypeError, "max_retry_after_seconds"),
        ({"budget_ratio": float("nan")}, ValueError, "budget_ratio"),
        ({"budget_min_per_second": -0.1}, ValueError, "budget_min_per_second"),
        ({"deadline_seconds": 0}, ValueError, "deadline_seconds"),
        ({"retry_after_jitter": 1.5}, ValueError, "retry_after_jitter"),
        ({"retry_after_jitter": -0.1}, ValueError, "retry_after_jitter"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(
    fields: dict[str, Any], error: type[Exception], names: str
):
    with pytest.raises(error, match=names):
        RetryPolicy(**fields)


def test_the_defaults_are_the_documented_ones():
    assert RetryPolicy() == RetryPolicy(
        max_attempts=4,
        statuses=(429, 502, 503, 504),
        backoff_seconds=0.5,
        backoff_max_seconds=8.0,
        max_retry_after_seconds=120.0,
        budget_ratio=0.2,
        budget_min_per_second=10.0,
        deadline_seconds=None,
        retry_after_jitter=0.1,
    )


def test_retry_after_ms_comes_first_then_seconds_then_a_date():
    now = 1_700_000_000.0
    assert retry_after_seconds("250", "3", now) == 0.25
    assert retry_after_seconds(None, "3", now) == 3.0
    assert retry_after_seconds("soon", "2", now) == 2.0  # an unusable ms header is skipped
    date = email.utils.formatdate(now + 7, usegmt=True)
    assert retry_after_seconds(None, date, now) == pytest.approx(7.0)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert retry_after_seconds(None, past, now) == 0.0
    assert retry_after_seconds(None, "tomorrow", now) is None
    assert retry_after_seconds("-5", "-1", now) is None
    assert retry_after_seconds(None, None, now) is None


@pytest.mark.parametrize(
    "text",
    [
        "1_0",
        "\uff11\uff10",
        "\u0661\u0660",
        "1.5",
        "1e3",
        "inf",
        "nan",
        "+3",
        "-1",
        "0x10",
        "3 s",
        "",
    ],
)
def test_retry_after_is_delta_seconds_in_ascii_digits_or_a_date(text: str):
    # RFC 9110: delta-seconds = 1*DIGIT. Python's float() would read "1_0" as 10, full-width
    # and Arabic-Indic digits as numbers, "inf" and "1e3": each is ignored, the backoff applies.
    assert retry_after_seconds(None, text, 0.0) is None
    assert retry_after_seconds(None, f" \t{7}\t ", 0.0) == 7.0  # optional whitespace around


@pytest.mark.parametrize(
    "text", ["1_000", "\uff15\uff10\uff10", "1e3", "inf", "nan", "-0", "+5", "5ms"]
)
def test_retry_after_ms_is_a_non_negative_decimal(text: str):
    assert retry_after_seconds(text, None, 0.0) is None
    assert retry_after_seconds(text, "3", 0.0) == 3.0  # then Retry-After is read
    assert retry_after_seconds("250.5", None, 0.0) == pytest.approx(0.2505)
    assert retry_after_seconds(".5", None, 0.0) == pytest.approx(0.0005)


def test_x_should_retry_overrides_the_status_list_on_error_statuses():
    policy = RetryPolicy()
    assert server_says_retry(policy, 503, None)
    assert not server_says_retry(policy, 503, "false")
    assert server_says_retry(policy, 409, "true")
    assert not server_says_retry(policy, 500, None)
    assert not server_says_retry(policy, 200, "true")  # a success is never retried
    assert server_says_retry(policy, 429, "maybe")  # not a yes or a no: the list decides


@given(
    seconds=st.integers(min_value=0, max_value=10**6),
    milliseconds=st.none() | st.floats(min_value=0, max_value=1e9, allow_nan=False),
)
def test_the_delay_is_never_shorter_than_the_servers_word(seconds: int, milliseconds: float | None):
    # Plain decimal notation, exact: the header form (repr() may use an exponent).
    ms_header = None if milliseconds is None else format(Decimal(milliseconds), "f")
    delay = retry_after_seconds(ms_header, str(seconds), 0.0)
    assert delay is not None
    expected = seconds if milliseconds is None else milliseconds / 1000.0
    assert delay >= expected


@given(
    retry=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0, max_value=100, allow_nan=False),
    cap=st.floats(min_value=0, max_value=100, allow_nan=False),
    draw=st.floats(min_value=0, max_value=1),
)
# A base so small that 2**87 times it is still under the cap (an exponent clamped at 64 was not)
@example(retry=88, base=1.1754943508222875e-38, cap=1.0, draw=1.0)
def test_full_jitter_stays_between_zero_and_the_capped_exponential(
    retry: int, base: float, cap: float, draw: float
):
    policy = RetryPolicy(backoff_seconds=base, backoff_max_seconds=cap)
    delay = backoff_delay(policy, retry, lambda low, high: low + (high - low) * draw)
    ceiling = min(cap, base * 2.0 ** (retry - 1))
    assert 0.0 <= delay <= ceiling + 1e-12
    if draw == 1:
        assert delay == pytest.approx(ceiling)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# A timeline: each step moves the clock on, then makes a first attempt or asks for a retry.
steps = st.lists(
    st.tuples(st.floats(min_value=0, max_value=3, allow_nan=False), st.booleans()),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(
    timeline=steps,
    ratio=st.sampled_from([0.0, 0.1, 0.2, 0.5, 1.0]),
    floor=st.sampled_from([0.0, 0.1, 0.5, 1.0, 10.0]),
)
def test_the_budget_never_grants_past_its_bound_and_denies_only_at_it(
    timeline: list[tuple[float, bool]], ratio: float, floor: float
):
    """For every retry granted at r, the retries in (r - 10, r] are at most ratio x the first
    attempts in (r - 10, r] + floor x 10; a retry is denied only when granting it would
    exceed that bound."""
    clock = Clock()
    budget = RetryBudget(ratio, floor, clock=clock)
    firsts: list[float] = []
    granted: list[float] = []
    for step, is_first in timeline:
        clock.now += step
        if is_first:
            budget.first_attempt()
            firsts.append(clock.now)
            continue
        now = clock.now
        in_window = sum(1 for t in granted if t > now - 10)
        bound = ratio * sum(1 for t in firsts if t > now - 10) + floor * 10
        if budget.try_retry():
            granted.append(now)
            assert in_window + 1 <= bound + 1e-9
        else:
            assert in_window + 1 > bound - 1e-9
    assert budget.retries_in_window() == sum(1 for t in granted if t > clock.now - 10)


@settings(max_examples=200)
@given(
    told=st.floats(0, 3600, allow_nan=False),
    jitter=st.floats(0, 1, allow_nan=False),
    draw=st.floats(0, 1, allow_nan=False),
)
def test_retry_after_jitter_never_comes_before_the_server_s_word(
    told: float, jitter: float, draw: float
):
    def uniform(low: float, high: float) -> float:
        return low + (high - low) * draw

    delay = retry_after_delay(RetryPolicy(retry_after_jitter=jitter), told, uniform)
    assert told <= delay <= told * (1 + jitter) + 1e-9


def test_callers_refused_together_come_back_spread_not_in_one_wave():
    delays = [retry_after_delay(RetryPolicy(), 2.0) for _ in range(1000)]
    assert min(delays) >= 2.0
    assert max(delays) <= 2.2
    assert max(delays) - min(delays) > 0.15  # spread over the 10 % after Retry-After
    assert {retry_after_delay(RetryPolicy(retry_after_jitter=0), 2.0) for _ in range(50)} == {2.0}
