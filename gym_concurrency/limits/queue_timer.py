"""The one timer of a limit's timeout. Every waiter waits at most the same `timeout`, so their
due times are in queue order: one timer, armed for the oldest waiter, serves them all.

When it fires it hands the owner the moment to judge by (`expire(now)`: the loop's time plus
the clock's resolution, as the loop itself decides a timer is due), and arms itself again for
the oldest waiter left (`next_due()`). It owns only its handle; the limit ends the waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["QueueTimer"]

_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution


class QueueTimer:
    """Calls `expire(now)` when the oldest waiter's timeout is due (see the module)."""

    __slots__ = ("_expire", "_handle", "_next_due")

    def __init__(
        self, expire: Callable[[float], None], next_due: Callable[[], float | None]
    ) -> None:
        self._expire = expire
        self._next_due = next_due
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        """Fire at `due` (loop time) unless armed already (for an older waiter, due sooner)."""
        if self._handle is None:
            self._handle = loop.call_at(due, self._fire)

    def _fire(self) -> None:
        self._handle = None
        loop = asyncio.get_running_loop()
        try:
            self._expire(loop.time() + _CLOCK_RESOLUTION)
        finally:  # armed again even if expiring raised: the waiters left must still time out
            due = self._next_due()
            if due is not None and self._handle is None:
                self._handle = loop.call_at(due, self._fire)
