"""A shared limit's rate budgets: a RateBudget's sizes kept in Redis for every process that
shares the limit, reserved with the slot in the same script call (lua/budget.lua).

`SharedBudget` is what `SharedLimit.shared_budget` is: the same calls as a RateBudget's for
what happens after an admission (`settle`, `charge_in_full`, `cancel`, `report`,
`statistics`), on the reservations the limit hands out with its slots (`SharedReservation`,
a BudgetReservation: closed by its own `settle`, `charge_in_full` or `cancel` too, as a
RateBudget's `Reservation` is). Settlements and
provider readings are not calls of their own: they ride on this process's next script call
(a release's, an admission's, or the heartbeat's), so a settled admission still costs one
call for its slot and one for its release. The figures read at export are plain numbers from
the newest answer: no Redis call.

Only the sliding window (`shape="sliding"`) is kept in Redis: one-second slots, a charge
counted 60 to 61 s, a refund taken back from the second charged, an overrun charged now, as
rate_window.py does in a process. Redis's clock meters the minute for every process.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final

from ...usage import Usage
from ..limit import UpstreamCapacityError
from ..rate_budget import (
    BUDGETS,
    BudgetName,
    BudgetStatistics,
    OwnedReservation,
    RateBudget,
    RateBudgetStatistics,
    check_count,
    used_per_budget,
)
from ._replies import BudgetReading

__all__ = ["CODES", "SharedBudget", "SharedReservation"]

CODES: Final[dict[BudgetName, str]] = {
    "tokens": "t", "requests": "r", "input_tokens": "i", "output_tokens": "o",
}  # fmt: skip
_TOKEN_BUDGETS: Final = ("tokens", "input_tokens", "output_tokens")
_SIGHTINGS: Final = 64  # estimates whose wait is kept (estimates vary with each request)


class SharedReservation(OwnedReservation):
    """What one admission of a budgeted shared limit took (an OwnedReservation): an
    estimate on each budget, charged in Redis second `ref` (or, `g<id>`, the second its
    grant recorded). A BudgetReservation."""

    __slots__ = ("estimates", "ref")

    def __init__(
        self, owner: SharedBudget, estimates: tuple[tuple[BudgetName, int], ...], ref: str
    ) -> None:
        super().__init__(owner)
        self.estimates = estimates
        self.ref = ref

    def named(self) -> Iterator[tuple[BudgetName, int]]:
        return iter(self.estimates)


class SharedBudget:
    """A RateBudget's sizes, kept for every process of one shared limit in Redis.

    `wake()` asks for a script call soon (a settlement or reading waits for one). The counts
    `reserved` (estimates of this process's calls not settled yet) and `refunded_total`
    (given back here) are this process's; `remaining` and the provider's reading are the
    limit's, across processes, as last seen. `backfill_seconds` goes with the sizes: how much
    later than the budgets alone would take it the oldest waiter may be admitted, so that
    lighter waiters pass it meanwhile (0: never; lua/budget.lua, `budget_room`)."""

    def __init__(
        self, budget: RateBudget, backfill_seconds: float = 0.0, *, wake: Callable[[], None]
    ) -> None:
        if budget.shape != "sliding":
            raise ValueError(
                f"a global limit's budget must be shape='sliding' (a window of the last "
                f"minute kept in Redis); shape={budget.shape!r} is kept only in a process"
            )
        self.limits: dict[BudgetName, int] = budget.limits
        self.shape = budget.shape
        self.backfill_seconds = backfill_seconds
        sizes = [self.limits.get(name, 0) for name in BUDGETS]
        self._spec = ",".join(str(n) for n in [*sizes, round(backfill_seconds * 1000)])
        self._token_cap = min(
            (size for name, size in self.limits.items() if name in _TOKEN_BUDGETS),
            default=None,
        )
        self._wake = wake
        self._lock = threading.Lock()  # the ops: the event loop and the heartbeat thread
        self._ops: list[str] = []  # settlements and readings not sent yet
        self._batches: list[str] = []  # batches a call that failed gave back, oldest first
        self._batch_ids = itertools.count(1)
        self._reserved = dict.fromkeys(self.limits, 0)
        self._refunded = dict.fromkeys(self.limits, 0)
        self._remaining = dict(self.limits)
        self._reported: dict[BudgetName, int] = {}
        self._blocked_until = -math.inf  # (monotonic) the waiter chosen next waits till then
        self._fits_at: dict[int, float] = {}  # estimate -> when it fits alone (monotonic)

    # --- what the scripts carry and answer ---------------------------------------------

    def argument(self, sending: bool) -> str:
        """The scripts' budget argument: the sizes, then (`sending`: Redis answers) the
        batches of settlements and readings waiting, taken. Each batch carries an id, and
        Redis applies a batch once whichever call carries it (lua/budget.lua), so a call
        that failed, whether or not it ran, gives its batches back (`give_back`)."""
        if not sending or not (self._ops or self._batches):
            return self._spec
        with self._lock:
            batches, self._batches = self._batches, []
            if self._ops:
                batches.append(f"#{next(self._batch_ids)};{';'.join(self._ops)}")
                self._ops = []
        return f"{self._spec}|{';'.join(batches)}"

    def give_back(self, argument: str) -> None:
        """A call that carried `argument` failed (it may have run, or never reached Redis):
        its batches go with a later call, ahead of those taken since."""
        batches = argument.partition("|")[2]
        if batches:
            with self._lock:
                self._batches.insert(0, batches)

    @property
    def pending(self) -> bool:
        """True while settlements or readings wait for a script call."""
        return bool(self._ops or self._batches)

    def seen(self, reading: BudgetReading | None) -> None:
        """The newest answer's figures (called under the store's lock, newest first)."""
        if reading is None:
            return
        for name in self.limits:
            code = CODES[name]
            self._remaining[name] = reading.remaining.get(code, self._remaining[name])
            if code in reading.reported:
                self._reported[name] = reading.reported[code]
            else:
                self._reported.pop(name, None)
        blocked = reading.blocked_ms
        self._blocked_until = time.monotonic() + blocked / 1000 if blocked >= 0 else -math.inf

    def blocking(self) -> float | None:
        """Seconds the waiter chosen next still waits for the budgets, as last seen (None:
        it does not, or none waits)."""
        left = self._blocked_until - time.monotonic()
        return left if left > 0 else None

    def fits_in(self, estimate: int, wait_ms: int) -> None:
        """Redis said an estimate of `estimate` alone fits the budgets in `wait_ms` (the
        acquire script's wait for a waiter it queued): kept for `wait()`, the newest winning."""
        now = time.monotonic()
        kept = self._fits_at
        kept.pop(estimate, None)  # (re-inserted: the newest sighting is the last to go)
        for old in [old for old, at in kept.items() if at <= now]:
            del kept[old]  # past: they say nothing now
        if len(kept) >= _SIGHTINGS:
            del kept[next(iter(kept))]
        kept[estimate] = now + wait_ms / 1000

    def refusal(self, describe: str, tokens: int) -> UpstreamCapacityError:
        """The error of a call of `tokens` the budgets did not hold within its wait: when they
        hold it is as last seen (what Redis said of its estimate, and of the waiter chosen
        next)."""
        wait = self.wait(tokens)
        when = "not known yet" if wait is None else f"in {wait:.3f} s"
        message = (
            f"{describe}: the rate budget could not hold {tokens} tokens within the wait "
            f"allowed (it holds them {when})"
        )
        return UpstreamCapacityError(message, "budget", wait)

    def wait(self, tokens: int) -> float | None:
        """Seconds until the budgets would hold an estimate of `tokens` (capped as admission
        caps it), as last seen (no Redis call): what Redis last said of that estimate, unless
        the newest answer has room for it now, and never before the waiter chosen next is
        served (none passes it). None if not known."""
        estimate = self.estimate(tokens)[0]
        head = self.blocking()
        if self._room_for(estimate):
            own: float | None = 0.0
        else:
            at = self._fits_at.get(estimate)
            own = None if at is None else max(0.0, at - time.monotonic())
        if own is None:
            return head
        return own if head is None else max(own, head)

    def _room_for(self, estimate: int) -> bool:
        """True if the newest answer's `remaining` holds `estimate` (and one request)."""
        return all(
            self._remaining[name] >= (1 if name == "requests" else min(estimate, size))
            for name, size in self.limits.items()
        )

    # --- reservations --------------------------------------------------------------

    def estimate(self, tokens: int) -> tuple[int, bool]:
        """`tokens` as a waiter's id carries it: capped at the smallest token budget's
        minute (no waiter waits forever); and True if it was capped."""
        cap = self._token_cap
        if cap is not None and tokens > cap:
            return cap, True
        return tokens, False

    def reserved(self, tokens: int, ref: str) -> SharedReservation:
        """The reservation an admission of `tokens` took in Redis (`ref`: where charged)."""
        estimates = tuple(
            (name, 1 if name == "requests" else min(tokens, size))
            for name, size in self.limits.items()
        )
        for name, amount in estimates:
            self._reserved[name] += amount
        return SharedReservation(self, estimates, ref)

    def unused(self, tokens: int, ref: str) -> None:
        """An estimate of `tokens` charged at `ref` for a waiter that had ended: returned."""
        deltas = (
            -1 if name == "requests" else -min(tokens, self.limits[name]) if name in self.limits
            else 0
            for name in BUDGETS
        )  # fmt: skip
        self._send(f"{ref}={','.join(map(str, deltas))}")

    def settle(self, reservation: SharedReservation, usage: Usage | int) -> None:
        """Close `reservation` with what the call used (a `Usage`, or a total of tokens: the
        input and output budgets then keep their estimates): less than reserved is refunded
        to the second charged, more charged now (at most one minute's budget)."""
        actual = used_per_budget(usage)
        self._close(reservation, lambda name, estimate: actual.get(name, estimate))

    def charge_in_full(self, reservation: SharedReservation) -> None:
        """Close `reservation` as a call that ended without usage: its estimates stand."""
        self._close(reservation, lambda _name, estimate: estimate)

    def cancel(self, reservation: SharedReservation) -> None:
        """Close `reservation` as a call never sent: every estimate and its request return."""
        self._close(reservation, lambda _name, _estimate: 0)

    def _close(
        self, reservation: SharedReservation, used: Callable[[BudgetName, int], int]
    ) -> None:
        reservation.closed_by(self, "this limit's budget")
        deltas = dict.fromkeys(BUDGETS, 0)
        for name, estimate in reservation.estimates:
            spent = min(used(name, estimate), self.limits[name])
            self._reserved[name] -= estimate
            if spent < estimate:
                self._refunded[name] += estimate - spent
            deltas[name] = spent - estimate
        if any(deltas.values()):
            self._send(f"{reservation.ref}={','.join(str(deltas[n]) for n in BUDGETS)}")

    def report(
        self,
        budget: BudgetName,
        *,
        remaining: int,
        reset_at: float,
        observed_at: float | None = None,
    ) -> None:
        """The provider says `remaining` of `budget` is left until `reset_at` (time.monotonic,
        the event loop's clock), as observed at `observed_at` (default: now): shared with
        every process, the freshest reading (by when it was observed) winning. Ignored for a
        budget not configured or a reset already past."""
        remaining = check_count("remaining", remaining)
        now = time.monotonic()
        observed = now if observed_at is None else observed_at
        if budget not in self.limits or not (math.isfinite(reset_at) and reset_at > now):
            return
        if not math.isfinite(observed):
            return
        reset_ms = math.ceil((reset_at - now) * 1000)
        age_ms = max(0, round((now - observed) * 1000))
        self._send(f"!{CODES[budget]}={remaining},{reset_ms},{age_ms}")

    def _send(self, op: str) -> None:
        with self._lock:
            self._ops.append(op)
        self._wake()

    # --- read at export --------------------------------------------------------------

    def statistics(self) -> RateBudgetStatistics:
        """Every budget as last seen, in plain numbers (no Redis call)."""
        found = {
            name: BudgetStatistics(
                name,
                size,
                self._remaining[name],
                self._reserved[name],
                self._refunded[name],
                self._reported.get(name),
            )
            for name, size in self.limits.items()
        }
        return RateBudgetStatistics(**found)
