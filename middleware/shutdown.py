"""Draining on shutdown: the server's SIGTERM / SIGINT handler (uvicorn's, gunicorn's worker's)
chained, so the middleware drains the moment the signal arrives, before the server starts
waiting for open connections; and the wait for admitted requests at lifespan shutdown.

Signal handlers can only be set from the main thread, and only a handler the server installed
is chained (with Python's default one in place, the signal ends the process at once anyway).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from gym_concurrency.limits import Limit

__all__ = ["ShutdownSignals", "wait_idle"]

_log = logging.getLogger("gym_concurrency.middleware")
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_POLL_SECONDS = 0.01

Handler = Callable[[int, FrameType | None], Any]


class ShutdownSignals:
    """Calls `on_signal` on `loop` when SIGTERM or SIGINT arrives, after the server's own
    handler; `restore()` puts the server's handlers back."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_signal: Callable[[], object]) -> None:
        self._loop = loop
        self._on_signal = on_signal
        self._previous: dict[int, Handler] = {}

    def install(self) -> bool:
        """Chain the server's handlers; False where that cannot be done (not the main thread,
        or no server handler to chain)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in _SIGNALS:
            previous = signal.getsignal(sig)
            if callable(previous):
                self._previous[sig] = previous
                signal.signal(sig, self._handle)
        return bool(self._previous)

    def restore(self) -> None:
        """Put back each handler this replaced, unless someone replaced ours since."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        previous = self._previous.get(sig)
        try:
            if previous is not None:
                previous(sig, frame)
        finally:
            if not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._on_signal)


async def wait_idle(limits: Iterable[Limit], seconds: float) -> bool:
    """Wait until no request holds any of `limits` (this process's share), at most `seconds`;
    True if they all went idle."""
    limits = list(limits)
    deadline = time.monotonic() + seconds
    while any(limit.active for limit in limits):
        if time.monotonic() >= deadline:
            busy = {str(limit.limit_name): limit.active for limit in limits if limit.active}
            _log.warning(
                "gym_concurrency: drain timed out after %g s with requests still running: %s",
                seconds,
                busy,
            )
            return False
        await asyncio.sleep(_POLL_SECONDS)
    return True
