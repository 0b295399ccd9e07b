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
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Hashable
from itertools import islice

from .flows import Ask, FlowQueues, Waiting
from .limit import Admission

__all__ = ["BACKFILL_SCAN", "BackfillMixin", "check_backfill_seconds"]

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


class BackfillMixin:
    """The backfill side of MeteredSemaphore (its state is the semaphore's own)."""

    _backfill_seconds: float
    _backfilled: int
    _blocked_at: float  # loop time the chosen waiter was first held for
    _flows: FlowQueues
    _queue: OrderedDict[Waiter, float | None]
    _asks: dict[Waiter, Ask]
    _limit: int
    _active: int

    def _hand(self, waiter: Waiter, weight: int, flow: Hashable) -> bool:
        raise NotImplementedError

    @property
    def backfill_seconds(self) -> float:
        """How long the waiter chosen next may be passed by lighter ones that fit (0: never)."""
        return self._backfill_seconds

    @property
    def admission_backfilled(self) -> int:
        """Waiters admitted past a blocked waiter chosen before them (monotonic)."""
        return self._backfilled

    def _backfill(self, chosen: Waiting, fresh: bool) -> None:
        """`chosen` does not fit (`fresh`: it was chosen just now): while it has been blocked
        for less than `backfill_seconds`, admit the waiters behind it that fit."""
        now = chosen.waiter.get_loop().time()
        if fresh:
            self._blocked_at = now
        elif now - self._blocked_at >= self._backfill_seconds:
            return  # its time is up: capacity is held for it from now on
        if self._active >= self._limit:
            return
        others = (w for w in list(islice(self._queue, BACKFILL_SCAN + 1)) if w is not chosen.waiter)
        for waiter in islice(others, BACKFILL_SCAN):
            weight, flow = self._asks[waiter]
            if self._active + weight > self._limit:
                continue
            if self._hand(waiter, weight, flow):
                self._backfilled += 1
                # Maybe not its flow's head: its flow's place in the fair order moved.
                self._flows.touched(flow)
                if self._active >= self._limit:
                    return
