"""One rate budget as a token bucket: at most `limit` tokens held, refilled continuously at
`limit` a minute, as OpenAI and Anthropic describe their own limits ("continuously replenished
up to your maximum limit").

A charge takes from the bucket and a refund puts back (never above `limit`); an overrun may
take it below zero (a debt the next admissions wait out). It starts full. Against a provider
that meters a bucket of the same size it admits exactly what the provider would; but it lets a
whole minute's budget go at once and then the refill, so one 60 s interval may hold up to
twice the budget (in any T seconds at most `limit` + `limit` x T / 60): more than a provider
metering a sliding minute allows (rate_window.py is that budget).

The same interface as RateWindow (advance, charge, refund, remaining_at, fits_at); the level
is a float, and a fit is judged with a tolerance of a billionth of `limit`, so that the
floating-point refill cannot make an exact wait fall short.
"""

from __future__ import annotations

import math

__all__ = ["REFILL_SECONDS", "TokenBucket"]

REFILL_SECONDS = 60.0
_TOLERANCE = 1e-9  # of `limit`


class TokenBucket:
    """`limit` tokens a minute, held up to `limit` (see the module's docstring)."""

    __slots__ = ("_at", "_level", "_rate", "_slack", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._rate = limit / REFILL_SECONDS
        self._slack = limit * _TOLERANCE
        self._level = float(limit)
        self._at: float | None = None  # when `_level` was last brought up to date

    def advance(self, now: float) -> None:
        """Refill up to `now` (no sooner than the last advance)."""
        at = self._at
        if at is None or now > at:
            self._level = self._level_at(now)
            self._at = now

    def resize(self, limit: int, now: float) -> None:
        """Hold up to `limit`, refilled at `limit` a minute, from `now` (after `advance(now)`):
        the level is kept (never above the new size)."""
        self.limit = limit
        self._rate = limit / REFILL_SECONDS
        self._slack = limit * _TOLERANCE
        self._level = min(float(limit), self._level)

    def charge(self, amount: int) -> None:
        self._level -= amount

    def refund(self, amount: int, charged_at: float) -> None:
        """Put `amount` back; a bucket already full (or filling over it) keeps only `limit`."""
        self._level = min(float(self.limit), self._level + amount)

    def remaining_at(self, now: float) -> int:
        """The whole tokens in the bucket at `now`, with no charge in between; negative in
        debt. Reads only: safe from another thread."""
        return math.floor(self._level_at(now) + self._slack)

    def fits_at(self, amount: int, now: float) -> float:
        """When `amount` (<= `limit`) fits, from `now` (after `advance(now)`)."""
        short = amount - self._level
        return now if short <= self._slack else now + short / self._rate

    def _level_at(self, now: float) -> float:
        at = self._at
        if at is None or now <= at:
            return self._level
        return min(float(self.limit), self._level + (now - at) * self._rate)
