"""How a limit's failed and capped admissions ended, counted: one small part that owns the
counts (each written by one of its methods), held by whichever object counts them and read
by the limit's `admission_*` properties and its statistics."""

from __future__ import annotations

import logging

__all__ = ["AdmissionCounts"]

_log = logging.getLogger("gym_concurrency.limits")


class AdmissionCounts:
    """Monotonic counts of waits that timed out (a waiter's own deadline, a rate budget or an
    engine signal too), were cancelled or were shed, and of waiters admitted at less than they
    asked (`capped`); each failed admission is counted once, by whichever path ended it."""

    __slots__ = ("cancelled", "capped", "over_budget", "saturated", "shed", "timeouts")

    def __init__(self) -> None:
        self.timeouts = 0
        self.cancelled = 0
        self.shed = 0
        self.capped = 0
        self.over_budget = 0  # refusals "budget" (counted in `timeouts` too)
        self.saturated = 0  # refusals "saturated" (counted in `timeouts` too)

    def timed_out(self, refusal: str = "timeout") -> None:
        """A wait ended by the limit's timeout, the waiter's own deadline, or (`refusal`
        "budget" / "saturated") an upstream that could not take it in time."""
        self.timeouts += 1
        self.over_budget += refusal == "budget"
        self.saturated += refusal == "saturated"

    def cancel(self, count: int = 1) -> None:
        """`count` waits (0 or 1) cancelled, or left by their tasks."""
        self.cancelled += count

    def shed_one(self) -> None:
        """An admission refused at once: the queue was full."""
        self.shed += 1

    def cap(self, describe: str, asked: int, granted: int, what: str = "") -> None:
        """A waiter that asked `asked` was admitted at `granted`, the limit's size now (`what`:
        else, as "an estimate of tokens" over a budget's minute): counted, and the first of
        the limit (`describe`) logged."""
        if not self.capped:
            if what:
                why = f"{what} {asked} was capped at {granted}, what its budget holds a minute"
            else:
                why = f"a waiter asking for weight {asked} was admitted at {granted}, the size "
                why += "the limit shrank to under it"
            _log.warning(
                "gym_concurrency: %s: %s (counted in admission_capped, and logged only this once)",
                describe,
                why,
            )
        self.capped += 1
