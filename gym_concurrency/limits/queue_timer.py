"""The one timer of a limit's timeout. Every waiter waits at most the same `timeout`, so their
due times are in queue order: one timer, armed for the oldest waiter, serves them all.

When it fires it hands the owner the moment to judge by (`expire(now)`: the loop's time plus
the clock's resolution, as the loop itself decides a timer is due), and arms itself again for
the oldest waiter left (`next_due()`); if expiring raised, no sooner than `_RETRY_SECONDS`
from then. It owns only its handle; the limit ends the waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["QueueTimer"]

_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution
_RETRY_SECONDS = 0.1  # after expiring raised, the soonest it fires again


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
        now, failed = loop.time(), True
        try:
            self._expire(now + _CLOCK_RESOLUTION)
            failed = False
        finally:  # armed again even if expiring raised: the waiters left must still time out
            due = self._next_due()
            if due is not None and self._handle is None:
                # After a failure, not at once: a fault that lasts must not spin the loop.
                due = max(due, now + _RETRY_SECONDS) if failed else due
                self._handle = loop.call_at(due, self._fire)
