"""RateBudget: an upstream's per-minute budgets of tokens and requests, reserved before a call
and settled from its usage after it.

A budget counts what a minute allows, not what may run at once: `tokens_per_minute`,
`requests_per_minute`, and where a provider splits them `input_tokens_per_minute` /
`output_tokens_per_minute`. No burst ever takes more than one minute's budget. `shape` says
how the minute is metered (docs/rate-budgets.md compares them):
- `"sliding"` (the default): a window of the last minute (rate_window.py); a charge counts for
  60 to 61 s and then refills. No 60 s interval ever holds more than the budget, whatever the
  provider meters; capacity left idle while the next call waits is not kept for later.
- `"bucket"`: a token bucket of one minute's budget, refilled continuously (token_bucket.py),
  as OpenAI and Anthropic describe theirs; it keeps what was left idle (up to a minute's
  worth), so one 60 s interval may hold up to twice the budget.

- `reserve(tokens, input_tokens=, output_tokens=)` takes the estimate from every budget and
  one request, all or none, and returns a `Reservation`; or, if any budget cannot hold it
  now, the seconds until all of them can (exact: reserving at now + that succeeds, if nothing
  else is charged meanwhile, and any sooner fails): an honest Retry-After.
- `settle(reservation, usage)` charges what the call used: the unused part is refunded, an
  overrun charged now. `charge_in_full(reservation)` closes a call that ended without usage
  (aborted, failed, unparseable: it may have cost its whole estimate); `cancel(reservation)`
  one that never reached the upstream (everything back, its request too).
- `report(budget, remaining=, reset_at=)`: what the provider says remains until `reset_at`.
  Until then admission uses the smaller of this budget's own remaining and the reported one
  less what was reserved since the report; it never loosens past the configured budget. A
  report observed earlier than the one in force is ignored (the freshest reading wins).
- `wait_for(tokens)` reads, without charging, the seconds until `reserve` would take it;
  `resize(budget, per_minute)` changes one budget's size (a settings reload).
- Backfill: `target(tokens, backfill_seconds)` is when a call held back now is admitted at
  the latest, `spare(tokens, target)` what lighter calls may take meanwhile so that it still
  fits then, and `reserve_within(tokens, spare)` reserves one of them within that.
- `statistics()` reads every budget at once as one frozen value, as anyio's CapacityLimiter
  answers.
- `allowance` (budget_allowance.py): a sliding budget with no provider's word in force lets
  `take` and `reserve` (no split) go for the rest of the second without reading its meters,
  as long as what every meter held when it opened lasts; a limit's uncontended `async with`
  asks only it.

An estimate is what the limit's weight rules price a call at (`openai_tokens`: the prompt's
characters / 4 plus its `max_tokens`, else a default output; a `json:` number; an int): the
most it may cost, refunded down to what it did. Plain numbers, a clock passed in (the event
loop's `time()`, or anything monotonic), O(1) per call; no OpenTelemetry, no tasks: a limit
calls it on its admission path and reads `statistics()` at export.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import get_args

from ..usage import Usage
from ._budget_parts import (
    BudgetName,
    BudgetShape,
    BudgetStatistics,
    MeteredBudget,
    ProviderWord,
    RateBudgetStatistics,
)
from .budget_allowance import BudgetAllowance
from .budget_reservation import BudgetReservation, OwnedReservation, Reservation
from .rate_window import slot_of, slot_start

__all__ = [
    "BUDGETS",
    "BudgetName",
    "BudgetReservation",
    "BudgetShape",
    "BudgetStatistics",
    "OwnedReservation",
    "RateBudget",
    "RateBudgetStatistics",
    "Reservation",
    "check_count",
    "used_per_budget",
]

BUDGETS: tuple[BudgetName, ...] = get_args(BudgetName)


class RateBudget:
    """Per-minute budgets of tokens and requests (see the module's docstring)."""

    __slots__ = (
        "_allowance",
        "_budgets",
        "_by_name",
        "_cap",
        "_clock",
        "_epoch",
        "_now",
        "_ones",
        "_ones_share",
        "shape",
    )

    def __init__(
        self,
        *,
        tokens_per_minute: int | None = None,
        requests_per_minute: int | None = None,
        input_tokens_per_minute: int | None = None,
        output_tokens_per_minute: int | None = None,
        shape: BudgetShape = "sliding",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if shape not in get_args(BudgetShape):
            raise ValueError(f"shape must be 'sliding' or 'bucket', not {shape!r}")
        sizes = (
            tokens_per_minute,
            requests_per_minute,
            input_tokens_per_minute,
            output_tokens_per_minute,
        )
        self._budgets = tuple(
            MeteredBudget(name, _size(name, size), shape)
            for name, size in zip(BUDGETS, sizes, strict=True)
            if size is not None
        )
        if not self._budgets:
            raise ValueError(
                "a RateBudget needs at least one of tokens_per_minute, requests_per_minute, "
                "input_tokens_per_minute, output_tokens_per_minute"
            )
        self.shape = shape
        self._by_name = {b.name: b for b in self._budgets}
        self._sized()
        self._ones = self._whole(1)  # (asked of each budget by an estimate of 1: made once)
        self._clock = clock
        self._epoch = 0  # one more at every provider report
        # The latest time the meters were moved to (the clock never goes back here); a take
        # through the allowance does not move it.
        self._now = -math.inf
        self._allowance = BudgetAllowance(clock, self._advance)  # opened by a charge (sliding)

    @property
    def allowance(self) -> BudgetAllowance:
        """What calls may take until the current second ends without asking this budget's
        meters (budget_allowance.py): `allowance.take(tokens)` is `take(tokens) == 0.0` when it
        holds them, else False with nothing taken (then ask `take`)."""
        return self._allowance

    @property
    def limits(self) -> dict[BudgetName, int]:
        """Each configured budget's size a minute."""
        return {b.name: b.limit for b in self._budgets}

    @property
    def largest_estimate(self) -> int | None:
        """The most tokens one reservation can ever take (its smallest budget of tokens: a
        larger estimate raises); None with a budget of requests only."""
        return self._cap

    def _sized(self) -> None:
        """What follows from the sizes: the largest estimate, and a second's share of the
        smallest budget (>= 1), the most an allowance's `take_one` takes (budget_allowance.py)."""
        self._cap = min((b.limit for b in self._budgets if b.name != "requests"), default=None)
        self._ones_share = min(max(1, b.limit // 60) for b in self._budgets)

    def reserve(
        self, tokens: int, *, input_tokens: int | None = None, output_tokens: int | None = None
    ) -> Reservation | float:
        """Take `tokens` (and the input / output split, where those budgets exist; without
        one the whole estimate is charged to each) and one request from every budget, or
        nothing: then the seconds until all would fit. Raises ValueError for an estimate
        that is not an int >= 0, or more than its budget's minute (it could never fit: cap
        it at the budget)."""
        whole = input_tokens is None and output_tokens is None  # (the allowance's kind)
        if whole and tokens.__class__ is int and self._allowance.take(tokens):
            return self._allowed(tokens)
        return self._reserve(self._asked(tokens, input_tokens, output_tokens))

    def take(self, tokens: int) -> float:
        """`reserve(tokens)` closed at once with `charge_in_full` (a call that cannot settle),
        without a Reservation: 0.0 if taken, else the seconds until it would fit (nothing
        charged). The same ValueError as `reserve` for a bad estimate."""
        if tokens.__class__ is int and self._allowance.take(tokens):
            return 0.0
        asked = self._asked(tokens, None, None)
        now = self._advance()
        wait = self._charge(asked, now)
        if wait == 0.0:
            self._open_allowance(now)
        return wait

    def wait_for(
        self, tokens: int, *, input_tokens: int | None = None, output_tokens: int | None = None
    ) -> float:
        """Seconds until `reserve` with the same estimate would succeed (0.0: now), charging
        nothing: a Retry-After. The same ValueError as `reserve` for a bad estimate."""
        asked = self._asked(tokens, input_tokens, output_tokens)
        if input_tokens is None and output_tokens is None and self._allowance.holds(tokens):
            return 0.0  # (read without charging and closing it: it stays open)
        now = self._advance()
        return max((budget.wait(amount, now) for budget, amount in asked if amount), default=0.0)

    def target(self, tokens: int, backfill_seconds: float) -> float:
        """When a call of `tokens` held back now is admitted at the latest if lighter calls
        pass it meanwhile (`spare`): the moment it would fit with nothing more charged, plus
        `backfill_seconds` (this budget's clock). The same ValueError as `reserve`."""
        return self._advance() + self.wait_for(tokens) + backfill_seconds

    def spare(self, tokens: int, at: float) -> list[int]:
        """What calls reserved now may take of each budget in all (in budget order) so that
        one of `tokens` still fits at `at` (this budget's clock): each budget's remaining then,
        with nothing more charged, less that call's part; of a provider's reading in force
        then, the same. Refunds meanwhile only add to it; an overrun may take from it."""
        asked = self._asked(tokens, None, None)
        now = self._advance()
        spare = []
        for budget, amount in asked:
            left = budget.meter.remaining_at(max(at, now)) - amount
            word = budget.word_at(now)
            if word is not None and word.reset_at > at:
                left = min(left, word.remaining - word.spent - amount)
            spare.append(left)
        return spare

    def reserve_within(self, tokens: int, spare: list[int]) -> Reservation | float | None:
        """`reserve(tokens)` for a call that passes a held-back one: None (nothing charged)
        unless each budget's part fits what is left of `spare` (`spare()`), which a
        Reservation is then taken from."""
        asked = self._asked(tokens, None, None)
        if any(amount > left for (_, amount), left in zip(asked, spare, strict=True)):
            return None
        taken = self._reserve(asked)
        if isinstance(taken, Reservation):
            for index, (_, amount) in enumerate(asked):
                spare[index] -= amount
        return taken

    def resize(self, budget: BudgetName, per_minute: int) -> None:
        """Make `budget` (configured) `per_minute` a minute from now on; what was charged stays
        charged. ValueError for a budget not configured or a size that is not an int >= 1."""
        target = self._by_name.get(budget)
        if target is None:
            raise ValueError(f"this RateBudget has no {budget} budget to resize")
        target.resize(_size(budget, per_minute), self._advance())
        self._sized()

    def settle(self, reservation: Reservation, usage: Usage | int) -> None:
        """Close `reservation` with what the call used: a `Usage`, or a total of tokens (then
        the input and output budgets keep their estimates). Less than reserved is refunded,
        more charged now (at most one minute's budget: a usage past that is not believed)."""
        actual = used_per_budget(usage)
        self._close(reservation, lambda budget, estimate: actual.get(budget.name, estimate))

    def charge_in_full(self, reservation: Reservation) -> None:
        """Close `reservation` as a call that ended without usage: its estimates stand (so
        nothing is metered anew: only what is reserved goes down)."""
        reservation.closed_by(self, "this RateBudget")
        for budget, estimate in reservation.estimates:
            budget.reserved -= estimate

    def cancel(self, reservation: Reservation) -> None:
        """Close `reservation` as a call never sent: every estimate and its request return."""
        self._close(reservation, lambda _budget, _estimate: 0)

    def report(
        self,
        budget: BudgetName,
        *,
        remaining: int,
        reset_at: float,
        observed_at: float | None = None,
    ) -> None:
        """The provider says `remaining` of `budget` is left until `reset_at` (this budget's
        clock), as observed at `observed_at` (default: now). Ignored for a budget not
        configured, a reset already past, or a reading older than the one in force."""
        remaining = check_count("remaining", remaining)
        now = self._advance()
        observed = now if observed_at is None else observed_at
        target = self._by_name.get(budget)
        if target is None or not (math.isfinite(reset_at) and reset_at > now):
            return
        if not math.isfinite(observed):
            return
        current = target.word_at(now)
        if current is not None and observed < current.observed_at:
            return
        self._epoch += 1
        target.word = ProviderWord(remaining, reset_at, observed, self._epoch)

    def statistics(self) -> RateBudgetStatistics:
        """Every budget now, in plain numbers. Reads only (safe from an exporter's thread)."""
        now = max(self._clock(), self._now)
        # The allowance first, then the meters: read while the loop charges the one into the
        # other, a take may count twice (too little remaining for a moment), never not at all.
        taken_tokens, taken_requests = self._allowance.counted_at(now)
        found: dict[str, BudgetStatistics] = {}
        for b in self._budgets:
            remaining, reported = b.remaining(now)
            remaining = max(
                0, remaining - (taken_requests if b.name == "requests" else taken_tokens)
            )
            found[b.name] = BudgetStatistics(
                b.name, b.limit, remaining, b.reserved, b.refunded_total, reported
            )
        return RateBudgetStatistics(**found)

    def _advance(self) -> float:
        """The clock read (never going back), every meter moved to it: what the allowance
        let go charged first, in the second it was taken in (or, late, in this one)."""
        now = self._clock()
        late = self._charge_allowance(now) if self._allowance.is_open else 0
        if now > self._now:
            self._now = now
            for budget in self._budgets:
                budget.meter.advance(now)
        if late:  # taken after their second may have ended: charged in this one
            for budget in self._budgets:
                budget.meter.charge(late)  # (a token and a request each)
        return self._now

    def _charge_allowance(self, now: float) -> int:
        """Charge every meter what the allowance let go (into its second, still the meters'
        current one: nothing advanced them since it opened) and close it; return its late
        ones (budget_allowance.py), for the second of `now`."""
        allowance = self._allowance
        late = allowance.late_ones(now)
        ones = allowance.ones - late
        tokens, requests = allowance.taken_tokens + ones, allowance.taken_requests + ones
        if requests:
            for budget in self._budgets:
                budget.meter.charge(requests if budget.name == "requests" else tokens)
        allowance.close()
        return late

    def _open_allowance(self, now: float) -> None:
        """A sliding budget with no provider's word in force: let calls charged in full take
        what every meter holds now until the current second ends (budget_allowance.py)."""
        if self.shape != "sliding":
            return
        tokens = requests = sys.maxsize  # a budget not configured allows anything
        for budget in self._budgets:
            if budget.word_at(now) is not None:
                return
            room = max(0, budget.meter.remaining_at(now))
            if budget.name == "requests":
                requests = room
            else:
                tokens = min(tokens, room)
        self._allowance.open(tokens, requests, slot_start(slot_of(now) + 1), now, self._ones_share)

    def _reserve(self, asked: tuple[tuple[MeteredBudget, int], ...]) -> Reservation | float:
        """`reserve()` of what `_asked` made of its arguments."""
        now = self._advance()
        wait = self._charge(asked, now)
        if wait > 0.0:
            return wait
        for budget, amount in asked:
            budget.reserved += amount
        self._open_allowance(now)
        return Reservation(self, asked, now, self._epoch)

    def _allowed(self, tokens: int) -> Reservation:
        """The Reservation of `tokens` and a request that the allowance took, made in its
        second (at the time it opened: a refund goes back to that second)."""
        asked = self._ones if tokens == 1 else self._whole(tokens)
        for budget, amount in asked:
            budget.reserved += amount
        return Reservation(self, asked, self._now, self._epoch)

    def _whole(self, tokens: int) -> tuple[tuple[MeteredBudget, int], ...]:
        """`tokens` asked of each budget (1 of `requests`)."""
        return tuple([(b, 1 if b.name == "requests" else tokens) for b in self._budgets])

    def _charge(self, asked: tuple[tuple[MeteredBudget, int], ...], now: float) -> float:
        """Charge every budget its part of `asked` at `now` (0.0), or none if one cannot hold
        it: the seconds until all would."""
        wait = 0.0
        for budget, amount in asked:
            if amount:
                wait = max(wait, budget.wait(amount, now))
        if wait > 0.0:
            return wait
        for budget, amount in asked:
            budget.meter.charge(amount)
            word = budget.word_at(now)
            if word is not None:
                word.spent += amount
        return 0.0

    def _asked(
        self, tokens: int, input_tokens: int | None, output_tokens: int | None
    ) -> tuple[tuple[MeteredBudget, int], ...]:
        tokens = check_count("tokens", tokens)
        if input_tokens is None and output_tokens is None:  # the whole estimate to each
            asked = self._ones if tokens == 1 else self._whole(tokens)
        else:
            given = {"input_tokens": input_tokens, "output_tokens": output_tokens}
            split: dict[str, int] = {"tokens": tokens, "requests": 1}
            for name, value in given.items():
                split[name] = tokens if value is None else check_count(name, value)
            asked = tuple([(b, split[b.name]) for b in self._budgets])
        for budget, amount in asked:
            if amount > budget.limit:
                raise ValueError(
                    f"an estimate of {amount} {budget.name} is more than "
                    f"{budget.name}_per_minute={budget.limit}: it could never be admitted "
                    "(cap the estimate at the budget)"
                )
        return asked

    def _close(self, reservation: Reservation, used: Callable[[MeteredBudget, int], int]) -> None:
        reservation.closed_by(self, "this RateBudget")
        allowance = self._allowance
        keep = allowance.current()  # the meters stay in its second: it need not close
        now = self._now if keep else self._advance()
        for budget, estimate in reservation.estimates:
            actual = min(used(budget, estimate), budget.limit)
            budget.reserved -= estimate
            if actual < estimate:
                budget.meter.refund(estimate - actual, reservation.at)
                budget.refunded_total += estimate - actual
            elif actual > estimate:
                budget.meter.charge(actual - estimate)
                if keep and budget.name != "requests":
                    allowance.shrink(actual - estimate)
            word = budget.word_at(now)
            if word is not None and reservation.epoch >= word.epoch:
                word.spent += actual - estimate


def _size(name: BudgetName, size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{name}_per_minute must be an int >= 1, not {size!r}")
    return size


def used_per_budget(usage: Usage | int) -> dict[BudgetName, int]:
    """What a call used of each token budget: a `Usage`'s three counts, or a total of tokens
    (the input and output budgets then keep their estimates). ValueError for a bad total."""
    if isinstance(usage, Usage):
        return {
            "tokens": usage.total,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
        }
    return {"tokens": check_count("usage", usage)}


def check_count(what: str, value: int) -> int:
    """`value` if it is an int >= 0, else ValueError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an int >= 0, not {value!r}")
    return value
