"""RetryPolicy: which outcomes of an outbound call are tried again, and how long to wait first.

The wait before a retry is the server's word when it gave one (`retry-after-ms`, else
`Retry-After` in seconds or as an HTTP date) and full-jitter exponential backoff otherwise
(AWS Architecture Blog, "Exponential Backoff And Jitter"). A server's `x-should-retry` header
overrides the status list either way. Plain values and arithmetic: no clock, no I/O.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Literal

__all__ = [
    "IDEMPOTENT_METHODS",
    "BackoffSource",
    "DeniedReason",
    "RetryPolicy",
    "RetryReason",
    "backoff_delay",
    "retry_after_delay",
    "retry_after_seconds",
    "server_says_retry",
]

RetryReason = Literal["status", "connection", "timeout"]
BackoffSource = Literal["retry_after", "backoff"]
DeniedReason = Literal["attempts", "budget", "deadline", "retry_after_too_long"]

# RFC 9110 10.2.3: Retry-After is an HTTP date or delta-seconds = 1*DIGIT (ASCII digits only);
# retry-after-ms (OpenAI's) a non-negative decimal. OWS is spaces and horizontal tabs.
_DELTA_SECONDS = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_OWS = " \t"

# RFC 9110 9.2.2: repeating these has the effect of sending them once.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How an outbound call is retried: at most `max_attempts` attempts; a status in
    `statuses` (or `x-should-retry: true`), a connection error before any response byte, or a
    read timeout of an idempotent request is retried after the server's Retry-After or a
    full-jitter backoff; a retry budget over 10 s and an optional deadline bound it all."""

    max_attempts: int = 4
    statuses: tuple[int, ...] = (429, 502, 503, 504)
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 8.0
    max_retry_after_seconds: float = 120.0
    budget_ratio: float = 0.2
    budget_min_per_second: float = 10.0
    deadline_seconds: float | None = None
    # The wait after a server's Retry-After is uniform(told, told * (1 + this)): never before
    # the server's word, and callers it refused together do not all come back in one wave.
    retry_after_jitter: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise TypeError(f"RetryPolicy max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy max_attempts must be >= 1, got {self.max_attempts}")
        statuses = tuple(self.statuses)
        for status in statuses:
            if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
                raise ValueError(f"RetryPolicy statuses: {status!r} is not an HTTP status code")
        object.__setattr__(self, "statuses", statuses)
        _check_seconds("backoff_seconds", self.backoff_seconds)
        _check_seconds("backoff_max_seconds", self.backoff_max_seconds)
        _check_seconds("max_retry_after_seconds", self.max_retry_after_seconds)
        _check_seconds("budget_ratio", self.budget_ratio)
        _check_seconds("budget_min_per_second", self.budget_min_per_second)
        _check_seconds("retry_after_jitter", self.retry_after_jitter)
        if self.retry_after_jitter > 1:
            raise ValueError(
                f"RetryPolicy retry_after_jitter must be a fraction in [0, 1], "
                f"got {self.retry_after_jitter}"
            )
        if self.deadline_seconds is not None:
            _check_seconds("deadline_seconds", self.deadline_seconds)
            if self.deadline_seconds == 0:
                raise ValueError("RetryPolicy deadline_seconds must be > 0 (or None)")


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"RetryPolicy {name} must be a number, got {value!r}")
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"RetryPolicy {name} must be >= 0 and finite, got {value}")


def server_says_retry(policy: RetryPolicy, status: int, should_retry: str | None) -> bool:
    """Whether a response with `status` is retried: the server's `x-should-retry` ("true" /
    "false") on an error status decides, else whether `status` is in the policy's list."""
    if should_retry is not None and status >= 400:
        answer = should_retry.strip().lower()
        if answer == "true":
            return True
        if answer == "false":
            return False
    return status in policy.statuses


def retry_after_seconds(
    retry_after_ms: str | None, retry_after: str | None, now: float
) -> float | None:
    """The server's delay in seconds: `retry-after-ms` (a non-negative decimal), else
    `Retry-After` as delta-seconds (ASCII digits) or as an HTTP date (less `now`, a Unix time;
    a date in the past is 0); math.inf for digits past the largest float. None if neither is
    usable: the backoff applies."""
    if retry_after_ms is not None:
        milliseconds = _number(_DECIMAL, retry_after_ms)
        if milliseconds is not None:
            return milliseconds / 1000.0
    if retry_after is None:
        return None
    seconds = _number(_DELTA_SECONDS, retry_after)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(retry_after.strip(_OWS))
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, its zone merely unstated (HTTP dates are GMT)
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def _number(form: re.Pattern[str], text: str) -> float | None:
    """`text` (less optional whitespace) as a number if it has `form` exactly, else None:
    Python's float() would also take "1_0", non-ASCII digits, "inf" or "1e3". Digits past the
    largest float are infinity: a valid wait longer than any maximum, not an absent one."""
    value = text.strip(_OWS)
    if form.fullmatch(value) is None:
        return None
    return float(value)  # no digit limit, unlike int(): 5000 digits are inf, not an error


def retry_after_delay(
    policy: RetryPolicy,
    told: float,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """The wait after a server said Retry-After `told` seconds: uniform(told, told * (1 +
    retry_after_jitter)), never less than `told`."""
    if told <= 0 or policy.retry_after_jitter == 0:
        return told
    return max(told, uniform(told, told * (1.0 + policy.retry_after_jitter)))


def backoff_delay(
    policy: RetryPolicy,
    retry: int,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Full jitter before retry number `retry` (1 for the first retry):
    uniform(0, min(backoff_max_seconds, backoff_seconds * 2**(retry-1)))."""
    try:  # exact for any base, however small (a clamped exponent was not)
        grown = math.ldexp(policy.backoff_seconds, retry - 1)
    except OverflowError:  # past the largest float: the cap has long been reached
        grown = math.inf
    return uniform(0.0, min(policy.backoff_max_seconds, grown))
