"""Bounded backfill, the opt-in side of MeteredSemaphore's fair queuing (`backfill_seconds`).

Without it, the waiter chosen next is never passed: capacity that frees is held for it until
its weight fits, even while lighter waiters that would fit wait behind it (head-of-line
blocking; on a limit in tokens, about E[w²] / (2 E[w]) of the capacity sits idle).

With `backfill_seconds` > 0, while the chosen waiter does not fit and has been blocked for
less than `backfill_seconds` (loop time, from the moment it was first held for), the first
`BACKFILL_SCAN` other waiters in arrival order are admitted past it, oldest first, each one
that fits in what is free. Once it has been blocked that long, capacity is held for it as
without backfill. Its wait grows by at most `backfill_seconds` plus the longest hold of a
waiter admitted past it: bounded, so no starvation. The choice of the next waiter is the fair
one either way; backfill only decides who may use capacity the chosen one cannot.

A chosen waiter that only its rate budget holds back is passed by another rule, which bounds
its wait exactly (upstream.py, `UpstreamGate.spare_for`): lighter waiters behind it (`others`)
are admitted while they leave it room at its target, `backfill_seconds` after the moment the
budget alone would have taken it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from itertools import islice

from .limit import Admission

__all__ = ["BACKFILL_SCAN", "Backfill", "check_backfill_seconds", "others"]

BACKFILL_SCAN = 32
"""How many waiters (besides the blocked one, oldest first) one backfill looks at."""

Waiter = asyncio.Future[Admission]


def check_backfill_seconds(owner: str, value: object) -> float:
    """`value` as seconds: TypeError unless a number, ValueError unless >= 0 and finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner} backfill_seconds must be a number of seconds, got {value!r}")
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{owner} backfill_seconds must be >= 0 and finite, got {value}")
    return float(value)


class Backfill:
    """How long the waiter chosen next may be passed (`seconds`, > 0), and since when it has
    been blocked (the wait queue holds one; the semaphore admits those that fit)."""

    __slots__ = ("_blocked_at", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._blocked_at = 0.0  # loop time the chosen waiter was first held for

    def passers(self, waiters: Iterable[Waiter], chosen: Waiter, fresh: bool) -> list[Waiter]:
        """The waiters that may pass `chosen` now (`fresh`: it was chosen just now): the first
        BACKFILL_SCAN others of `waiters` (arrival order) while it has been blocked for less
        than `seconds`; none once it has been blocked that long."""
        now = chosen.get_loop().time()
        if fresh:
            self._blocked_at = now
        elif now - self._blocked_at >= self.seconds:
            return []  # its time is up: capacity is held for it from now on
        return others(waiters, chosen)


def others(waiters: Iterable[Waiter], chosen: Waiter) -> list[Waiter]:
    """The first BACKFILL_SCAN of `waiters` (arrival order) but `chosen`."""
    found = (w for w in list(islice(waiters, BACKFILL_SCAN + 1)) if w is not chosen)
    return list(islice(found, BACKFILL_SCAN))
