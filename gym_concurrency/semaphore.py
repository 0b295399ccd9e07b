"""MeteredSemaphore: an asyncio.BoundedSemaphore that counts its state in plain integers."""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from typing import Literal

from . import observer

__all__ = ["MeteredSemaphore", "QueueFullError"]


class QueueFullError(Exception):
    """Raised by `MeteredSemaphore.acquire()` when `max_queue` tasks are already waiting."""


class MeteredSemaphore(asyncio.BoundedSemaphore):
    """A FIFO bounded semaphore whose limit, holders, waiters and failed admissions are readable.

    `timeout` bounds the wait inside `acquire()` (expiry raises TimeoutError); `max_queue`
    bounds the waiters (a full queue raises QueueFullError at once). Acquire and release
    make no telemetry call: the observer reads these integers at export.
    """

    def __init__(
        self,
        value: int = 1,
        *,
        component: str | None = None,
        limit_name: str | None = None,
        server: str | None = None,
        timeout: float | None = None,
        max_queue: int | None = None,
    ) -> None:
        _check_value(value)
        _check_timeout(timeout)
        _check_max_queue(max_queue)
        super().__init__(value)
        self._limit = value
        self._active = 0  # slots held, including ones handed to a waiter not yet resumed
        # Pending waiters in arrival order; OrderedDict gives O(1) removal from the middle.
        self._queue: OrderedDict[asyncio.Future[bool], None] = OrderedDict()
        self._timeout = timeout
        self._max_queue = max_queue
        self._timeouts = 0
        self._cancelled = 0
        self._shed = 0
        self._component = component
        self._limit_name = limit_name
        self._server = server
        if component is not None and limit_name is not None:
            observer.register(self)

    # --- state -----------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The number of slots."""
        return self._limit

    @property
    def active(self) -> int:
        """Slots held now."""
        return self._active

    @property
    def available(self) -> int:
        """Slots free now: `limit - active`."""
        return self._limit - self._active

    @property
    def queue_depth(self) -> int:
        """Tasks waiting for a slot now."""
        return len(self._queue)

    @property
    def admission_timeouts(self) -> int:
        """Acquires that gave up after `timeout` seconds (monotonic)."""
        return self._timeouts

    @property
    def admission_cancelled(self) -> int:
        """Acquires cancelled while waiting (monotonic)."""
        return self._cancelled

    @property
    def admission_shed(self) -> int:
        """Acquires refused at once because the queue was full (monotonic)."""
        return self._shed

    @property
    def timeout(self) -> float | None:
        """Seconds an acquire may wait, or None to wait forever."""
        return self._timeout

    @property
    def max_queue(self) -> int | None:
        """How many tasks may wait at once, or None for no bound."""
        return self._max_queue

    @property
    def component(self) -> str | None:
        """The component this limit belongs to (a metric attribute)."""
        return self._component

    @property
    def limit_name(self) -> str | None:
        """The name of this limit within its component (a metric attribute)."""
        return self._limit_name

    @property
    def server(self) -> str | None:
        """The server this limit belongs to (a metric attribute), if any."""
        return self._server

    def locked(self) -> bool:
        """True if `acquire()` would wait (or fail) rather than take a slot at once."""
        return self._active >= self._limit or bool(self._queue)

    def __repr__(self) -> str:
        name = f" {self._component}/{self._limit_name}" if self._limit_name else ""
        return (
            f"<{type(self).__name__}{name} limit={self._limit} active={self._active} "
            f"queue_depth={len(self._queue)}>"
        )

    # --- acquire / release -----------------------------------------------------------

    async def __aenter__(self) -> None:
        # acquire() without a second coroutine: the stdlib mixin awaits self.acquire().
        if not self.try_acquire():
            self._shed_if_full()
            await self._wait()

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits, without waiting; True if taken."""
        if self._active < self._limit and not self._queue:
            self._active += 1
            return True
        return False

    async def acquire(self) -> Literal[True]:
        """Take a slot, waiting in FIFO order; raises TimeoutError, QueueFullError or cancels."""
        if self.try_acquire():
            return True
        self._shed_if_full()
        return await self._wait()

    def _shed_if_full(self) -> None:
        if self._max_queue is not None and len(self._queue) >= self._max_queue:
            self._shed += 1
            raise QueueFullError(
                f"{self._describe()}: {len(self._queue)} tasks already waiting "
                f"(max_queue={self._max_queue})"
            )

    async def _wait(self) -> Literal[True]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._queue[waiter] = None
        timer = None
        if self._timeout is not None:
            timer = loop.call_later(self._timeout, self._expire, waiter)
        try:
            admitted = await waiter
        except asyncio.CancelledError:
            self._leave_cancelled(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if not admitted:
            self._timeouts += 1
            raise TimeoutError(f"{self._describe()}: no slot within {self._timeout} s")
        return True

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        # A waiter already handed a slot (or cancelled) is done: the timer lost the race.
        if not waiter.done():
            self._queue.pop(waiter, None)
            waiter.set_result(False)

    def _leave_cancelled(self, waiter: asyncio.Future[bool]) -> None:
        self._cancelled += 1
        self._queue.pop(waiter, None)
        # Handed a slot in the same loop iteration as the cancel: pass it on, never drop it.
        if waiter.done() and not waiter.cancelled() and waiter.result():
            self._hand_over()

    def release(self) -> None:
        """Give a slot back: to the longest waiter if any. Raises ValueError if none is held."""
        if self._active <= 0:
            raise ValueError(f"{self._describe()} released with no slot held")
        if self._queue:
            self._hand_over()
        else:
            self._active -= 1

    def _hand_over(self) -> None:
        queue = self._queue
        while queue:
            waiter, _ = queue.popitem(last=False)
            if not waiter.done():  # cancelled waiters leave on their own; skip them
                waiter.set_result(True)
                return
        self._active -= 1

    def _describe(self) -> str:
        if self._limit_name is None:
            return type(self).__name__
        if self._component is None:
            return f"limit {self._limit_name}"
        return f"limit {self._component}/{self._limit_name}"


def _check_value(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"MeteredSemaphore value must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"MeteredSemaphore value must be >= 0, got {value}")


def _check_timeout(timeout: object) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"MeteredSemaphore timeout must be a number of seconds, got {timeout!r}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"MeteredSemaphore timeout must be > 0 and finite, got {timeout}")


def _check_max_queue(max_queue: object) -> None:
    if max_queue is None:
        return
    if isinstance(max_queue, bool) or not isinstance(max_queue, int):
        raise TypeError(f"MeteredSemaphore max_queue must be an int, got {max_queue!r}")
    if max_queue < 0:
        raise ValueError(f"MeteredSemaphore max_queue must be >= 0, got {max_queue}")
