"""Keeping Redis told, for one shared limit in one process: waiters to register (in arrival
order, a batch per call), leases and waiters to remove, sizes to write, and the renewal of
everything this process holds or queues (which also learns of grants whose notification was
lost, re-registers what Redis lost, and finds leases it could not renew in time).

What it reads of this process (the slots held here, the waiters Redis has a ticket for) and
what it tells it (Redis's answers, grants, leases not renewed in time) goes through
`ProcessSide`, which `ProcessState` (_process_state.py) is; sizes are written by `sizes`
(_sizes.py). Registering and removing run on the event loop; the renewal runs on the
heartbeat thread (`renew`). They meet in `lock`, which guards what a renewal in flight names
(a removal of one of those waits until it is done, so that the renewal cannot bring it
back), the ids still to drop, and the leases found lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Final, Protocol

from ._renewal_log import log_renewal
from ._replies import SyncReply
from ._sizes import Sizes
from ._store import RedisStore
from ._waiters import Waiter

__all__ = ["ProcessSide", "RedisSync"]

_log = logging.getLogger("gym_concurrency.limits.shared")

_BATCH: Final = 256  # waiters registered (or leases removed) in one script call
_RECHECK_WAITERS: Final = 64  # the oldest waiters a re-check asks about


class ProcessSide(Protocol):
    """What RedisSync reads of this process's side of the limit, and tells it (on the event
    loop, except `held` and `registered_ids`, which the heartbeat thread reads too)."""

    @property
    def held(self) -> Mapping[str, float]:
        """The slots held here (leases, and the local fallback's): id -> when Redis last
        confirmed it (monotonic)."""
        ...

    def registered_ids(self, at_most: int | None = None) -> list[str]:
        """The waiters Redis has a ticket for, oldest first (`at_most` of them)."""
        ...

    def sendable(self, waiter: Waiter) -> bool:
        """True if `waiter` is to be sent to Redis now; else it ended here, or is refused or
        goes to the local fallback (Redis away, the limit closed)."""
        ...

    def registered(self, waiter: Waiter, status: int, second: int, wait_ms: int) -> None:
        """Redis answered for `waiter`: QUEUED, ADMITTED or SHED (`_replies`); with rate
        budgets, the second its estimate was charged in, and the ms until it alone fits."""
        ...

    def unanswered(self, waiter: Waiter) -> None:
        """The call that sent `waiter` failed: Redis is away."""
        ...

    def waiting_since(self, lease: str) -> float | None:
        """When the waiter that `lease` was granted to was sent, while it waits (else None)."""
        ...

    def granted(self, lease: str) -> None:
        """Redis handed `lease` a slot."""
        ...

    def redis_back(self) -> None:
        """A renewal worked after Redis was away."""
        ...

    def leases_lost(self, leases: tuple[str, ...]) -> None:
        """`leases` could not be renewed within the lease."""
        ...


class RedisSync:
    """What this process must still tell Redis, and the grants Redis tells it of, for the
    process side `here`."""

    def __init__(
        self,
        store: RedisStore,
        here: ProcessSide,
        *,
        max_queue: int | None,
        lease_seconds: float,
        describe: str,
    ) -> None:
        self._store = store
        self._here = here
        self._max_queue = max_queue
        self._lease_seconds = lease_seconds
        self._describe = describe
        self.sizes = Sizes(store)
        self.lock = threading.Lock()  # the event loop and the heartbeat thread
        # Ids to remove from Redis once it answers again -> until when (monotonic) to keep
        # removing them: a call that timed out may still run in Redis after the first removal
        # (a paused Redis runs what it received in any order once it resumes), so each is
        # removed by every renewal for a lease after the first that worked.
        self.dropping: dict[str, float] = {}
        self._inflight: set[str] = set()  # ids named by the renewal in flight: removals wait
        self._deferred: list[str] = []
        self.lost: set[str] = set()  # held leases not renewed within the lease
        self.lease_lost = 0  # leases found lost (monotonic)
        self.unregistered: set[str] = set()  # fallback slots Redis has not been told of yet
        self.renewed_at = -math.inf  # (monotonic) when the last full renewal that worked was sent
        self.renew_soon = False  # a notification could not be trusted: renew at once
        self._renewing = threading.Lock()  # one renewal at a time
        self._unsent: list[Waiter] = []  # waiters not yet sent to Redis, in arrival order
        self._unremoved: list[str] = []  # ids given back, not yet removed from Redis
        self._sending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.background: set[asyncio.Task[object]] = set()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Forget everything (a new process, or a new loop) and run on `loop`."""
        self._loop = loop
        self._unsent.clear()
        self._unremoved.clear()
        self._sending = False
        self.sizes.start()
        self.background = set()  # (tasks of an earlier loop, or of the parent process)
        # New locks: a forked child must not inherit one its parent's thread held.
        self.lock = threading.Lock()
        self._renewing = threading.Lock()
        self.dropping.clear()
        self._inflight = set()
        self._deferred = []
        self.lost.clear()
        self.unregistered.clear()
        self.renewed_at = -math.inf

    def unsent_ids(self) -> list[str]:
        """Ids that must still be removed from Redis (for a limit that closes)."""
        with self.lock:
            return [*self.dropping, *self._deferred, *self._unremoved]

    def spawn(self, work: Coroutine[Any, Any, object]) -> None:
        """Run `work` in the background (close() waits for it)."""
        assert self._loop is not None
        task = self._loop.create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        """Run `callback(*args)` on the event loop (from the heartbeat thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: the process is stopping
            loop.call_soon_threadsafe(callback, *args)

    # --- registering waiters ---------------------------------------------------------

    def send(self, waiter: Waiter) -> None:
        """Queue `waiter` in Redis (soon, after those sent before it)."""
        self._unsent.append(waiter)
        self._start_sending()

    def flush(self) -> None:
        """Settlements or readings of the rate budgets wait: a script call soon carries them
        (the heartbeat's, if Redis is away)."""
        if self._loop is not None and not self._store.down:
            self._start_sending()

    def _start_sending(self) -> None:
        if not self._sending:
            self._sending = True
            self.spawn(self._send_pending())

    async def _send_pending(self) -> None:
        """Send waiters in this process's arrival order and the ids given back, a batch of
        each per script call, one call in flight: the tickets keep the arrival order (pooled
        connections would not), and a release and an acquire of one moment cost one call."""
        try:
            while self._unsent or self._unremoved or self._budget_due():
                removals = self._unremoved[:_BATCH]
                del self._unremoved[:_BATCH]
                if removals and self._store.down:  # the heartbeat removes them once it answers
                    self.drop_later(removals)
                    removals = []
                batch = self._unsent[:_BATCH]
                del self._unsent[:_BATCH]
                waiters = [waiter for waiter in batch if self._here.sendable(waiter)]
                if waiters:
                    await self._register_batch(waiters, removals)
                elif removals or self._budget_due():
                    await self._remove_batch(removals)
        finally:
            self._sending = False

    def _budget_due(self) -> bool:
        budget = self._store.budget
        return budget is not None and budget.pending and not self._store.down

    def refusing(self) -> bool:
        """True while this process must not ask Redis for slots: Redis is away, leases of
        this process were lost, or slots the local fallback admitted are not counted in
        Redis yet (the heartbeat renews at once until they are)."""
        return (
            self._store.down
            or bool(self.lost)
            or bool(self.unregistered)
            or self._store.misconfigured is not None
        )

    def renew_at_once(self) -> None:
        """Ask the heartbeat for a full renewal now (the mailbox lost its connection)."""
        self.renew_soon = True

    @property
    def renew_now(self) -> bool:
        """True while a full renewal is due at once: Redis is away (a probe), slots held
        here are not counted in Redis yet, a notification waits for one, or a new
        connection found the limit's state missing (a restart: holders must count again)."""
        return (
            self._store.down
            or bool(self.unregistered)
            or self.renew_soon
            or self._store.state_missing
        )

    async def _register_batch(self, waiters: list[Waiter], removals: list[str]) -> None:
        ids = [w.id for w in waiters if w.id is not None]
        sent = time.monotonic()
        for waiter in waiters:
            waiter.sent_at = sent
        try:
            reply = await self._store.acquire(self._max_queue, ids, removals)
        except BaseException as error:
            # Whatever ended the call (a cancel at shutdown too), no waiter of it may be left
            # waiting for an answer that never comes.
            failed = isinstance(error, self._store.failures)
            if failed:
                self._store.failed("acquire", error)
            self.drop_later([*removals, *ids])  # (they may have run: removed once it answers)
            for waiter in waiters:
                self._here.unanswered(waiter)
            if not failed:
                raise
            return
        second = 0 if reply.budget is None else reply.budget.second
        waits = reply.waits or (0,) * len(waiters)
        for waiter, status, wait in zip(waiters, reply.statuses, waits, strict=True):
            self._here.registered(waiter, status, second, wait)

    def register_later(self, lease: str) -> None:
        """The local fallback admitted slot `lease` (held here): the heartbeat registers it in
        Redis as a lease before anything more is asked of Redis (`refusing()` until then)."""
        with self.lock:
            self.unregistered.add(lease)

    def notified(self, lease: str) -> None:
        """The mailbox says Redis handed `lease` a slot. Trusted while this process's
        renewals are recent: else the lease may have expired since (a process cut off, or
        stopped), so the next renewal, which renews it in the same step, says (`granted`)."""
        sent = self._here.waiting_since(lease)
        if sent is not None:
            confirmed = max(sent, self.renewed_at)
            stale = time.monotonic() > confirmed + self._lease_seconds * 2 / 3
            if self.refusing() or stale:
                self.renew_soon = True
                return
        self._here.granted(lease)

    # --- removing leases and waiters -------------------------------------------------

    def remove(self, lease: str) -> None:
        """Remove `lease` (a lease or a waiter) from Redis, passing its slot on."""
        if not self._store.started:
            return
        with self.lock:
            if lease in self._inflight:  # the renewal in flight names it: remove it after
                self._deferred.append(lease)
                return
            self.lost.discard(lease)
            if lease in self.unregistered:  # Redis never heard of it: nothing to remove
                self.unregistered.discard(lease)
                return
        self._unremoved.append(lease)
        self._start_sending()

    async def _remove_batch(self, ids: list[str]) -> None:
        try:
            await self._store.remove(ids)
        except self._store.failures as error:
            self._store.failed("remove", error)
            self.drop_later(ids)

    # --- renewal (the heartbeat thread) ------------------------------------------------

    async def sync(self, full: bool = True) -> None:
        """One renewal now, off the event loop (what the heartbeat does on its own)."""
        await asyncio.to_thread(self.renew, full)
        await asyncio.sleep(0)  # what it learned, handed to the loop, is applied

    def renew(self, full: bool = True) -> None:
        """Renew this process's leases and waiters, drop what must go, learn of grants whose
        notification was lost, re-register what Redis lost (or let expire) and the local
        fallback's slots. A re-check (not `full`) names only this process's oldest waiters,
        the first to be handed a slot (FIFO): it costs the same with ten waiters or ten
        thousand. A renewal that fails finds the leases not renewed within the lease."""
        here = self._here
        with self._renewing:
            if not self._store.blocking_started:
                return
            with self.lock:
                held = list(here.held) if full else []
                queued = here.registered_ids(None if full else _RECHECK_WAITERS)
                drops = [i for i in self.dropping if i not in here.held]
                fresh = self.unregistered.intersection(held)
                self._inflight = {*held, *queued}
            sent = time.monotonic()
            if full:
                self._store.restore_state()
                self.renew_soon = False  # (set again meanwhile: another full renewal at once)
            # Leases a lease past their last confirmation were lost even if this renewal
            # works: the process (or this thread) was stopped meanwhile, Redis ran on.
            self._find_lost(sent)
            was_refusing = self.refusing()
            try:
                reply = self._store.sync_blocking(held, queued, drops)
            except self._store.failures as error:
                self._post_deferred(self._settle(None))
                self._store.failed("heartbeat", error)
                self._find_lost(time.monotonic())
                return
            except BaseException:
                self._post_deferred(self._settle(None))
                if full:  # (its ask was cleared as it began: another at once)
                    self.renew_soon = True
                raise
            # The fallback's slots it named are leases in Redis now: a release from here on
            # removes them there (settled with the removals it held up, under one lock).
            deferred = self._settle(drops, sent, registered=held)
            back = 0
            if full:
                self.renewed_at = sent
                # Ids to drop that came after this renewal's snapshot (a call that failed
                # meanwhile, and may have run in Redis): another renewal at once drops them.
                if self._undropped(drops):
                    self.renew_soon = True
                with self.lock:
                    back, self.lost = len(self.lost), set()
            self._post(self._renewed, reply, deferred, fresh, back, was_refusing)
            if full:
                self.sizes.after_renewal()

    def _undropped(self, drops: list[str]) -> bool:
        with self.lock:
            return any(until == math.inf for until in self.dropping.values()) and bool(
                self.dropping.keys() - set(drops)
            )

    def drop_later(self, ids: list[str]) -> None:
        """Remove `ids` from Redis with the next renewals that work (see `dropping`); never
        one held here (its grant came through the mailbox before its call's error)."""
        with self.lock:
            for ident in ids:
                if ident not in self._here.held:
                    self.dropping.setdefault(ident, math.inf)

    def _settle(
        self, drops: list[str] | None, sent: float = math.inf, registered: Iterable[str] = ()
    ) -> list[str]:
        """The renewal ended (`drops` were dropped and `registered` renewed by a renewal sent
        at `sent`, if it worked): the removals it held up. A drop is kept for a lease after
        the first."""
        with self.lock:
            self._inflight = set()
            self.unregistered.difference_update(registered)
            deferred, self._deferred = self._deferred, []
            for ident in drops or ():
                until = self.dropping.get(ident)
                if until == math.inf:
                    self.dropping[ident] = sent + self._lease_seconds
                elif until is not None and until <= sent:
                    del self.dropping[ident]
        return deferred

    def _post_deferred(self, deferred: list[str]) -> None:
        if deferred:
            self._post(self._remove_all, deferred)

    def _remove_all(self, ids: list[str]) -> None:
        for lease in ids:
            self.remove(lease)

    def _renewed(
        self, reply: SyncReply, deferred: list[str], fresh: set[str], back: int, was_away: bool
    ) -> None:
        """On the event loop: what a renewal learned."""
        self._remove_all(deferred)
        if was_away and not self.refusing():
            self._here.redis_back()
        for lease in reply.granted:
            self._here.granted(lease)
        reclaimed = [lease for lease in reply.reclaimed if lease not in fresh]
        log_renewal(self._describe, reply, len(self._here.held), len(reclaimed), len(fresh), back)

    def _find_lost(self, now: float) -> None:
        """Leases whose deadline in Redis may have passed: not renewed since they were last
        confirmed, a lease ago. Counted once each; admissions stop until a renewal works."""
        lease = self._lease_seconds
        with self.lock:
            newly = tuple(
                ident
                for ident, confirmed in list(self._here.held.items())
                if ident not in self.unregistered
                and ident not in self.lost
                and max(confirmed, self.renewed_at) + lease < now
            )
            self.lost.update(newly)
            self.lease_lost += len(newly)
        if newly:
            self._post(self._here.leases_lost, newly)
