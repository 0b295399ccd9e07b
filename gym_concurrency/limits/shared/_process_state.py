"""This process's side of a shared limit: the slots it holds (leases, and the local fallback's
while Redis was away), its waiters, the local fallback, the failures counted here and the ids
it gives; each changes here and nowhere else. `sync` (RedisSync) tells Redis what happens
here and brings back what Redis answers, through the few methods of `ProcessSide`.

A waiter is queued in Redis (`_queue_in_redis`, the one way in, for a new waiter and for one
that waited in the fallback alike); while Redis cannot be asked it is refused "unavailable",
or (`redis_unavailable="local"`, a limit without rate budgets: they are kept only in Redis)
admitted through the fallback, whose slots get ids so that the heartbeat registers them as
leases once Redis answers, and whose waiters then queue in Redis. A waiter that ends here
(its timeout or deadline, its task leaving) undoes what it holds or queues elsewhere.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable, Iterator

from ..admission_counts import AdmissionCounts
from ..flows import FlowStatistics
from ..limit import Admission, Refusal
from ._fallback import Fallback
from ._held import (
    HeldLeases,
    grant_handle,
    lease_flow,
    lease_id,
    lease_tokens,
    lease_weight,
    waiter_id,
)
from ._replies import ADMITTED, QUEUED, SHED
from ._store import RedisStore
from ._sync import RedisSync
from ._waiters import Handed, Waiter, Waiters

__all__ = ["LostHook", "ProcessState"]

_log = logging.getLogger("gym_concurrency.limits.shared")

LostHook = Callable[[tuple[str, ...]], None]
"""Called on the event loop with the ids of the leases this process could not renew."""


class ProcessState:
    """The slots, waiters, fallback and failure counts of one shared limit in this process.

    `held`, `waiters` and `fallback` are read by the limit and by `sync`; how waits end here
    is counted in `counts` (timeouts, shed, capped, refused "budget"; the limit's, which
    counts cancels) and `unavailable` (monotonic, each failed admission counted once).
    `fallback_slots` (None: refuse, as "refuse" mode and a limit with budgets do) sizes the
    fallback; `on_lease_lost(ids)` runs after the warning for leases not renewed in time."""

    def __init__(
        self,
        store: RedisStore,
        counts: AdmissionCounts,
        *,
        fallback_slots: int | None,
        max_queue: int | None,
        lease_seconds: float,
        on_lease_lost: LostHook | None,
        describe: str,
    ) -> None:
        self.held = HeldLeases()
        self.waiters = Waiters()
        self.fallback = Fallback(fallback_slots, max_queue) if fallback_slots is not None else None
        self.closed = False
        self.counts = counts
        self.unavailable = 0  # once per arrival, refused or admitted through the fallback
        self._proc = ""  # this process's part of every id (new for each event loop, fork)
        self._counter: Iterator[int] = itertools.count(1)
        self._store = store
        self._lease_seconds = lease_seconds
        self._on_lease_lost = on_lease_lost
        self._describe = describe
        self.sync = RedisSync(
            store, self, max_queue=max_queue, lease_seconds=lease_seconds, describe=describe
        )

    def start(self) -> str:
        """Forget every slot and waiter (a new event loop, or a forked child) and take a new
        process id, never reused; the id."""
        self._proc = uuid.uuid4().hex
        self._counter = itertools.count(1)
        self.held.clear()
        self.waiters.clear()
        return self._proc

    def close(self) -> None:
        """Admit nothing through Redis from now on."""
        self.closed = True

    def end_waiters(self) -> list[str]:
        """The limit closed: every waiter ends "unavailable" (counted, unless it ended as it
        left); the ids Redis has for this process (held leases, registered waiters)."""
        ids = list(self.held) + self.waiters.registered_ids()
        for waiter in self.waiters.all():
            self.waiters.end(waiter)
            if waiter.fallback is not None and self.fallback is not None:
                self.fallback.leave(waiter.fallback)
            if not waiter.future.done():
                self.unavailable += 1
                waiter.future.set_result("unavailable")
        return ids

    def _new_id(self, waiter: Waiter) -> str:
        return lease_id(self._proc, next(self._counter), waiter.weight, waiter.flow, waiter.tokens)

    # --- a waiter arrives, and ends here ---------------------------------------------

    def enqueue(
        self,
        loop: asyncio.AbstractEventLoop,
        weight: int,
        flow: str | None,
        timeout: float | None,
        deadline: float | None,
        tokens: int | None = None,
    ) -> asyncio.Future[Admission]:
        """A waiter for `weight` in `flow` (and an estimate of `tokens` from the limit's rate
        budgets), ended after `timeout` or its own `deadline` (seconds, the sooner: "timeout"
        or "deadline"; a deadline past: "deadline" at once)."""
        future: asyncio.Future[Admission] = loop.create_future()
        expire: Callable[[Waiter], None] = self._expire
        if deadline is not None and (timeout is None or deadline < timeout):
            if deadline <= 0:
                self.counts.timed_out()  # answered as its own refusal
                future.set_result("deadline")
                return future
            timeout, expire = deadline, self._expire_deadline
        waiter = Waiter(None, future, weight, flow, tokens)
        self.waiters.add(waiter, timeout, loop, expire)
        if self.sync.refusing() or self.closed:
            self._unreachable(waiter)
        else:
            self._queue_in_redis(waiter)
        return future

    def _queue_in_redis(self, waiter: Waiter) -> None:
        """`waiter` queues in Redis under a new id (leaving the fallback, if it waited there:
        a slot just handed to it passes on)."""
        inner, waiter.fallback = waiter.fallback, None
        if inner is not None and self.fallback is not None:
            self.fallback.leave(inner)
        self.waiters.name(waiter, self._new_id(waiter))
        self.sync.send(waiter)

    def forget(self, future: asyncio.Future[Admission]) -> bool:
        """Take the waiter of `future` out of the queue if it still waits (True)."""
        waiter = self.waiters.of(future)
        if waiter is None:
            return False
        self.waiters.end(waiter)
        self._abandon(waiter)
        return True

    def settled(self, future: asyncio.Future[Admission]) -> Handed | None:
        """The task awaiting `future` resumed: what it was handed (None if not admitted)."""
        return self.waiters.settled(future)

    def release(self, weight: int, flow: str | None) -> None:
        """Give back a slot of `weight` in `flow` (the fallback's first, else a lease, which
        Redis hands on); ValueError if none is held."""
        lease, fallen = self.held.give_back(weight, flow, self._describe)
        if fallen and self.fallback is not None:
            self.fallback.release(weight)
        if not self.closed:
            self.sync.remove(lease)

    def _abandon(self, waiter: Waiter) -> None:
        """Undo what `waiter` holds or queues elsewhere, now that it has ended here."""
        if waiter.fallback is not None:
            if self.fallback is not None:
                self.fallback.leave(waiter.fallback)  # passes on a slot it was just handed
        elif waiter.id is not None and waiter.registered:
            self.sync.remove(waiter.id)
        # not answered yet: registered() removes what Redis made for it

    def _expire(self, waiter: Waiter, refusal: Refusal = "timeout") -> None:
        waiter.timer = None
        if not self.waiters.current(waiter):
            return
        self.waiters.end(waiter)
        if not waiter.future.done():  # else cancelled with its task, counted when it leaves
            budget = self._store.budget
            if refusal == "timeout" and budget is not None and budget.blocking() is not None:
                refusal = "budget"  # the budgets held the queue up (a deadline is its own)
            self.counts.timed_out(refusal)  # a deadline too
            waiter.future.set_result(refusal)
        self._abandon(waiter)

    def _expire_deadline(self, waiter: Waiter) -> None:
        self._expire(waiter, "deadline")

    # --- what Redis answers (ProcessSide, for sync) --------------------------------------

    @property
    def queued_in_redis(self) -> bool:
        """True while any waiter queues (or is being queued) in Redis."""
        return self.waiters.queued_in_redis

    def registered_ids(self, at_most: int | None = None) -> list[str]:
        """The waiters Redis has a ticket for, oldest first (`at_most` of them)."""
        return self.waiters.registered_ids(at_most)

    def sendable(self, waiter: Waiter) -> bool:
        """True if `waiter` is to be sent now; else it ends here (or goes to the fallback)."""
        if not self.waiters.current(waiter):
            return False  # ended before it was sent: nothing to undo
        if waiter.future.done():  # cancelled with its task: counted when it leaves
            self.waiters.end(waiter)
        elif self.sync.refusing() or self.closed:
            self.unanswered(waiter)
        else:
            return True
        return False

    def registered(self, waiter: Waiter, status: int, second: int, wait_ms: int) -> None:
        """Redis answered for `waiter`: admitted (its estimate charged in Redis second
        `second`), shed, or queued (a notification or the re-check admits it later; refused
        "budget" at once if its estimate alone fits the budgets only in `wait_ms`, after its
        timeout or deadline)."""
        lease = waiter.id
        assert lease is not None
        budget = self._store.budget
        if status == QUEUED and budget is not None and waiter.tokens is not None:
            budget.fits_in(waiter.tokens, wait_ms)  # (what a refusal's Retry-After says)
        waiter.registered = status != SHED  # (a renewal must not queue it again)
        if not self.waiters.current(waiter) or waiter.future.done():
            # It ended meanwhile (timeout, leave, cancel), or a notification was first.
            if lease not in self.held:
                self.waiters.end(waiter)
                if status != SHED:
                    self.sync.remove(lease)
                if status == ADMITTED:
                    self._unused(lease, str(second))
            return
        if status == ADMITTED:
            self._admit(waiter, lease, str(second))
        elif status == QUEUED and wait_ms > 0 and _ends_within(waiter, wait_ms / 1000):
            self.waiters.end(waiter)
            self.counts.timed_out("budget")  # it could not be admitted in time
            waiter.future.set_result("budget")
            self.sync.remove(lease)
        elif status == SHED:  # the global queue is full
            self.waiters.end(waiter)
            self.counts.shed_one()
            waiter.future.set_result("shed")

    def unanswered(self, waiter: Waiter) -> None:
        """Redis could not be asked for `waiter`: it waits no more there."""
        if not self.waiters.current(waiter):
            return
        self.waiters.forget_id(waiter)
        if waiter.future.done():  # cancelled with its task: counted when it leaves
            self.waiters.end(waiter)
        else:
            self._unreachable(waiter)

    def waiting_since(self, lease: str) -> float | None:
        """When the waiter that `lease` was granted to was sent, while it waits (else None)."""
        waiter = self.waiters.named(waiter_id(lease))
        if waiter is None or waiter.future.done():
            return None
        return waiter.sent_at

    def granted(self, lease: str) -> None:
        """Redis handed `lease` (a waiter's id, or one granted less than it asked) a slot:
        admit its waiter, or pass the slot on."""
        waiter = self.waiters.named(waiter_id(lease))
        if waiter is None:
            if lease not in self.held:  # it ended here already: give the slot back
                self.sync.remove(lease)
                self._unused(lease, "g" + grant_handle(lease))
            return
        if waiter.future.done():  # cancelled with its task: counted when it leaves
            self.waiters.end(waiter)
            if waiter.registered:
                self.sync.remove(lease)
                self._unused(lease, "g" + grant_handle(lease))
            return
        self._admit(waiter, lease, "g" + grant_handle(lease))

    def _unused(self, lease: str, charged: str) -> None:
        """`lease` was handed to a waiter that had ended: its estimate goes back to the
        budgets (a grant's only once: its record in Redis is taken as it is)."""
        budget, tokens = self._store.budget, lease_tokens(lease)
        if budget is not None and tokens is not None:
            budget.unused(tokens, charged)

    def _admit(self, waiter: Waiter, lease: str, charged: str) -> None:
        """`waiter` holds `lease` (and, with budgets, its estimate charged at `charged`)."""
        budget = self._store.budget
        if budget is None or waiter.tokens is None:
            self.waiters.admitted(waiter)
        else:
            self.waiters.admitted(waiter, budget.reserved(waiter.tokens, charged))
        self.held[lease] = waiter.sent_at  # (its deadline was set then, or renewed since)
        if lease != waiter.id:  # granted the whole of a limit shrunk under its weight
            self.counts.cap(self._describe, waiter.weight, lease_weight(lease))
        waiter.future.set_result("admitted")

    # --- while Redis is away -----------------------------------------------------------

    def _unreachable(self, waiter: Waiter) -> None:
        """End `waiter` as "unavailable", or admit it through the local fallback."""
        if not waiter.unavailable:  # (a waiter moved to Redis can find it away again)
            waiter.unavailable = True
            self.unavailable += 1
        fallback = self.fallback
        if fallback is None:  # redis_unavailable="refuse"
            self.waiters.end(waiter)
            waiter.future.set_result("unavailable")
            return
        admitted = fallback.admit(waiter.weight, lambda _: self._fallback_admitted(waiter))
        if isinstance(admitted, asyncio.Future):
            waiter.fallback = admitted
            return
        if admitted == "shed":  # the local queue is full too
            self.waiters.end(waiter)
            self.counts.shed_one()
        else:
            self.waiters.admitted(waiter)
            self._hold_fallback(waiter)
        waiter.future.set_result(admitted)

    def _hold_fallback(self, waiter: Waiter) -> None:
        """A fallback slot was taken for `waiter`: it gets an id, so that once Redis answers
        again the heartbeat registers it as a lease before anything more is granted."""
        lease = self._new_id(waiter)
        self.sync.register_later(lease)  # (first: never a held slot the heartbeat finds lost)
        self.held.hold_fallback(lease)

    def _fallback_admitted(self, waiter: Waiter) -> None:
        inner = waiter.fallback
        if not self.waiters.current(waiter) or inner is None:
            return  # it ended here (timeout, leave, close), which left the fallback
        if waiter.future.done() or inner.cancelled():  # cancelled with its task
            self.waiters.end(waiter)
            if self.fallback is not None:
                self.fallback.leave(inner)
            return
        if not self.sync.refusing():  # Redis is back: it, not the fallback, admits now
            self._queue_in_redis(waiter)
            return
        self.waiters.admitted(waiter)
        self._hold_fallback(waiter)
        waiter.future.set_result("admitted")

    def redis_back(self) -> None:
        """A renewal worked after Redis was away: the fallback's waiters queue in Redis."""
        for waiter in self.waiters.all():
            if waiter.fallback is not None and not waiter.future.done():
                self._queue_in_redis(waiter)

    def leases_lost(self, leases: tuple[str, ...]) -> None:
        """The heartbeat could not renew `leases` within the lease: said, and handed to the
        hook (whose failure never reaches the limit)."""
        _log.warning(
            "gym_concurrency: %s could not renew %d leases within lease_seconds=%s (Redis at "
            "%s unreachable, or this process stopped): their holders run on here while "
            "Redis may grant their slots to others; this process admits %s until Redis "
            "counts them again (leases: %s)",
            self._describe,
            len(leases),
            self._lease_seconds,
            self._store.redis_url,
            "nothing more" if self.fallback is None else "only through its local fallback",
            ", ".join(leases),
        )
        hook = self._on_lease_lost
        if hook is not None:
            try:
                hook(leases)
            except Exception:  # a hook's failure never reaches the limit
                _log.exception("gym_concurrency: %s: on_lease_lost failed", self._describe)

    # --- read at export ------------------------------------------------------------------

    def flow_statistics(self) -> list[FlowStatistics]:
        """Every flow that holds weight or waits here: its slots' weight (the fallback's
        too), its waiters and their weight. Read from the exporter's thread too: each from a
        copy taken at once."""
        held: dict[str | None, int] = {}
        for lease in list(self.held):
            flow = lease_flow(lease)
            held[flow] = held.get(flow, 0) + lease_weight(lease)
        waiting: dict[str | None, tuple[int, int]] = {}
        for waiter in self.waiters.all():
            depth, weight = waiting.get(waiter.flow, (0, 0))
            waiting[waiter.flow] = (depth + 1, weight + waiter.weight)
        flows = held.keys() | waiting.keys()
        return [FlowStatistics(f, held.get(f, 0), *waiting.get(f, (0, 0))) for f in flows]


def _ends_within(waiter: Waiter, seconds: float) -> bool:
    """True if `waiter`'s timeout or deadline comes before `seconds` from now."""
    timer = waiter.timer
    return timer is not None and timer.when() - asyncio.get_running_loop().time() < seconds
