"""Provider rate-limit headers read into typed readings: OpenAI's and Anthropic's formats as
they document and send them, every malformed value ignored on its own, never an exception
(hypothesis), and readings told to a RateBudget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from gym_concurrency.clients.provider_headers import (
    MAX_RESET_SECONDS,
    ProviderReading,
    openai_reset_seconds,
    provider_readings,
    report_readings,
    rfc3339_seconds,
)
from gym_concurrency.limits.rate_budget import RateBudget

NOW = 1_755_780_000.0  # 2025-08-21T12:40:00Z


def test_openais_documented_example() -> None:
    headers = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-requests": "1s",
        "X-RateLimit-Reset-Tokens": "6m0s",  # any case
    }
    assert provider_readings(headers) == (
        ProviderReading("tokens", 150000, 149984, 360.0),
        ProviderReading("requests", 60, 59, 1.0),
    )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("9ms", 0.009),
        ("1h2m3.5s", 3723.5),
        ("59.999s", 59.999),
        ("1.5µs", 1.5e-6),
        ("0s", 0.0),
        (" 12ms\t", 0.012),
        ("0", 0.0),  # Azure OpenAI: bare seconds
        ("17.25", 17.25),
    ],
)
def test_openai_resets_are_go_durations(value: str, seconds: float) -> None:
    assert openai_reset_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "s",
        "1x",
        "6s0m",
        "1m1m",
        "-1s",
        "1e3s",
        "1 s",
        "1s ms",
        "\u0661s",
        "1.s",
        "9" * 70 + "s",
    ],
)
def test_a_malformed_openai_reset_is_none(value: str) -> None:
    assert openai_reset_seconds(value) is None


def test_anthropics_headers_with_rfc_3339_resets() -> None:
    headers = {
        "anthropic-ratelimit-input-tokens-limit": "80000",
        "anthropic-ratelimit-input-tokens-remaining": "79000",
        "anthropic-ratelimit-input-tokens-reset": "2025-08-21T12:40:59Z",
        "anthropic-ratelimit-output-tokens-limit": "16000",
        "anthropic-ratelimit-output-tokens-remaining": "16000",
        "anthropic-ratelimit-output-tokens-reset": "2025-08-21T12:41:00+00:00",
        "anthropic-ratelimit-requests-limit": "1000",
        "anthropic-ratelimit-requests-remaining": "999",
        "anthropic-ratelimit-requests-reset": "2025-08-21T14:40:30.5+02:00",
        "anthropic-ratelimit-tokens-limit": "96000",
        "anthropic-ratelimit-tokens-remaining": "95000",
        "anthropic-ratelimit-tokens-reset": "2025-08-21T12:39:00Z",  # past: whole again now
    }
    assert provider_readings(headers, now=NOW) == (
        ProviderReading("tokens", 96000, 95000, 0.0),
        ProviderReading("requests", 1000, 999, 30.5),
        ProviderReading("input_tokens", 80000, 79000, 59.0),
        ProviderReading("output_tokens", 16000, 16000, 60.0),
    )


@pytest.mark.parametrize(
    "value",
    [
        "2025-08-21",
        "2025-08-21T12:40:59",  # no offset
        "2025-08-21T12:40:60Z",  # a leap second
        "2025-13-01T00:00:00Z",
        "Thu, 21 Aug 2025 12:41:00 GMT",
        "1755780059",
        "2025-08-21T12:40:59ZZ",
    ],
)
def test_a_reset_that_is_not_rfc_3339_is_none(value: str) -> None:
    assert rfc3339_seconds(value, NOW) is None
    assert rfc3339_seconds("2025-08-21t12:40:59z", NOW) == 59.0


def test_each_malformed_header_is_ignored_alone() -> None:
    headers = {
        "x-ratelimit-limit-tokens": "-1",  # Azure's "unknown"
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "soon",
        "x-ratelimit-limit-requests": "1.5",
        "x-ratelimit-remaining-requests": "+3",
        "x-ratelimit-reset-requests": "\uff11s",  # a full-width digit is not ASCII
        "anthropic-ratelimit-output-tokens-limit": "",
        "anthropic-ratelimit-requests-remaining": "\u0661\u0662",  # Arabic-Indic digits
        "x-ratelimit-limit-tokens_usage_based": "5",  # not a header read here
    }
    assert provider_readings(headers) == (ProviderReading("tokens", None, 149984, None),)


def test_a_header_sent_twice_with_two_values_is_ignored() -> None:
    twice = CIMultiDict(
        [
            ("x-ratelimit-remaining-tokens", "100"),
            ("X-RateLimit-Remaining-Tokens", "200"),
            ("x-ratelimit-limit-tokens", "500"),
            ("x-ratelimit-limit-tokens", "500"),  # the same value twice is one value
        ]
    )
    readings = provider_readings(CIMultiDictProxy(twice))
    assert readings == (ProviderReading("tokens", 500, None, None),)


def test_readings_tell_a_budget_what_remains_until_the_reset() -> None:
    now = [100.0]
    budget = RateBudget(tokens_per_minute=1000, requests_per_minute=50, clock=lambda: now[0])
    readings = (
        ProviderReading("tokens", 1000, 300, 2.5),
        ProviderReading("requests", 50, None, 1.0),  # no remaining: nothing to tell
        ProviderReading("output_tokens", 10, 0, 1.0),  # not configured: ignored by the budget
    )
    assert report_readings(budget, readings, now=now[0]) == 2
    assert budget.reserve(301) == pytest.approx(2.5)
    statistics = budget.statistics()
    assert statistics.tokens is not None
    assert statistics.tokens.reported_remaining == 300


@pytest.mark.parametrize(
    "headers",
    [
        {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "999999999999h"},
        {"anthropic-ratelimit-tokens-remaining": "0",
         "anthropic-ratelimit-tokens-reset": "9999-12-31T23:59:59Z"},
    ],
    ids=["openai", "anthropic"],
)  # fmt: skip
def test_a_reset_far_away_holds_a_budget_back_ten_minutes_at_most(headers: dict[str, str]) -> None:
    """One answer (or a wall clock far behind) would otherwise refuse every call for ages,
    and nothing admitted could bring a fresher reading."""
    now = [100.0]
    budget = RateBudget(tokens_per_minute=1000, clock=lambda: now[0])
    (reading,) = provider_readings(headers)
    assert reading.reset_seconds is not None
    assert reading.reset_seconds > 10**6  # read as the provider said it
    assert report_readings(budget, [reading], now=now[0]) == 1
    assert budget.reserve(1) == pytest.approx(MAX_RESET_SECONDS) == 600.0
    now[0] += MAX_RESET_SECONDS
    assert not isinstance(budget.reserve(1), float)  # the configured budget again


_NAMES = [
    f"x-ratelimit-{f}-{b}" for f in ("limit", "remaining", "reset") for b in ("requests", "tokens")
] + [
    f"anthropic-ratelimit-{b}-{f}"
    for b in ("requests", "tokens", "input-tokens", "output-tokens")
    for f in ("limit", "remaining", "reset")
]
_VALUES = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"[0-9]{1,25}", fullmatch=True),
    st.from_regex(r"([0-9]{1,3}(\.[0-9]{0,3})?(h|m|s|ms|us|ns)){1,4}", fullmatch=True),
    st.from_regex(
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(Z|[+-][0-9]{2}:[0-9]{2})",
        fullmatch=True,
    ),
)


@settings(max_examples=500, deadline=None)
@given(headers=st.dictionaries(st.sampled_from(_NAMES), _VALUES, max_size=10))
def test_no_header_value_raises_and_every_reading_is_well_formed(headers: dict[str, str]) -> None:
    for reading in provider_readings(headers, now=NOW):
        assert reading.limit is None or reading.limit >= 0
        assert reading.remaining is None or reading.remaining >= 0
        assert reading.reset_seconds is None or reading.reset_seconds >= 0.0
