"""Waiters with a deadline of their own (`acquire(..., deadline=)`): a timer each, and the
limit's measured hand-over rate, which says when a newcomer cannot be admitted in time.

Nothing here runs until a waiter brings a deadline: a limit whose callers bring none pays
one empty-dict check per hand-over.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from time import perf_counter

from .handover_rate import HandoverRate
from .limit import Admission

__all__ = ["OwnDeadlines", "check_deadline"]

Waiter = asyncio.Future[Admission]
_WARM_UP_SECONDS = 2.0  # HandoverRate reads the last whole second and the current one
_IDLE_SECONDS = 1.0  # no hand-over for this long: a queue forming now starts a new stretch


def check_deadline(owner: str, deadline: object) -> float:
    """`deadline` (seconds from now) as a float; TypeError / ValueError naming it otherwise.
    Zero or less is allowed: already past."""
    if isinstance(deadline, bool) or not isinstance(deadline, int | float):
        raise TypeError(f"{owner} deadline must be a number of seconds, got {deadline!r}")
    if math.isnan(deadline):
        raise ValueError(f"{owner} deadline must be a number of seconds, got nan")
    return float(deadline)


class OwnDeadlines:
    """The timers of waiters that have a deadline sooner than the limit's timeout, and how
    fast the limit hands weight to waiters (per second, over the last second or two)."""

    __slots__ = ("_busy_since", "_due", "_last_handed", "_rate", "timers")

    def __init__(self) -> None:
        self.timers: dict[Waiter, asyncio.TimerHandle] = {}
        # When each armed waiter is due, on a clock read fresh (uvloop's loop.time() is read
        # once per loop iteration): a hand-over checks it, in case the loop ran late.
        self._due: dict[Waiter, float] = {}
        self._rate = HandoverRate(low=0)
        # Hand-overs happen only while waiters queue: the rate means something once its whole
        # window (the last full second and this one) lies within one stretch of queueing.
        self._busy_since = perf_counter()
        self._last_handed = -math.inf

    def queue_started(self) -> None:
        """The limit's queue was empty and has a waiter again: a new stretch of queueing,
        unless hand-overs went on until a moment ago (a queue emptied by one batch of
        releases and filled again by the next is one stretch)."""
        now = perf_counter()
        if now - self._last_handed > _IDLE_SECONDS:
            self._busy_since = now

    def arm(self, waiter: Waiter, seconds: float, expire: Callable[[Waiter], None]) -> None:
        """Call `expire(waiter)` in `seconds` unless `disarm(waiter)` runs first."""
        loop = asyncio.get_running_loop()
        self.timers[waiter] = loop.call_later(seconds, expire, waiter)
        self._due[waiter] = perf_counter() + seconds

    def disarm(self, waiter: Waiter) -> bool:
        """`waiter` left the queue: its timer is not needed any more. True if it was already
        due (the loop ran late and its timer has not fired): not to be admitted."""
        handle = self.timers.pop(waiter, None)
        if handle is None:
            return False
        handle.cancel()
        return self._due.pop(waiter) <= perf_counter()

    def late(self, waiter: Waiter) -> bool:
        """True if `waiter` has a deadline of its own that has passed."""
        due = self._due.get(waiter)
        return due is not None and due <= perf_counter()

    def handed(self, weight: int) -> None:
        """Count `weight` handed to a waiter now."""
        now = self._last_handed = perf_counter()
        self._rate.release(now, weight)

    def bound(self, seconds: float, limit: int) -> float:
        """The latest (seconds from now) a waiter with `seconds` left may be admitted and
        still finish in time: less the mean hold of a unit of weight (`limit` / rate, Little's
        law, the limit being full while a queue stands), once the rate is trusted."""
        rate = self._trusted_rate()
        return seconds if rate is None else seconds - limit / rate

    def hopeless(self, ahead: int, bound: float) -> bool:
        """True if a waiter may be admitted no later than `bound` (see `bound()`) but `ahead`
        weight (its own included) cannot be handed out by then at the measured rate."""
        if bound <= 0:
            return True
        rate = self._trusted_rate()
        return rate is not None and ahead / rate > bound

    def clears_in(self, weight: int) -> float | None:
        """Seconds the measured rate takes to hand out `weight`; None while it is not trusted."""
        rate = self._trusted_rate()
        return None if rate is None else weight / rate

    def _trusted_rate(self) -> float | None:
        """Weight handed out per second; None before the queue has stood for two seconds
        (hand-overs happen only while waiters queue) or with none measured."""
        now = perf_counter()
        if now - self._busy_since < _WARM_UP_SECONDS:
            return None
        rate = self._rate.per_second(now)
        return rate if rate > 0 else None
