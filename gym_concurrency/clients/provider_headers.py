"""A provider's rate-limit headers, read into one typed reading per budget (limit, remaining,
seconds until reset), for a RateBudget to tighten what it admits (`report_readings`).

The formats, as the providers document and send them:
- OpenAI ("Rate limits in headers", platform.openai.com/docs/guides/rate-limits):
  `x-ratelimit-limit-requests: 60`, `x-ratelimit-limit-tokens: 150000`,
  `x-ratelimit-remaining-requests: 59`, `x-ratelimit-remaining-tokens: 149984`,
  `x-ratelimit-reset-requests: 1s`, `x-ratelimit-reset-tokens: 6m0s`: "the time until the
  rate limit (based on tokens) resets to its initial state". Live responses also show `12ms`
  and `9ms` (community.openai.com/t/1268905): Go's duration syntax, read here as numbers with
  the units h, m, s, ms, us / µs, ns, largest first (`1h2m3.5s`). Azure OpenAI sends `-1` for
  an unknown count and a bare number of seconds as a reset (learn.microsoft.com, Q&A 5625878):
  a negative count is ignored, a bare number read as seconds.
- Anthropic ("Rate limits", platform.claude.com/docs/en/api/rate-limits; the same list in
  docs.aws.amazon.com/claude-platform/latest/userguide/rate-limits.html):
  `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`,
  the reset "Time when the ... limit resets (RFC 3339)", e.g. `2025-08-21T12:40:59Z` as a live
  response sends it; its limits are token buckets, continuously replenished.

Each header is read on its own: a count is ASCII digits (spaces and tabs around it allowed);
anything else (a sign, a fraction, a header sent twice with two values, a date that is not RFC
3339) is ignored, that header alone. Nothing here raises on any header value. A budget is told
a reset at most `MAX_RESET_SECONDS` (10 minutes) away: past it, the next call's answer tells
again.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from ..limits.rate_budget import BudgetName

if TYPE_CHECKING:
    from ..upstream_view import UpstreamBudget

__all__ = [
    "MAX_RESET_SECONDS",
    "ProviderReading",
    "openai_reset_seconds",
    "provider_readings",
    "report_readings",
    "rfc3339_seconds",
]

# The furthest reset a budget is told: a per-minute budget's provider resets within minutes
# (OpenAI's example says 6m0s), and a later answer tells again (a daily limit, say).
MAX_RESET_SECONDS = 600.0
_Field = Literal["limit", "remaining", "reset"]
_FIELDS: tuple[_Field, ...] = ("limit", "remaining", "reset")
_OPENAI: dict[str, BudgetName] = {"requests": "requests", "tokens": "tokens"}
_ANTHROPIC: dict[str, BudgetName] = {
    "requests": "requests",
    "tokens": "tokens",
    "input-tokens": "input_tokens",
    "output-tokens": "output_tokens",
}
_HEADERS: dict[str, tuple[BudgetName, _Field, bool]] = {
    **{
        f"x-ratelimit-{field}-{part}": (budget, field, False)
        for part, budget in _OPENAI.items()
        for field in _FIELDS
    },
    **{
        f"anthropic-ratelimit-{part}-{field}": (budget, field, True)
        for part, budget in _ANTHROPIC.items()
        for field in _FIELDS
    },
}
"""Header name -> (budget, field, whether its reset is an RFC 3339 time)."""

_ORDER: tuple[BudgetName, ...] = ("tokens", "requests", "input_tokens", "output_tokens")
_LONGEST_VALUE = 64
_COUNT = re.compile(r"[0-9]{1,18}")
_SECONDS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")
_DURATION_PART = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)(h|ms|us|µs|μs|ns|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
_UNIT_SECONDS |= {"μs": 1e-6, "ns": 1e-9}
_UNIT_RANK = {"h": 0, "m": 1, "s": 2, "ms": 3, "us": 4, "µs": 4, "μs": 4, "ns": 5}
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?"
    r"(?:[Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_OWS = " \t"


@dataclass(frozen=True, slots=True)
class ProviderReading:
    """What a provider said of one budget: its size, what remains, and the seconds until it
    is whole again (each None where not said, or not said readably)."""

    budget: BudgetName
    limit: int | None = None
    remaining: int | None = None
    reset_seconds: float | None = None


def provider_readings(
    headers: Mapping[str, str], *, now: float | None = None
) -> tuple[ProviderReading, ...]:
    """One reading per budget the response's `headers` speak of (OpenAI's or Anthropic's), in
    the order tokens, requests, input_tokens, output_tokens. `now`: the wall clock
    (`time.time()`, the default) that an RFC 3339 reset is counted from."""
    wall = time.time() if now is None else now
    seen: dict[tuple[BudgetName, _Field], int | float | None] = {}
    for name, raw in _values(headers).items():
        budget, field, dated = _HEADERS[name]
        value = None if raw is None else _read(field, raw, dated, wall)
        key = (budget, field)
        if value is not None and seen.get(key) is None:
            seen[key] = value
    readings = []
    for budget in _ORDER:
        limit, remaining = seen.get((budget, "limit")), seen.get((budget, "remaining"))
        reset = seen.get((budget, "reset"))
        if limit is None and remaining is None and reset is None:
            continue
        readings.append(
            ProviderReading(
                budget,
                None if limit is None else int(limit),
                None if remaining is None else int(remaining),
                None if reset is None else float(reset),
            )
        )
    return tuple(readings)


def report_readings(
    budget: UpstreamBudget, readings: Iterable[ProviderReading], *, now: float
) -> int:
    """Tell `budget` each reading that says both what remains and when it resets (`now`: the
    budget's clock, so the reset is `now + reset_seconds`, at most `MAX_RESET_SECONDS` on);
    how many were told."""
    told = 0
    for reading in readings:
        if reading.remaining is not None and reading.reset_seconds is not None:
            # One answer (or a wall clock far behind an RFC 3339 reset) may not hold a budget
            # back for days: nothing would be admitted to bring a fresher reading.
            seconds = min(reading.reset_seconds, MAX_RESET_SECONDS)
            budget.report(reading.budget, remaining=reading.remaining, reset_at=now + seconds)
            told += 1
    return told


def openai_reset_seconds(value: str) -> float | None:
    """OpenAI's reset (`6m0s`, `20ms`, `1h2m3.5s`; a bare number: seconds) in seconds, or
    None if it is not one."""
    value = value.strip(_OWS)
    if len(value) > _LONGEST_VALUE:
        return None
    if _SECONDS.fullmatch(value):
        return float(value)
    seconds, rank, end = 0.0, -1, 0
    for part in _DURATION_PART.finditer(value):
        number, unit = part.groups()
        if part.start() != end or _UNIT_RANK[unit] <= rank:  # a gap, or units out of order
            return None
        seconds += float(number) * _UNIT_SECONDS[unit]
        rank, end = _UNIT_RANK[unit], part.end()
    return seconds if end and end == len(value) else None


def rfc3339_seconds(value: str, now: float) -> float | None:
    """Seconds from `now` (wall clock) until the RFC 3339 time `value` (0.0 if it is past), or
    None if `value` is not one."""
    value = value.strip(_OWS)
    if len(value) > _LONGEST_VALUE or not _RFC3339.fullmatch(value):
        return None
    try:
        at = datetime.fromisoformat(value.upper().replace(" ", "T")).timestamp()
    except (ValueError, OverflowError):  # a day or an hour out of range, a leap second
        return None
    seconds = at - now
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _values(headers: Mapping[str, str]) -> dict[str, str | None]:
    """The rate-limit headers by lower-case name; None for one sent twice with two values."""
    found: dict[str, str | None] = {}
    for name, value in headers.items():
        key = name.lower()
        if key not in _HEADERS:
            continue
        if key in found and found[key] != value:
            found[key] = None
        elif key not in found:
            found[key] = value
    return found


def _read(field: _Field, raw: str, dated: bool, now: float) -> int | float | None:
    if not isinstance(raw, str):
        return None
    if field != "reset":
        value = raw.strip(_OWS)
        return int(value) if _COUNT.fullmatch(value) else None
    return rfc3339_seconds(raw, now) if dated else openai_reset_seconds(raw)
