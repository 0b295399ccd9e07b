"""What every kind of limit shares, written once: identity, the failure counts (read from the
AdmissionCounts the kind holds), `leave()`'s accounting, `acquire()`'s mapping of a refusal to
its exception, and argument checks.

A kind of limit subclasses `LimitBase`, hands it the AdmissionCounts it counts in, and
provides the slots (`limit`, `active`, `available`, `queue_depth`, `try_acquire`, `enqueue`,
`release`, `resize`) plus `_forget(waiter)`, which takes a waiter still queued out of its
queue. A kind that takes an upstream (`budget=`, `engine=`: upstream.py) provides
`_reserve()` too.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Hashable
from typing import TYPE_CHECKING, ClassVar, Literal

from ..deadline import deadline_remaining
from .admission_counts import AdmissionCounts
from .asks import check_tokens
from .deadlines import check_deadline
from .flows import FlowStatistics
from .limit import (
    Admission,
    DeadlineExceededError,
    Hold,
    LimitScope,
    LimitStatistics,
    LimitUnavailableError,
    QueueFullError,
    Refusal,
    UpstreamCapacityError,
    wait_in_queue,
)
from .registry import register
from .upstream import Upstream, UpstreamRefusal

if TYPE_CHECKING:
    from ..engines.signal import EngineSignal
    from .rate_budget import BudgetReservation, RateBudget

__all__ = ["LimitBase", "check_count", "check_seconds"]


class LimitBase:
    """Identity, counters and the admission logic common to every kind of limit."""

    _scope: ClassVar[LimitScope] = "process"
    _label: ClassVar[str] = "limit"  # how messages name a limit of this kind

    def __init__(
        self,
        *,
        component: str | None,
        limit_name: str | None,
        server: str | None,
        timeout: float | None,
        max_queue: int | None,
        counts: AdmissionCounts,
        budget: RateBudget | None = None,
        engine: EngineSignal | None = None,
    ) -> None:
        owner = type(self).__name__
        check_seconds(owner, "timeout", timeout, optional=True)
        if max_queue is not None:
            check_count(owner, "max_queue", max_queue)
        self._upstream = None if budget is None and engine is None else Upstream(budget, engine)
        self._component = component
        self._limit_name = limit_name
        self._server = server
        self._timeout = timeout
        self._max_queue = max_queue
        self._counts = counts  # held by the kind: written where each wait ends, read here

    def _register(self) -> None:
        """List this limit for the observer and the status view, if it is named."""
        if self._component is not None and self._limit_name is not None:
            register(self)

    # --- identity and counters -------------------------------------------------------

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

    @property
    def timeout(self) -> float | None:
        """Seconds an acquire may wait, or None to wait forever."""
        return self._timeout

    @property
    def max_queue(self) -> int | None:
        """How many tasks may wait at once, or None for no bound."""
        return self._max_queue

    @property
    def admission_timeouts(self) -> int:
        """Waits (in this process) that gave up after `timeout` seconds or their own deadline
        (monotonic)."""
        return self._counts.timeouts

    @property
    def admission_cancelled(self) -> int:
        """Waits that were cancelled (monotonic)."""
        return self._counts.cancelled

    @property
    def admission_shed(self) -> int:
        """Admissions refused at once because the queue was full (a shared limit's: the
        global queue, or while Redis is away the local fallback's) (monotonic)."""
        return self._counts.shed

    @property
    def admission_budget(self) -> int:
        """Waits refused because the rate budget could not hold them in time (monotonic)."""
        return self._counts.over_budget

    @property
    def admission_saturated(self) -> int:
        """Waits that ended while the engine signal did not admit (monotonic)."""
        return self._counts.saturated

    def _end_late(self, waiter: asyncio.Future[Admission], refusal: Refusal) -> None:
        """End `waiter`'s wait with `refusal` (a timeout, counted as what it was) if it waits."""
        if not waiter.done():  # else it was cancelled with its task, counted when it leaves
            self._counts.timed_out(refusal)
            waiter.set_result(refusal)

    @property
    def admission_capped(self) -> int:
        """Waiters admitted at less weight than they asked for: heavier than the size the
        limit shrank to under them, they took all of it (monotonic)."""
        return self._counts.capped

    def _count_capped(self, asked: int, granted: int, what: str = "") -> None:
        """`asked` admitted at `granted` (the size now; `what`: a capped estimate): counted."""
        self._counts.cap(self._describe(), asked, granted, what)

    @property
    def upstream(self) -> Upstream | None:
        """The rate budget and engine signal asked with the slots; None: neither."""
        return self._upstream

    @property
    def budget(self) -> RateBudget | None:
        """The rate budget each admission reserves from, if any."""
        return None if self._upstream is None else self._upstream.budget

    @property
    def engine(self) -> EngineSignal | None:
        """The engine signal each admission asks, if any."""
        return None if self._upstream is None else self._upstream.engine

    def _estimate(self, weight: int, tokens: int | None) -> int:
        """What an ask reserves of the upstream: `tokens` (checked), else the weight; capped
        at the budget's minute (counted in `admission_capped`: no waiter waits forever)."""
        asked = weight if tokens is None else check_tokens(type(self).__name__, tokens)
        upstream = self._upstream
        capped = asked if upstream is None else upstream.capped(asked)
        if capped < asked:
            self._count_capped(asked, capped, "an estimate of tokens")
        return capped

    @property
    def scope(self) -> LimitScope:
        """ "process" for a process's own limit, "global" for one shared across processes."""
        return self._scope

    # --- provided by each kind -------------------------------------------------------

    @property
    def limit(self) -> int:
        """The number of slots."""
        raise NotImplementedError

    @property
    def active(self) -> int:
        """Slots held (in this process) now."""
        raise NotImplementedError

    @property
    def available(self) -> int:
        """Slots free now: `limit - active`, or 0 while a shrunk limit drains."""
        return max(0, self.limit - self.active)

    @property
    def queue_depth(self) -> int:
        """Tasks (of this process) waiting for a slot now."""
        raise NotImplementedError

    def try_acquire(
        self, weight: int = 1, flow: Hashable = None, *, tokens: int | None = None
    ) -> bool:
        """Take `weight` (and `tokens` of the upstream) at once, never ahead of a waiter."""
        raise NotImplementedError

    def enqueue(
        self,
        weight: int = 1,
        flow: Hashable = None,
        deadline: float | None = None,
        *,
        tokens: int | None = None,
        in_full: bool = False,
    ) -> asyncio.Future[Admission]:
        """Join the queue (asking `tokens` of the upstream, charged `in_full` or settled); the
        future ends with the wait."""
        raise NotImplementedError

    def release(self, weight: int = 1, flow: Hashable = None) -> None:
        """Give back `weight` held by `flow`; ValueError if it holds less."""
        raise NotImplementedError

    @property
    def queued_weight(self) -> int:
        """The weight the waiters ask for (each asks for 1 unless a kind says otherwise)."""
        return self.queue_depth

    @property
    def waiting_flows(self) -> int:
        """Flows with a waiter now."""
        return int(self.queue_depth > 0)

    def flow_statistics(self) -> list[FlowStatistics]:
        """Every flow that holds weight or waits now: here, only the default flow (None)."""
        active, waiting = self.active, self.queue_depth
        flow = FlowStatistics(None, active, waiting, self.queued_weight)
        return [flow] if active or waiting else []

    def resize(self, limit: int) -> None:
        """Change the number of slots; held slots are never revoked."""
        raise NotImplementedError

    def locked(self) -> bool:
        """True if `acquire()` would wait (or fail) rather than take a slot at once."""
        raise NotImplementedError

    def __repr__(self) -> str:
        # asyncio's shape ("... object at 0x... [unlocked, value:1]"), named, sized, held;
        # never raising: the status view logs a limit whose state cannot be read.
        name = f" {self._component}/{self._limit_name}" if self._limit_name else ""
        head = f"<{type(self).__name__}{name} object at {id(self):#x}"
        try:
            state = "locked" if self.locked() else f"unlocked, value:{self.available}"
            state += f", waiters:{self.queue_depth}" if self.queue_depth else ""
            return f"{head} limit={self.limit} active={self.active} [{state}]>"
        except Exception:
            return f"{head} [unreadable]>"

    def _forget(self, waiter: asyncio.Future[Admission]) -> bool:
        """Take `waiter` out of the queue if it is still there (True), undoing what it queues."""
        raise NotImplementedError

    def settle(self, waiter: asyncio.Future[Admission]) -> BudgetReservation | None:
        """The task awaiting `waiter` resumed with its wait ended; a kind that holds slots
        back for waiters not yet resumed (MeteredSemaphore) ends that hand-over here, and
        hands over the reservation taken with them (None: none)."""
        return None

    def _queue_full(self) -> str:
        """What a QueueFullError says after the limit's name."""
        return f"{self.queue_depth} tasks already waiting (max_queue={self._max_queue})"

    def statistics(self) -> LimitStatistics:
        """The limit's state now, read at once."""
        counts = self._counts
        return LimitStatistics(
            limit=self.limit,
            active=self.active,
            available=self.available,
            queue_depth=self.queue_depth,
            admission_timeouts=counts.timeouts,
            admission_cancelled=counts.cancelled,
            admission_shed=counts.shed,
            queued_weight=self.queued_weight,
            flows=self.waiting_flows,
            admission_budget=counts.over_budget,
            admission_saturated=counts.saturated,
        )

    def _describe(self) -> str:
        if self._limit_name is None:
            return type(self).__name__
        if self._component is None:
            return f"{self._label} {self._limit_name}"
        return f"{self._label} {self._component}/{self._limit_name}"

    # --- admission -------------------------------------------------------------------

    async def acquire(
        self,
        weight: int = 1,
        flow: Hashable = None,
        *,
        deadline: float | None = None,
        tokens: int | None = None,
    ) -> Literal[True]:
        """Take `weight` for `flow`, waiting in fair order at most `timeout` or `deadline`
        seconds (the sooner; None: what is left of the request's deadline, if one is being
        handled); raises TimeoutError (DeadlineExceededError when the deadline ended the
        wait, UpstreamCapacityError when the upstream did), QueueFullError,
        LimitUnavailableError, or cancels (leaving the queue). An upstream's `tokens` (None:
        the weight) are charged in full (`hold()`, `enqueue()` + `settle()` can settle)."""
        if deadline is not None:
            check_deadline(type(self).__name__, deadline)
        if self._asks_upstream():  # charged in full: acquire() cannot settle
            if tokens is None and self.try_acquire(weight, flow):
                return True
            reservation = await self._reserve(weight, flow, deadline, tokens, True)
            if reservation is not None:
                reservation.charge_in_full()
            return True
        if tokens is not None:
            check_tokens(type(self).__name__, tokens)
        if not self.try_acquire(weight, flow):
            if deadline is None:  # what is left of the request's, if one is being handled
                deadline = deadline_remaining()
            admission = await wait_in_queue(self, weight, flow, deadline)
            if admission != "admitted":
                raise self._refused(admission, deadline)
        return True

    def hold(self, weight: int = 1, flow: Hashable = None, *, tokens: int | None = None) -> Hold:
        """`async with limit.hold(weight, flow, tokens=) as held:` acquires on enter, releases
        on exit; `held.settle(usage)` closes its reservation, else the exit charges it."""
        return Hold(self, weight, flow, tokens)

    async def __aenter__(self) -> None:
        # acquire() without a second coroutine (asyncio's mixin awaits self.acquire()).
        if self._asks_upstream():  # its reservation charged in full
            await self.acquire()
        elif not self.try_acquire():
            deadline = deadline_remaining()
            admission = await wait_in_queue(self, 1, None, deadline)
            if admission != "admitted":
                raise self._refused(admission, deadline)

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def _refused(self, refusal: Refusal, deadline: float | None = None) -> Exception:
        """The exception `acquire()` raises for `refusal` (`deadline`: the waiter's own)."""
        if refusal == "budget" or refusal == "saturated":
            return self._upstream_refused(refusal, 1)
        if refusal == "deadline":
            return DeadlineExceededError(
                f"{self._describe()}: no slot within the deadline, {deadline} s"
            )
        if refusal == "shed":
            return QueueFullError(f"{self._describe()}: {self._queue_full()}")
        if refusal == "unavailable":
            return LimitUnavailableError(f"{self._describe()}: Redis cannot be reached")
        return TimeoutError(f"{self._describe()}: no slot within {self._timeout} s")

    def leave(self, waiter: asyncio.Future[Admission], *, cancelled: bool = True) -> None:
        """Give up waiting: counted as cancelled (unless `cancelled` is False: the request
        failed on its own) if the wait had not ended otherwise; a slot handed to `waiter` in
        that same moment passes on to the next waiter, never lost."""
        counted = int(cancelled)
        if self._forget(waiter):
            self._counts.cancel(counted)
            if not waiter.done():
                waiter.cancel()
        elif waiter.cancelled():  # its task was cancelled while awaiting it, still queued
            self._counts.cancel(counted)
        elif waiter.result() == "admitted":
            self._counts.cancel(counted)
            self._give_back(waiter)

    def refuse(self, waiter: asyncio.Future[Admission]) -> bool:
        """End `waiter`'s wait now with "unavailable" if it is still queued (True): the server
        is shutting down. Not counted as a failed admission."""
        if not self._forget(waiter):
            return False
        if not waiter.done():
            waiter.set_result("unavailable")
        return True

    async def _reserve(
        self, weight: int, flow: Hashable, deadline: float | None, tokens: int | None, in_full: bool
    ) -> BudgetReservation | None:
        """`acquire()`, returning the reservation taken with the slots for the caller to close
        (None: none; `in_full`: the caller charges it in full): `enqueue(tokens=)`, `settle`."""
        if not self._asks_upstream():
            await self.acquire(weight, flow, deadline=deadline, tokens=tokens)
            return None
        if deadline is None:  # what is left of the request's, if one is being handled
            deadline = deadline_remaining()
        waiter = self.enqueue(weight, flow, deadline, tokens=tokens, in_full=in_full)
        try:
            admission = await waiter
        except asyncio.CancelledError:
            self.leave(waiter)
            raise
        reservation = self.settle(waiter)
        if admission == "budget" or admission == "saturated":
            raise self._upstream_refused(admission, weight if tokens is None else tokens)
        if admission != "admitted":
            raise self._refused(admission, deadline)
        return reservation

    def _upstream_refused(self, refusal: UpstreamRefusal, tokens: int) -> UpstreamCapacityError:
        """The error for a wait of `tokens` the upstream ended (`refusal`)."""
        upstream = self._upstream
        assert upstream is not None, "a kind with its budget elsewhere says it itself"
        return upstream.refused(self._describe(), refusal, tokens)

    def _asks_upstream(self) -> bool:
        """True if admissions take an upstream with their slots (`upstream`; SharedLimit's is
        in Redis): `acquire()` then goes through `_reserve()`, charging in full."""
        return self._upstream is not None

    def _give_back(self, waiter: asyncio.Future[Admission]) -> None:
        """Release what was handed to `waiter`, whose task left before it resumed."""
        self.settle(waiter)
        self.release()


def check_count(owner: str, name: str, value: object, *, minimum: int = 0) -> None:
    """TypeError unless `value` is an int (not a bool); ValueError if below `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner} {name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{owner} {name} must be >= {minimum}, got {value}")


def check_seconds(owner: str, name: str, value: object, *, optional: bool = False) -> None:
    """TypeError unless `value` is a number of seconds; ValueError unless > 0 and finite."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner} {name} must be a number of seconds, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{owner} {name} must be > 0 and finite, got {value}")
