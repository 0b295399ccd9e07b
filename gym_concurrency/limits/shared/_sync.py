"""Keeping Redis told, for one shared limit in one process: waiters to register (in arrival
order, a batch per call), leases and waiters to remove, sizes to write, and the renewal of
everything this process holds or queues (which also learns of grants whose notification was
lost, and re-registers what Redis lost)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final

from ._store import ADMITTED, SHED, RedisStore
from ._waiters import Waiter, Waiters

__all__ = ["RedisSync"]

_log = logging.getLogger("gym_concurrency.limits.shared")

_BATCH: Final = 256  # waiters registered (or leases removed) in one script call
_RECHECK_WAITERS: Final = 64  # the oldest waiters a re-check asks about


class RedisSync:
    """What this process must still tell Redis, and the grants Redis tells it of.

    `held` (lease ids held here) and `waiters` are the limit's own; `shed(waiter)` and
    `unreachable(waiter)` end a waiter the limit's way; `closed()` says the limit closed."""

    def __init__(
        self,
        store: RedisStore,
        waiters: Waiters,
        held: dict[str, None],
        *,
        max_queue: int | None,
        shed: Callable[[Waiter], None],
        unreachable: Callable[[Waiter], None],
        closed: Callable[[], bool],
        describe: str,
    ) -> None:
        self._store = store
        self._waiters = waiters
        self._held = held
        self._max_queue = max_queue
        self._shed = shed
        self._unreachable = unreachable
        self._closed = closed
        self._describe = describe
        self.dropping: set[str] = set()  # ids to remove from Redis once it answers again
        self._inflight: set[str] = set()  # ids named by the sync in flight: removals wait
        self._deferred: list[str] = []
        self._unsent: list[Waiter] = []  # waiters not yet sent to Redis, in arrival order
        self._registering = False
        self._unremoved: list[str] = []  # ids given back, not yet removed from Redis
        self._removing = False
        self._size_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.background: set[asyncio.Task[None]] = set()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Forget everything (a new process, or a new loop) and run on `loop`."""
        self._loop = loop
        self._unsent.clear()
        self._registering = False
        self._unremoved.clear()
        self._removing = False
        self._size_lock = asyncio.Lock()

    def unsent_ids(self) -> list[str]:
        """Ids that must still be removed from Redis (for a limit that closes)."""
        return [*self.dropping, *self._deferred, *self._unremoved]

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background (close() waits for it)."""
        assert self._loop is not None
        task = self._loop.create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # --- registering waiters ---------------------------------------------------------

    def send(self, waiter: Waiter) -> None:
        """Queue `waiter` in Redis (soon, after those sent before it)."""
        self._unsent.append(waiter)
        if not self._registering:
            self._registering = True
            self.spawn(self._register_unsent())

    async def _register_unsent(self) -> None:
        """Send waiters to Redis in this process's arrival order, a batch at a time, so that
        their tickets keep that order (pooled connections would not)."""
        try:
            while self._unsent:
                batch = self._unsent[:_BATCH]
                del self._unsent[:_BATCH]
                waiters = []
                for waiter in batch:
                    if not self._waiters.current(waiter):
                        continue  # ended before it was sent: nothing to undo
                    if waiter.future.done():  # cancelled with its task: counted when it leaves
                        self._waiters.end(waiter)
                    elif self._store.down or self._closed():
                        self._unreachable(waiter)
                    else:
                        waiters.append(waiter)
                if waiters:
                    await self._register_batch(waiters)
        finally:
            self._registering = False

    async def _register_batch(self, waiters: list[Waiter]) -> None:
        ids = [w.id for w in waiters if w.id is not None]
        try:
            reply = await self._store.acquire(self._max_queue, ids)
        except self._store.failures as error:
            self._store.failed("acquire", error)
            self.dropping.update(ids)  # they may have run: removed once Redis answers
            for waiter in waiters:
                if self._waiters.current(waiter):
                    self._unreachable(waiter)
            return
        for waiter, status in zip(waiters, reply.statuses, strict=True):
            self._registered(waiter, status)

    def _registered(self, waiter: Waiter, status: int) -> None:
        """Redis answered for `waiter`: admitted, shed, or queued (a notification or the
        re-check admits it later)."""
        lease = waiter.id
        assert lease is not None
        waiter.registered = True
        if not self._waiters.current(waiter) or waiter.future.done():
            # It ended meanwhile (timeout, leave, cancel), or a notification was first.
            if lease not in self._held:
                self._waiters.end(waiter)
                if status != SHED:
                    self.remove(lease)
            return
        if status == ADMITTED:
            self._admit(waiter, lease)
        elif status == SHED:
            self._shed(waiter)

    def _admit(self, waiter: Waiter, lease: str) -> None:
        self._waiters.end(waiter)
        self._held[lease] = None
        waiter.future.set_result("admitted")

    def granted(self, lease: str) -> None:
        """Redis handed `lease` (a waiter's id) a slot: admit its waiter, or pass it on."""
        waiter = self._waiters.named(lease)
        if waiter is None:
            if lease not in self._held:  # it ended here already: give the slot back
                self.remove(lease)
            return
        if waiter.future.done():  # cancelled with its task: counted when it leaves
            self._waiters.end(waiter)
            if waiter.registered:
                self.remove(lease)
            return
        self._admit(waiter, lease)

    # --- removing leases and waiters -------------------------------------------------

    def remove(self, lease: str) -> None:
        """Remove `lease` (a lease or a waiter) from Redis, passing its slot on."""
        if not self._store.started:
            return
        if lease in self._inflight:  # the sync in flight names it: remove it after that
            self._deferred.append(lease)
            return
        self._unremoved.append(lease)
        if not self._removing:
            self._removing = True
            self.spawn(self._remove_pending())

    async def _remove_pending(self) -> None:
        """Remove what was given back, a batch per script call (one call in flight)."""
        try:
            while self._unremoved:
                ids = self._unremoved[:_BATCH]
                del self._unremoved[:_BATCH]
                if self._store.down:  # the heartbeat removes them once Redis answers again
                    self.dropping.update(ids)
                    continue
                try:
                    await self._store.remove(ids)
                except self._store.failures as error:
                    self._store.failed("remove", error)
                    self.dropping.update(ids)
        finally:
            self._removing = False

    # --- sizes and renewal -----------------------------------------------------------

    async def apply_size(self) -> None:
        """Write the pending size (configured, or a resize), if any."""
        async with self._size_lock:
            pending = self._store.pending
            if pending is None:
                return
            try:
                await self._store.configure(pending)
            except self._store.failures as error:
                self._store.failed("resize", error)
                return
            if self._store.pending == pending:
                self._store.pending = None

    async def sync(self, full: bool = True) -> None:
        """Renew this process's leases and waiters, drop what must go, learn of grants whose
        notification was lost, re-register what Redis lost. A re-check (not `full`) names only
        this process's oldest waiters, the first to be handed a slot (FIFO): it costs the same
        with ten waiters or ten thousand."""
        held = list(self._held) if full else []
        queued = self._waiters.registered_ids(None if full else _RECHECK_WAITERS)
        drops = list(self.dropping)
        self._inflight = {*held, *queued}
        try:
            reply = await self._store.sync(held, queued, drops)
        except self._store.failures as error:
            self._store.failed("heartbeat", error)
            return
        finally:
            self._inflight = set()
            deferred, self._deferred = self._deferred, []
            for lease in deferred:
                self.remove(lease)
        self.dropping.difference_update(drops)
        for lease in reply.granted:
            self.granted(lease)
        if reply.reclaimed or reply.requeued:
            _log.warning(
                "gym_concurrency: %s: Redis had lost %d leases and %d waiters of this "
                "process; re-registered them",
                self._describe,
                len(reply.reclaimed),
                len(reply.requeued),
            )

    def recheck_due(self, last: float, recheck: float) -> float:
        """When waiters of this process should look for a lost notification or an expired
        lease (never, without waiters)."""
        if self._waiters.queued_in_redis:
            return min(last + recheck, self._store.next_expiry)
        return float("inf")
