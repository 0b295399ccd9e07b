"""SharedLimit: one concurrency limit shared by every process that names it, through Redis.

A slot is a lease in Redis; one heartbeat per limit and process, on a thread of its own,
renews this process's leases and waiters every `lease_seconds / 3` (a dead process loses
them within `lease_seconds`). Waiters queue across processes in ticket order, are handed
their slot by whichever process frees one (in a Lua script) and woken through their
process's mailbox, with a re-check at least every second. Leases not renewed within the
lease are lost: nothing more is admitted until Redis has them again. Exported figures are
plain numbers kept in process: no Redis call from the observer.

Needs the `redis` package (the `[redis]` extra), imported only when a limit first connects.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Hashable

from ...engines.signal import EngineSignal, EngineStatistics
from .._base import LimitBase, check_count
from ..admission_counts import AdmissionCounts
from ..asks import check_tokens
from ..deadlines import check_deadline
from ..flows import FlowStatistics
from ..limit import Admission, GlobalStatistics, LimitStatistics, UpstreamCapacityError
from ..rate_budget import RateBudget, RateBudgetStatistics
from ..upstream import UpstreamRefusal
from . import scripts
from ._budget import SharedBudget, SharedReservation
from ._checks import (
    RedisUnavailable,
    check_ask,
    check_backfill,
    check_engine,
    check_key,
    check_mode,
    check_name,
    check_timing,
    check_url,
)
from ._engine import FleetEngine
from ._fallback import fallback_note, fallback_size
from ._lifecycle import Lifecycle
from ._process_state import ProcessState
from ._store import RedisStore

__all__ = ["LeaseLostHook", "SharedLimit"]

LeaseLostHook = Callable[["SharedLimit", tuple[str, ...]], None]
"""Called on the event loop with the limit and the ids of the leases it could not renew."""


class SharedLimit(LimitBase):
    """A FIFO concurrency limit shared across processes and hosts through Redis or Valkey.

    The same contract as MeteredSemaphore, globally: never more than `limit` weight held
    across all processes (a lease each admission, carrying its weight and flow), fair
    queuing by flow with the held weight and the order global (the head of the flow holding
    the least weight first, FIFO within a flow, the waiter chosen next never passed but by
    a budget's backfill, below), `timeout` and `max_queue` (the global queue) per waiter,
    each failed admission counted once in the process where it happened. When Redis cannot
    be reached, `redis_unavailable="refuse"` ends an admission "unavailable" and `"local"`
    admits it through a process-local semaphore of `local_max_concurrent` slots (registered
    as leases once Redis answers again; a limit with a `budget` refuses: the budget is kept
    only in Redis); both are counted in `admission_unavailable`. Leases this process could
    not renew within `lease_seconds` are counted in `admission_lease_lost`, logged, and
    handed to `on_lease_lost(limit, ids)`.

    `budget` (a RateBudget, "sliding" only: its sizes are read, its state is kept in Redis,
    `shared_budget`) adds rate budgets shared by every process: an admission takes its slot
    and its estimate together or neither, in the same script call; `settle()` hands the
    waiter its SharedReservation, closed as a RateBudget's Reservation is (see `_budget` and
    docs/rate-budgets.md). `engine` (an EngineSignal) sizes the limit for every process from
    the engine's /metrics, scraped by one of them at a time: `value` is then the most it
    grows to, and the floor its size until a reading lands and once one is stale (see
    `_engine` and docs/engine-signals.md, "Across replicas"). `backfill_seconds`: see
    `SharedBudget` (lighter waiters past one that only the budget holds back).

    Processes share a limit by its key: `key` if given, else `component/server/limit_name`
    (those given), under `key_prefix`. `connect()` raises LimitConfigurationError for a
    misconfiguration (authentication, TLS, missing commands, a size other processes on the
    limit disagree with). Implements `gym_concurrency.limits.Limit`.

    Its parts: `_store` (Redis, the global state as last seen), `_state` (this process's
    slots, waiters, fallback; it counts how waits end in `_counts`), `_sync` (`_state`'s
    link to Redis), `_heartbeat` (renewals, a thread), `_life` (its loop, tasks, connect and
    close), `_shared_budget` (the rate budgets kept in Redis, or None), `_engine` (or None)."""

    _scope = "global"
    _label = "shared limit"

    def __init__(
        self,
        value: int = 1,
        *,
        redis_url: str,
        component: str | None = None,
        limit_name: str | None = None,
        server: str | None = None,
        timeout: float | None = None,
        max_queue: int | None = None,
        key: str | None = None,
        key_prefix: str = "gym_concurrency",
        lease_seconds: float = 10.0,
        redis_unavailable: RedisUnavailable = "refuse",
        local_max_concurrent: int | None = None,
        redis_timeout: float = 1.0,
        max_connections: int = 64,
        on_lease_lost: LeaseLostHook | None = None,
        budget: RateBudget | None = None,
        engine: EngineSignal | None = None,
        backfill_seconds: float = 0.0,
    ) -> None:
        owner = type(self).__name__
        check_count(owner, "value", value)
        counts = AdmissionCounts()  # counted by `_state`, where waits end (cancels: here)
        super().__init__(component=component, limit_name=limit_name, server=server,
                         timeout=timeout, max_queue=max_queue, counts=counts)  # fmt: skip
        self._key = check_key(key, component, server, limit_name)
        check_engine(engine)
        check_url(redis_url)
        check_name("key_prefix", key_prefix)
        check_timing(lease_seconds, redis_timeout)
        check_mode(redis_unavailable, local_max_concurrent)
        backfill_seconds = check_backfill(owner, backfill_seconds, budget)
        check_count(owner, "max_connections", max_connections, minimum=1)
        self._lease_seconds = float(lease_seconds)
        self._mode: RedisUnavailable = redis_unavailable
        self._local_max = local_max_concurrent
        fallback_slots = fallback_size(local_max_concurrent, budget, engine)
        self._rate_budget = budget  # its sizes; its state is `_shared_budget`'s, in Redis
        self._shared_budget: SharedBudget | None = None
        if budget is not None:
            self._shared_budget = SharedBudget(
                budget, backfill_seconds, wake=lambda: self._sync.flush()
            )
        self._store = RedisStore(
            redis_url=redis_url,
            base_key=f"{key_prefix}:{{{self._key}}}:",
            lease_seconds=self._lease_seconds,
            redis_timeout=float(redis_timeout),
            max_connections=max_connections,
            limit=value if engine is None else min(value, engine.floor),  # the floor till read
            fallback_note=fallback_note(redis_unavailable, fallback_slots),
            describe=self._describe(),
            budget=self._shared_budget,
        )
        self._state = ProcessState(
            self._store, counts, fallback_slots=fallback_slots, max_queue=max_queue,
            lease_seconds=self._lease_seconds, describe=self._describe(),
            on_lease_lost=None if on_lease_lost is None else functools.partial(on_lease_lost, self),
        )  # fmt: skip
        self._sync = self._state.sync
        self._engine = None if engine is None else FleetEngine(
            engine, ceiling=value, store=self._store, describe=self._describe(),
        )  # fmt: skip
        self._life = Lifecycle(
            self._store, self._state, lease_seconds=self._lease_seconds,
            describe=self._describe, engine=self._engine,
        )  # fmt: skip
        self._heartbeat = self._life.heartbeat
        self._register()

    # --- settings --------------------------------------------------------------------

    @property
    def key(self) -> str:
        """The name every process sharing this limit uses (default: `component/server/
        limit_name`, those given)."""
        return self._key

    @property
    def backfill_seconds(self) -> float:
        """How much later than its budget would take it the oldest waiter may be admitted."""
        return 0.0 if self._shared_budget is None else self._shared_budget.backfill_seconds

    @property
    def redis_keys(self) -> dict[str, str]:
        """The Redis keys of this limit by role (mailboxes are `mailbox_prefix` + process)."""
        return dict(zip(scripts.KEY_NAMES, self._store.keys, strict=True))

    @property
    def mailbox_prefix(self) -> str:
        """The common prefix of this limit's per-process mailbox keys."""
        return self._store.mailbox_prefix

    @property
    def lease_seconds(self) -> float:
        """How long a lease outlives its process's last heartbeat."""
        return self._lease_seconds

    @property
    def redis_unavailable(self) -> RedisUnavailable:
        """What an admission does when Redis cannot be reached: "refuse" or "local"."""
        return self._mode

    @property
    def local_max_concurrent(self) -> int | None:
        """Slots of the process-local fallback ("local" mode), else None. A limit with a
        budget admits nothing through it (its budget is kept only in Redis)."""
        return self._local_max

    # --- state -----------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The global number of slots, as last seen (every Redis answer carries it)."""
        return self._store.limit

    @property
    def active(self) -> int:
        """Weight held in this process now (leases, and fallback slots while Redis was away)."""
        return self._state.held.weight

    @property
    def available(self) -> int:
        """Weight free across all processes, as last seen; 0 while a shrunk limit drains.
        While Redis cannot be reached: 0 ("refuse", or a limit with a budget), or the local
        fallback's free slots."""
        state = self._state
        if self._sync.refusing() or state.closed:
            return state.fallback.available if state.fallback is not None else 0
        return max(0, self._store.limit - self.global_active)

    @property
    def queue_depth(self) -> int:
        """Tasks of this process waiting for a slot now."""
        return len(self._state.waiters)

    @property
    def queued_weight(self) -> int:
        """The weight this process's waiters ask for."""
        return self._state.waiters.weight

    @property
    def global_active(self) -> int:
        """Weight held across all processes, as last seen (at least this process's own: a
        grant can reach it before the answer that counted it)."""
        held = self._state.held
        return max(self._store.held, held.weight - held.fallback_weight)

    @property
    def global_queue_depth(self) -> int:
        """Waiters queued across all processes, as last seen."""
        return self._store.queued

    @property
    def admission_unavailable(self) -> int:
        """Admissions in this process that could not reach Redis: refused, or admitted
        through the local fallback (monotonic)."""
        return self._state.unavailable

    @property
    def admission_lease_lost(self) -> int:
        """Leases of this process it could not renew within `lease_seconds` (Redis away):
        their work ran on while Redis may have granted their slots again (monotonic)."""
        return self._sync.lease_lost

    @property
    def budget(self) -> RateBudget | None:
        """The RateBudget this limit was given: its sizes. Its own state is not used: the
        budgets' state is in Redis (`shared_budget`, `budget_statistics()`)."""
        return self._rate_budget

    @property
    def shared_budget(self) -> SharedBudget | None:
        """The rate budgets shared across processes (settle, report, statistics), or None."""
        return self._shared_budget

    def budget_statistics(self) -> RateBudgetStatistics | None:
        """The budgets as last seen (no Redis call), or None without budgets."""
        return None if self._shared_budget is None else self._shared_budget.statistics()

    @property
    def engine(self) -> EngineSignal | None:
        """The engine signal that sizes this limit for every process, or None."""
        return None if self._engine is None else self._engine.signal

    def engine_statistics(self) -> EngineStatistics | None:
        """The engine's reading as last written or read (no Redis call), or None."""
        return None if self._engine is None else self._engine.statistics()

    @property
    def connected(self) -> bool:
        """False while Redis is known to be unreachable (or leases of this process are lost
        and not counted in Redis again yet)."""
        return not self._sync.refusing() and not self._state.closed

    def statistics(self) -> LimitStatistics:
        """This process's share, the global state as last seen, and `admission_unavailable`."""
        store, state, counts = self._store, self._state, self._counts
        return LimitStatistics(
            limit=store.limit,
            active=self.active,
            available=self.available,
            queue_depth=len(state.waiters),
            admission_timeouts=counts.timeouts,
            admission_cancelled=counts.cancelled,
            admission_shed=counts.shed,
            queued_weight=state.waiters.weight,
            flows=state.waiters.flows(),
            admission_unavailable=state.unavailable,
            admission_lease_lost=self._sync.lease_lost,
            admission_budget=counts.over_budget,
            admission_saturated=counts.saturated,
            shared=GlobalStatistics(
                self.global_active,
                store.queued,
                self.connected,
                queued_weight=store.queued_weight,
                flows=store.flows,
            ),
        )

    def flow_statistics(self) -> list[FlowStatistics]:
        """Every flow that holds weight or waits in this process now (the default flow is
        None): its leases' weight (local fallback slots too), its waiters and their weight.
        Read at export, from the exporter's thread too. Across processes: `statistics().shared`."""
        return self._state.flow_statistics()

    def locked(self) -> bool:
        """True if an admission would wait (or fail) rather than be admitted at once."""
        return self.available <= 0 or bool(self._state.waiters)

    def __repr__(self) -> str:
        name = f" {self._component}/{self._limit_name}" if self._limit_name else ""
        return (
            f"<{type(self).__name__}{name} key={self._key!r} limit={self.limit} "
            f"active={self.active} queue_depth={len(self._state.waiters)}>"
        )

    def _describe(self) -> str:
        if self._limit_name is None:
            return f"SharedLimit {self._key!r}"
        return super()._describe()

    def _queue_full(self) -> str:
        return f"the global queue is full (max_queue={self._max_queue})"

    # --- admission -------------------------------------------------------------------

    def try_acquire(
        self, weight: int = 1, flow: Hashable = None, *, tokens: int | None = None
    ) -> bool:
        """Always False: a shared slot needs a round trip to Redis, so every admission goes
        through `enqueue()` (which never admits beyond the global limit)."""
        self._check_ask(weight, flow)
        if tokens is not None:
            check_tokens(type(self).__name__, tokens)
        return False

    def enqueue(
        self,
        weight: int = 1,
        flow: Hashable = None,
        deadline: float | None = None,
        *,
        tokens: int | None = None,
        in_full: bool = False,
    ) -> asyncio.Future[Admission]:
        """Join the global queue: the future ends "admitted" (the slot is held), "timeout" (the
        limit's timeout), "deadline" (`deadline` seconds from now, when sooner; at once if past),
        "shed" (the global queue was full), "unavailable" (Redis could not be reached and the
        mode is "refuse") or "budget" (the budgets could not hold `tokens`, the estimate, default
        the weight, in time). `flow` (None or a string, named alike in every process) is served
        fairly across processes, FIFO within it; `in_full` changes nothing here."""
        flow = self._check_ask(weight, flow)
        asked = weight if tokens is None else check_tokens(type(self).__name__, tokens)
        tokens = None  # (no budgets: an estimate is not used)
        if self._shared_budget is not None:
            tokens, capped = self._shared_budget.estimate(asked)
            if capped:
                self._count_capped(asked, tokens, "an estimate of tokens")
        loop = asyncio.get_running_loop() if self._state.closed else self._bind()
        deadline = None if deadline is None else check_deadline(type(self).__name__, deadline)
        return self._state.enqueue(loop, weight, flow, self._timeout, deadline, tokens)

    # LimitBase's acquire(), hold() and `async with` serve this kind as they are; these two
    # hooks say its budgets are in Redis, not in an `upstream` (a process's RateBudget).
    def _asks_upstream(self) -> bool:
        return self._shared_budget is not None

    def _upstream_refused(self, refusal: UpstreamRefusal, tokens: int) -> UpstreamCapacityError:
        budget = self._shared_budget
        if refusal != "budget" or budget is None:
            return super()._upstream_refused(refusal, tokens)
        return budget.refusal(self._describe(), tokens)

    def _forget(self, waiter: asyncio.Future[Admission]) -> bool:
        return self._state.forget(waiter)

    def settle(self, waiter: asyncio.Future[Admission]) -> SharedReservation | None:
        """The task awaiting `waiter` resumed: what it was handed is its own to release; its
        budgets' reservation (None: no budgets, or not admitted) its own to settle."""
        handed = self._state.settled(waiter)
        return None if handed is None else handed[2]

    def _give_back(self, waiter: asyncio.Future[Admission]) -> None:
        """Release what was handed to `waiter` (its weight, in its flow), whose task left
        before it resumed; its reservation is cancelled (the call was never sent)."""
        handed = self._state.settled(waiter)
        if handed is not None:
            self.release(handed[0], handed[1])
            if handed[2] is not None:
                handed[2].cancel()

    def _check_ask(self, weight: int, flow: Hashable, *, limit: bool = True) -> str | None:
        return check_ask(self._describe(), weight, flow, self._store.limit if limit else None)

    def release(self, weight: int = 1, flow: Hashable = None) -> None:
        """Give back a slot of `weight` in `flow` this process holds (a fallback slot first,
        else one of its leases, which Redis hands on fairly). ValueError if none is held."""
        self._state.release(weight, self._check_ask(weight, flow, limit=False))

    def resize(self, limit: int) -> None:
        """Set the global number of slots (in Redis: every process sees it). Growing hands
        the new slots to waiters at once in FIFO order; shrinking never revokes a held slot.
        Applied as soon as Redis answers (again). With an `engine`, the most the engine's
        readings may size it to (lowered now if above)."""
        check_count(type(self).__name__, "limit", limit)
        if self._engine is not None:
            self._engine.ceiling = limit
            if self._store.limit > limit:
                self._set_size(limit)
            return
        self._set_size(limit)

    def _set_size(self, limit: int) -> None:
        self._store.resize(limit)
        if self._life.loop is not None and not self._state.closed and not self._sync.refusing():
            self._sync.spawn(self._sync.sizes.apply())  # (else the heartbeat, once holders count)

    # --- lifecycle -------------------------------------------------------------------

    async def connect(self) -> bool:
        """Start the heartbeat and the mailbox (done by the first admission anyway) and set
        the configured size; True if Redis answered. Never raises for an unreachable Redis."""
        return await self._life.connect()

    async def close(self) -> None:
        """Stop the heartbeat, end this process's waiters "unavailable", remove its leases
        and waiters from Redis, and close the connections. Later admissions are refused
        "unavailable" (or go to the local fallback)."""
        await self._life.close()

    aclose = close  # for contextlib.aclosing()

    def _bind(self) -> asyncio.AbstractEventLoop:
        return self._life.bind()
