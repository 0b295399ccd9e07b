"""MeteredSemaphore: an asyncio.BoundedSemaphore that counts its state in plain integers."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from ._base import LimitBase, check_count
from .limit import Admission

__all__ = ["MeteredSemaphore"]

_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution


class MeteredSemaphore(LimitBase, asyncio.BoundedSemaphore):
    """A FIFO bounded semaphore whose limit, holders, waiters and failed admissions are readable.

    `timeout` bounds the wait inside `acquire()` (expiry raises TimeoutError); `max_queue`
    bounds the waiters (a full queue raises QueueFullError at once). Acquire and release
    make no telemetry call: the observer reads these integers at export.
    """

    _label = "limit"

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
        check_count(type(self).__name__, "value", value)
        LimitBase.__init__(
            self,
            component=component,
            limit_name=limit_name,
            server=server,
            timeout=timeout,
            max_queue=max_queue,
        )
        asyncio.BoundedSemaphore.__init__(self, value)
        self._limit = value
        self._active = 0  # slots held, including ones handed to a waiter not yet resumed
        # Waiters in arrival order, each with its deadline (loop time, None without a
        # timeout); O(1) removal from the middle. Every waiter has the same timeout, so the
        # deadlines are in queue order too: one timer, for the oldest waiter, serves them all.
        self._queue: OrderedDict[asyncio.Future[Admission], float | None] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None
        # Waiters handed a slot whose tasks have not resumed yet (`settle()` or `leave()` ends
        # each hand-over). Until they have, no later acquire takes a slot at once, as in
        # asyncio.Semaphore: a task that releases and re-acquires runs after the waiters it
        # handed slots to.
        self._handed: set[asyncio.Future[Admission]] = set()
        self._register()

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
        """Slots free now: `limit - active`, or 0 while a shrunk limit drains."""
        return max(0, self._limit - self._active)

    @property
    def queue_depth(self) -> int:
        """Tasks waiting for a slot now."""
        return len(self._queue)

    def locked(self) -> bool:
        """True if `acquire()` would wait (or fail) rather than take a slot at once."""
        return self._active >= self._limit or bool(self._queue) or bool(self._handed)

    def __repr__(self) -> str:
        # asyncio's own shape ("... object at 0x... [unlocked, value:1]"), with the limit's
        # name, size and holders before the brackets.
        name = f" {self._component}/{self._limit_name}" if self._limit_name else ""
        state = "locked" if self.locked() else f"unlocked, value:{self.available}"
        if self._queue:
            state += f", waiters:{len(self._queue)}"
        return (
            f"<{type(self).__name__}{name} object at {id(self):#x} limit={self._limit} "
            f"active={self._active} [{state}]>"
        )

    # --- acquire / release -----------------------------------------------------------

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits (nor was handed a slot and has yet
        to resume), without waiting; True if taken."""
        if self._active < self._limit and not self._queue and not self._handed:
            self._active += 1
            return True
        return False

    def enqueue(self) -> asyncio.Future[Admission]:
        """Join the queue (call after `try_acquire()` failed): the future ends "admitted" (the
        slot is held), "timeout", or is "shed" already if `max_queue` tasks wait. Never raises."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Admission] = loop.create_future()
        # Never shed while a slot is free (held back only for a waiter handed one, not yet
        # resumed): the request waits for that hand-over instead.
        full = self._max_queue is not None and len(self._queue) >= self._max_queue
        if full and self._active >= self._limit:
            self._shed += 1
            waiter.set_result("shed")
            return waiter
        deadline = None
        if self._timeout is not None:
            deadline = loop.time() + self._timeout
            if self._timer is None:
                self._timer = loop.call_at(deadline, self._expire)
        self._queue[waiter] = deadline
        return waiter

    def _forget(self, waiter: asyncio.Future[Admission]) -> bool:
        if waiter not in self._queue:
            return False
        del self._queue[waiter]  # the timer, if it was for this waiter, re-arms when it fires
        return True

    def _expire(self) -> None:
        """Time out every waiter whose deadline has passed (the oldest ones), then re-arm the
        timer for the oldest waiter left."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time() + _CLOCK_RESOLUTION  # as the loop itself decides a timer is due
        queue = self._queue
        while queue:
            waiter, deadline = next(iter(queue.items()))
            if deadline is not None and deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                return
            del queue[waiter]
            if not waiter.done():  # else cancelled with its task, which counts it when it leaves
                self._timeouts += 1
                waiter.set_result("timeout")

    def release(self) -> None:
        """Give a slot back: to the longest waiter if any. Raises ValueError if none is held."""
        if self._active <= 0:
            raise ValueError(f"{self._describe()} released with no slot held")
        self._active -= 1
        if self._queue:
            self._admit_waiters()

    def resize(self, limit: int) -> None:
        """Set the number of slots: growing admits waiters at once in FIFO order; shrinking
        never revokes a held slot (`active` may exceed `limit` until releases drain it)."""
        check_count(type(self).__name__, "value", limit)
        self._limit = limit
        self._admit_waiters()

    def _admit_waiters(self) -> None:
        """Hand free slots to the longest waiters."""
        queue = self._queue
        while queue and self._active < self._limit:
            waiter, _ = queue.popitem(last=False)
            if waiter.done():  # cancelled with its task, which counts it when it leaves
                continue
            self._active += 1
            self._handed.add(waiter)
            waiter.set_result("admitted")

    def settle(self, waiter: asyncio.Future[Admission]) -> None:
        """The task awaiting `waiter` resumed: a slot handed to it is its own from now on, and
        waiters that queued behind the hand-over get the slots still free (as
        asyncio.Semaphore's resumed task does). Called in that task, not as a loop callback."""
        handed = self._handed
        if handed:
            handed.discard(waiter)
            if self._queue:
                self._admit_waiters()
