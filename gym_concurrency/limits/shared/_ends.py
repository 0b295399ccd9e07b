"""How a shared limit's waiter ends in this process: timed out here (the limit's timeout or its
own deadline), shed by Redis's full queue, or abandoned, undoing what it holds or queues
elsewhere (Redis, the local fallback)."""

from __future__ import annotations

import asyncio

from ..limit import Refusal
from ._fallback import Fallback
from ._sync import RedisSync
from ._waiters import Waiter, Waiters

__all__ = ["EndsMixin"]


class EndsMixin:
    """SharedLimit's waiter endings (state is SharedLimit's own)."""

    _timeout: float | None
    _timeouts: int
    _shed: int
    _fallback: Fallback | None
    _waiters: Waiters
    _sync: RedisSync

    def _add(
        self,
        waiter: Waiter,
        loop: asyncio.AbstractEventLoop,
        timeout: float | None,
        own_deadline: bool = False,
    ) -> Waiter:
        """Keep `waiter`, ended after `timeout` seconds (None: never) unless it ends first:
        "timeout", or "deadline" if that bound is the waiter's `own_deadline`."""
        expire = self._expire_deadline if own_deadline else self._expire
        return self._waiters.add(waiter, timeout, loop, expire)

    def _abandon(self, waiter: Waiter) -> None:
        """Undo what `waiter` holds or queues elsewhere, now that it has ended here."""
        if waiter.fallback is not None:
            if self._fallback is not None:
                self._fallback.leave(waiter.fallback)  # passes on a slot it was just handed
        elif waiter.id is not None and waiter.registered:
            self._sync.remove(waiter.id)
        # not answered yet: _registered() removes what Redis made for it

    def _expire(self, waiter: Waiter, refusal: Refusal = "timeout") -> None:
        waiter.timer = None
        if not self._waiters.current(waiter):
            return
        self._waiters.end(waiter)
        if not waiter.future.done():  # else cancelled with its task, counted when it leaves
            self._timeouts += 1  # a deadline too: counted as a timeout
            waiter.future.set_result(refusal)
        self._abandon(waiter)

    def _expire_deadline(self, waiter: Waiter) -> None:
        self._expire(waiter, "deadline")

    def _refuse_shed(self, waiter: Waiter) -> None:
        """Redis found the global queue full for `waiter`."""
        self._waiters.end(waiter)
        self._shed += 1
        waiter.future.set_result("shed")
