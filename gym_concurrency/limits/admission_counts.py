"""How a limit's failed and capped admissions ended, counted: one small part that owns the
counts (each written by one of its methods), held by whichever object counts them and read
by the limit's `admission_*` properties and its statistics."""

from __future__ import annotations

import logging

__all__ = ["AdmissionCounts"]

_log = logging.getLogger("gym_concurrency.limits")


class AdmissionCounts:
    """Monotonic counts of waits that timed out (a waiter's own deadline too), were cancelled
    or were shed, and of waiters admitted at less weight than they asked (`capped`); each
    failed admission is counted once, by whichever path ended it."""

    __slots__ = ("cancelled", "capped", "shed", "timeouts")

    def __init__(self) -> None:
        self.timeouts = 0
        self.cancelled = 0
        self.shed = 0
        self.capped = 0

    def timed_out(self) -> None:
        """A wait ended by the limit's timeout or the waiter's own deadline."""
        self.timeouts += 1

    def cancel(self, count: int = 1) -> None:
        """`count` waits (0 or 1) cancelled, or left by their tasks."""
        self.cancelled += count

    def shed_one(self) -> None:
        """An admission refused at once: the queue was full."""
        self.shed += 1

    def cap(self, describe: str, asked: int, granted: int) -> None:
        """A waiter that asked `asked` was admitted at `granted`, the limit's size now: counted,
        and the first of the limit (`describe`) logged."""
        if not self.capped:
            _log.warning(
                "gym_concurrency: %s: a waiter asking for weight %d was admitted at %d, the "
                "size the limit shrank to under it (counted in admission_capped, and logged "
                "only this once)",
                describe,
                asked,
                granted,
            )
        self.capped += 1
