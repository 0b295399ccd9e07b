"""What a shared limit does while Redis is away and once it answers again: admissions refused
or taken by the local fallback, whose slots get ids (leases once Redis has them) and whose
waiters move to Redis's queue when it is back; leases this process could not renew."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ._checks import RedisUnavailable
from ._fallback import Fallback
from ._held import HeldLeases, lease_id
from ._store import RedisStore
from ._sync import RedisSync
from ._waiters import Waiter, Waiters

__all__ = ["AwayMixin"]

_log = logging.getLogger("gym_concurrency.limits.shared")


class AwayMixin:
    """SharedLimit's behaviour while Redis cannot be reached (state is SharedLimit's own)."""

    _unavailable: int
    _shed: int
    _mode: RedisUnavailable
    _fallback: Fallback | None
    _held: HeldLeases
    _waiters: Waiters
    _sync: RedisSync
    _proc: str
    _counter: Iterator[int]
    _store: RedisStore
    _lease_seconds: float
    _on_lease_lost: Callable[[Any, tuple[str, ...]], None] | None

    if TYPE_CHECKING:

        def _describe(self) -> str: ...

    def _unreachable(self, waiter: Waiter) -> None:
        """End `waiter` as "unavailable", or admit it through the local fallback."""
        if not waiter.unavailable:  # (a waiter moved to Redis can find it away again)
            waiter.unavailable = True
            self._unavailable += 1
        if self._fallback is None or self._mode == "refuse":
            self._waiters.end(waiter)
            waiter.future.set_result("unavailable")
            return
        admitted = self._fallback.admit(waiter.weight, lambda _: self._fallback_admitted(waiter))
        if isinstance(admitted, asyncio.Future):
            waiter.fallback = admitted
            return
        if admitted == "shed":  # the local queue is full too
            self._waiters.end(waiter)
            self._shed += 1
        else:
            self._waiters.admitted(waiter)
            self._hold_fallback(waiter)
        waiter.future.set_result(admitted)

    def _hold_fallback(self, waiter: Waiter) -> None:
        """A fallback slot was taken for `waiter`: it gets an id, so that once Redis answers
        again the heartbeat registers it as a lease before anything more is granted."""
        lease = lease_id(self._proc, next(self._counter), waiter.weight, waiter.flow)
        self._sync.hold_fallback(lease)

    def _fallback_admitted(self, waiter: Waiter) -> None:
        inner = waiter.fallback
        if not self._waiters.current(waiter) or inner is None:
            return  # it ended here (timeout, leave, close), which left the fallback
        if waiter.future.done() or inner.cancelled():  # cancelled with its task
            self._waiters.end(waiter)
            if self._fallback is not None:
                self._fallback.leave(inner)
            return
        if not self._sync.refusing():  # Redis is back: it, not the fallback, admits now
            self._to_redis(waiter)
            return
        self._waiters.admitted(waiter)
        self._hold_fallback(waiter)
        waiter.future.set_result("admitted")

    def _to_redis(self, waiter: Waiter) -> None:
        """`waiter` waits in the fallback, but Redis answers again: it leaves the fallback
        (a slot just handed to it passes on) and queues in Redis instead."""
        inner, waiter.fallback = waiter.fallback, None
        if inner is not None and self._fallback is not None:
            self._fallback.leave(inner)
        ident = lease_id(self._proc, next(self._counter), waiter.weight, waiter.flow)
        self._waiters.name(waiter, ident)
        self._sync.send(waiter)

    def _redis_back(self) -> None:
        """On the event loop: a renewal worked after Redis was away; the fallback's waiters
        queue in Redis from now on."""
        for waiter in self._waiters.all():
            if waiter.fallback is not None and not waiter.future.done():
                self._to_redis(waiter)

    def _unsent_unreachable(self, waiter: Waiter) -> None:
        self._waiters.forget_id(waiter)
        if waiter.future.done():  # cancelled with its task: counted when it leaves
            self._waiters.end(waiter)
        else:
            self._unreachable(waiter)

    def _leases_lost(self, leases: tuple[str, ...]) -> None:
        """On the event loop: the heartbeat could not renew `leases` within the lease."""
        _log.warning(
            "gym_concurrency: %s could not renew %d leases within lease_seconds=%s (Redis at "
            "%s unreachable, or this process stopped): their holders run on here while "
            "Redis may grant their slots to others; this process admits %s until Redis "
            "counts them again (leases: %s)",
            self._describe(),
            len(leases),
            self._lease_seconds,
            self._store.redis_url,
            "nothing more" if self._mode == "refuse" else "only through its local fallback",
            ", ".join(leases),
        )
        hook = self._on_lease_lost
        if hook is not None:
            try:
                hook(self, leases)
            except Exception:  # a hook's failure never reaches the limit
                _log.exception("gym_concurrency: %s: on_lease_lost failed", self._describe())
