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

from .drain import DrainRate
from .limit import Admission

__all__ = ["OwnDeadlines", "check_deadline"]

Waiter = asyncio.Future[Admission]
_WARM_UP_SECONDS = 2.0  # DrainRate reads the last whole second and the current one


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

    __slots__ = ("_busy_since", "_rate", "timers")

    def __init__(self) -> None:
        self.timers: dict[Waiter, asyncio.TimerHandle] = {}
        self._rate = DrainRate(low=0)
        # Hand-overs happen only while waiters queue: the rate means something once its whole
        # window (the last full second and this one) lies within one stretch of queueing.
        self._busy_since = perf_counter()

    def queue_started(self) -> None:
        """The limit's queue was empty and has a waiter again: a new stretch of queueing."""
        self._busy_since = perf_counter()

    def arm(self, waiter: Waiter, seconds: float, expire: Callable[[Waiter], None]) -> None:
        """Call `expire(waiter)` in `seconds` unless `disarm(waiter)` runs first."""
        loop = asyncio.get_running_loop()
        self.timers[waiter] = loop.call_later(seconds, expire, waiter)

    def disarm(self, waiter: Waiter) -> None:
        """`waiter` left the queue: its timer is not needed any more."""
        handle = self.timers.pop(waiter, None)
        if handle is not None:
            handle.cancel()

    def handed(self, weight: int) -> None:
        """Count `weight` handed to a waiter now."""
        self._rate.release(perf_counter(), weight)

    def hopeless(self, ahead: int, seconds: float) -> bool:
        """True if `ahead` weight (the waiter's own included) cannot be handed out within
        `seconds` at the measured rate; never before the queue has stood for two seconds."""
        if seconds <= 0:
            return True
        now = perf_counter()
        if now - self._busy_since < _WARM_UP_SECONDS:
            return False
        rate = self._rate.per_second(now)
        return rate > 0 and ahead / rate > seconds
