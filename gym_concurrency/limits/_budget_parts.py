"""The parts of one budget of a RateBudget: how it meters a minute (a sliding window or a
token bucket, behind one `Meter` shape), the estimates in flight, the provider's word, and
what its statistics read (re-exported by rate_budget.py, their public home)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

from .rate_window import RateWindow
from .token_bucket import TokenBucket

__all__ = [
    "BudgetName",
    "BudgetShape",
    "BudgetStatistics",
    "Meter",
    "MeteredBudget",
    "ProviderWord",
    "RateBudgetStatistics",
    "until",
]

BudgetName = Literal["tokens", "requests", "input_tokens", "output_tokens"]
"""A budget, as `nemo.gym.concurrency.budget` names it; its setting is `<name>_per_minute`."""
BudgetShape = Literal["sliding", "bucket"]
"""How a budget meters its minute: a sliding window of the last minute (no 60 s ever holds
more than the budget) or a token bucket (as OpenAI and Anthropic meter theirs)."""


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    """One budget now: its size a minute; what admission may take now (the smaller of its own
    and the provider's word, never below 0); the estimates of calls not yet settled; what was
    given back so far (estimates less usage, and cancelled calls); and the provider's last
    reported remaining while it is in force (None: none)."""

    budget: BudgetName
    limit: int
    remaining: int
    reserved: int
    refunded_total: int
    reported_remaining: int | None


@dataclass(frozen=True, slots=True)
class RateBudgetStatistics:
    """Every budget of a RateBudget, read at once; a budget not configured is None."""

    tokens: BudgetStatistics | None = None
    requests: BudgetStatistics | None = None
    input_tokens: BudgetStatistics | None = None
    output_tokens: BudgetStatistics | None = None

    def budgets(self) -> tuple[BudgetStatistics, ...]:
        """The configured budgets, in `BUDGETS` order."""
        found = (self.tokens, self.requests, self.input_tokens, self.output_tokens)
        return tuple(b for b in found if b is not None)


class Meter(Protocol):
    """What a budget asks of its meter; times are the budget's clock, never going back."""

    limit: int

    def advance(self, now: float) -> None: ...
    def charge(self, amount: int) -> None: ...
    def refund(self, amount: int, charged_at: float) -> None: ...
    def remaining_at(self, now: float) -> int: ...
    def fits_at(self, amount: int, now: float) -> float: ...
    def resize(self, limit: int, now: float) -> None: ...


class ProviderWord:
    """A provider's reading of one budget: `remaining` until `reset_at`, and what was reserved
    (net of refunds and overruns) since it came in."""

    __slots__ = ("epoch", "observed_at", "remaining", "reset_at", "spent")

    def __init__(self, remaining: int, reset_at: float, observed_at: float, epoch: int) -> None:
        self.remaining = remaining
        self.reset_at = reset_at
        self.observed_at = observed_at
        self.epoch = epoch  # the reservations made from this epoch on count against it
        self.spent = 0


class MeteredBudget:
    """One configured budget: its meter, the estimates in flight, what was given back, and
    the provider's word in force."""

    __slots__ = ("limit", "meter", "name", "refunded_total", "reserved", "word")

    def __init__(self, name: BudgetName, limit: int, shape: BudgetShape) -> None:
        self.name = name
        self.limit = limit
        self.meter: Meter = RateWindow(limit) if shape == "sliding" else TokenBucket(limit)
        self.reserved = 0
        self.refunded_total = 0
        self.word: ProviderWord | None = None

    def resize(self, limit: int, now: float) -> None:
        """A minute holds `limit` from `now` on."""
        self.limit = limit
        self.meter.resize(limit, now)

    def word_at(self, now: float) -> ProviderWord | None:
        """The provider's word in force at `now` (one past its reset is dropped)."""
        word = self.word
        if word is not None and now >= word.reset_at:
            self.word = word = None
        return word

    def wait(self, amount: int, now: float) -> float:
        """Seconds from `now` until `amount` fits both the meter and the provider's word;
        0.0: it fits now. The meter is advanced to `now`."""
        fits = self.meter.fits_at(amount, now)
        wait = 0.0 if fits <= now else until(fits, now)
        word = self.word_at(now)
        if word is not None and amount > word.remaining - word.spent:
            wait = max(wait, until(word.reset_at, now))
        return wait

    def remaining(self, now: float) -> tuple[int, int | None]:
        """What admission may take at `now` (>= 0) and the provider's remaining in force.
        Reads only: a statistics reader may be another thread."""
        own = self.meter.remaining_at(now)
        word = self.word
        if word is None or now >= word.reset_at:
            return max(0, own), None
        return max(0, min(own, word.remaining - word.spent)), word.remaining


def until(at: float, now: float) -> float:
    """`at - now`, rounded up so that `now + result >= at` holds in floating point too."""
    wait = at - now
    while now + wait < at:
        wait = math.nextafter(wait, math.inf)
    return wait
