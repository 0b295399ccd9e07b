"""The one shape of "a limit": what the observer, the status view, the middleware and the
outbound clients read and call, whatever kind of limit it is (a process's MeteredSemaphore, a
limit shared across processes).

Every admission takes a `weight` (an int >= 1, default 1: `limit`, `active` and `available`
count weight) and a `flow` (any hashable, default None): freed capacity goes to the head of the
waiting flow that holds the least weight (FIFO within a flow); see flows.py.

Admission without raising: `try_acquire()` takes a free slot at once; otherwise `enqueue()`
returns a future that ends with an `Admission`: "admitted" (the slot is held), or a `Refusal`:
"timeout" (the limit's own timeout), "deadline" (the waiter's own deadline passed, or cannot be
met), "shed" (the queue was full; the future is then done already), "unavailable" (a shared
limit could not be reached), or, on a limit with an upstream (a rate budget, an engine signal:
upstream.py), "budget" / "saturated" (the upstream could not take it in time). The task that
awaited the future calls `settle(waiter)` once it resumes and keeps what it got (`settle`
returns the BudgetReservation taken with the slots, to close from the call's usage; None for a
waiter that said it charges `in_full`, charged already), or, if it gives up (its client left,
its task was cancelled), `leave(waiter)`, which also passes on a slot handed to it in that same
moment (and cancels its reservation).
`wait_in_queue()` does both; every caller of `enqueue()` ends its wait one of these two ways.
State is read as one frozen `statistics()` value, as anyio's CapacityLimiter answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, get_args

if TYPE_CHECKING:
    from ..usage import Usage
    from .flows import FlowStatistics
    from .rate_budget import BudgetReservation

__all__ = [
    "REFUSALS",
    "UPSTREAM_REFUSALS",
    "Admission",
    "DeadlineExceededError",
    "GlobalStatistics",
    "Held",
    "Hold",
    "Limit",
    "LimitConfigurationError",
    "LimitScope",
    "LimitStatistics",
    "LimitUnavailableError",
    "QueueFullError",
    "Refusal",
    "UpstreamCapacityError",
    "WaitOutcome",
    "wait_in_queue",
]

Refusal = Literal["timeout", "deadline", "shed", "unavailable", "budget", "saturated"]
"""How an admission fails: no slot within the limit's timeout, nor (or never) within the
waiter's own deadline, a full queue, an unreachable store, a rate budget that could not (or
never in time) hold it, an engine that stayed saturated."""
Admission = Literal["admitted", Refusal]
"""How a wait in a limit's queue ends."""
WaitOutcome = Literal[Admission, "cancelled"]
"""How a wait ended as its waiter saw it: an `Admission`, or it left (cancelled)."""
LimitScope = Literal["process", "global"]

UPSTREAM_REFUSALS: tuple[Refusal, ...] = ("budget", "saturated")
"""The refusals only a limit with an upstream (a rate budget, an engine signal) makes."""
REFUSALS: tuple[Refusal, ...] = get_args(Refusal)
"""Every refusal (a route prepares an answer for each); UPSTREAM_REFUSALS among them."""


class DeadlineExceededError(TimeoutError):
    """Raised by a limit's `acquire()` when the waiter's own deadline (`deadline=`, or what is
    left of the request's) passed before a slot was free, or cannot be met at the rate the
    limit hands slots out; a TimeoutError, counted as the limit's timeout."""


class UpstreamCapacityError(TimeoutError):
    """Raised by a limit's `acquire()` when its upstream kept it out: `reason` "budget" (the
    rate budget could not hold the estimate in time, or never within the waiter's timeout or
    deadline) or "saturated" (the engine signal did not admit); `retry_after`: seconds until
    the budget would hold it (None: not known). A TimeoutError, counted as the limit's
    timeout and in `admission_budget` / `admission_saturated`."""

    def __init__(
        self, message: str, reason: Literal["budget", "saturated"], retry_after: float | None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class QueueFullError(Exception):
    """Raised by a limit's `acquire()` when `max_queue` tasks are already waiting."""


class LimitUnavailableError(Exception):
    """Raised by a shared limit's `acquire()` when its store (Redis) cannot be reached (and
    `redis_unavailable="refuse"`)."""


class LimitConfigurationError(Exception):
    """Raised by a shared limit's `connect()` when it is misconfigured rather than its store
    unreachable: authentication or authorization refused, TLS that cannot work, a store
    without the commands it needs, or a size that disagrees with the processes sharing the
    limit. The message names the store's URL without its password."""


@dataclass(frozen=True, slots=True)
class GlobalStatistics:
    """A limit shared across processes, across all of them as last seen (no Redis call)."""

    active: int  # weight held in every process
    queue_depth: int  # waiters queued in every process
    connected: bool  # False while the store is known to be unreachable
    queued_weight: int = 0  # the weight they ask for
    flows: int = 0  # flows with a waiter in every process (one queue: 0 or 1 for now)


@dataclass(frozen=True, slots=True)
class LimitStatistics:
    """One reading of a limit's state, in plain numbers (this process's share for a global
    limit; `available` across every process)."""

    limit: int
    active: int
    available: int
    queue_depth: int
    admission_timeouts: int
    admission_cancelled: int
    admission_shed: int
    queued_weight: int = 0  # the weight the waiters ask for
    flows: int = 0  # flows with a waiter now
    admission_unavailable: int | None = None  # global limits only
    admission_lease_lost: int | None = None  # global limits only
    shared: GlobalStatistics | None = None  # global limits only
    admission_budget: int = 0  # refused "budget" (also in admission_timeouts)
    admission_saturated: int = 0  # refused "saturated" (also in admission_timeouts)


class Limit(Protocol):
    """A concurrency limit: plain-number state read at export, and admission by slot."""

    @property
    def limit(self) -> int: ...
    @property
    def active(self) -> int: ...
    @property
    def available(self) -> int: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def queued_weight(self) -> int: ...
    @property
    def admission_timeouts(self) -> int: ...
    @property
    def admission_cancelled(self) -> int: ...
    @property
    def admission_shed(self) -> int: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def max_queue(self) -> int | None: ...
    @property
    def component(self) -> str | None: ...
    @property
    def limit_name(self) -> str | None: ...
    @property
    def server(self) -> str | None: ...
    @property
    def scope(self) -> LimitScope: ...

    def statistics(self) -> LimitStatistics:
        """The limit's state now, read at once (with a global limit's extra state)."""
        ...

    def try_acquire(
        self, weight: int = 1, flow: Hashable = None, *, tokens: int | None = None
    ) -> bool:
        """Take `weight` (and `tokens` of its upstream, charged in full) without waiting
        (never ahead of a waiter); True if taken."""
        ...

    def enqueue(
        self,
        weight: int = 1,
        flow: Hashable = None,
        deadline: float | None = None,
        *,
        tokens: int | None = None,
        in_full: bool = False,
    ) -> asyncio.Future[Admission]:
        """Join the queue asking `tokens` of its upstream (None: the weight); the future ends
        with how the wait ended (done at once if shed). `in_full`: the caller charges what it
        is handed in full, never settles it: a limit may admit it from its budget's allowance,
        with no reservation for `settle()` to return."""
        ...

    def flow_statistics(self) -> list[FlowStatistics]:
        """Every flow that holds weight or waits now (the default flow is None)."""
        ...

    def settle(self, waiter: asyncio.Future[Admission]) -> BudgetReservation | None:
        """The task awaiting `waiter` resumed and keeps what the wait ended with: a slot
        handed to it is its own from now on, and so is the budget's reservation returned
        (None: none), for it to settle, charge in full or cancel."""
        ...

    def leave(self, waiter: asyncio.Future[Admission], *, cancelled: bool = True) -> None:
        """Give up waiting: counted as cancelled (if `cancelled`) unless the wait had ended;
        a slot handed to `waiter` at that moment passes on."""
        ...

    def release(self, weight: int = 1, flow: Hashable = None) -> None:
        """Give back `weight` held by `flow` (what it was acquired with)."""
        ...

    def refuse(self, waiter: asyncio.Future[Admission]) -> bool:
        """End a queued `waiter`'s wait with "unavailable" (shutting down); True if it was."""
        ...

    def resize(self, limit: int) -> None:
        """Change the number of slots; held slots are never revoked."""
        ...

    async def acquire(
        self,
        weight: int = 1,
        flow: Hashable = None,
        *,
        deadline: float | None = None,
        tokens: int | None = None,
    ) -> Literal[True]:
        """Take `weight` for `flow` (and `tokens` of its upstream, charged in full), waiting in
        fair order at most `timeout` or `deadline` seconds (the sooner); TimeoutError
        (DeadlineExceededError for the deadline, UpstreamCapacityError for the upstream) /
        QueueFullError / LimitUnavailableError, or cancellation (leaving the queue)."""
        ...

    def hold(self, weight: int = 1, flow: Hashable = None, *, tokens: int | None = None) -> Hold:
        """`async with limit.hold(weight, flow, tokens=) as held:` acquires on enter (`held`:
        its reservation, to settle), releases on exit."""
        ...

    async def __aenter__(self) -> None:
        """`acquire()`."""
        ...

    async def __aexit__(self, *exc: object) -> None:
        """`release()`."""
        ...


class Reserving(Protocol):
    """What `Hold` asks of a limit (LimitBase provides it)."""

    async def _reserve(
        self, weight: int, flow: Hashable, deadline: float | None, tokens: int | None, in_full: bool
    ) -> BudgetReservation | None: ...
    def release(self, weight: int = 1, flow: Hashable = None) -> None: ...


class Held:
    """What `async with limit.hold(...) as held:` holds besides slots: the rate budget's
    `reservation` taken with them (None: the limit has no budget; kept in the process or, for
    a shared limit, in Redis: closed the same way). `settle(usage)` closes it from what the
    call used, `cancel()` for a call never sent; left open, the exit charges it in full (the
    call may have cost all of it)."""

    __slots__ = ("reservation",)

    def __init__(self, reservation: BudgetReservation | None) -> None:
        self.reservation = reservation

    def settle(self, usage: Usage | int) -> None:
        """Charge what the call used (a Usage, or a total of tokens): the rest is refunded."""
        if self.reservation is not None:
            self.reservation.settle(usage)

    def cancel(self) -> None:
        """The call was never sent: the whole reservation, its request too, comes back."""
        if self.reservation is not None:
            self.reservation.cancel()

    def close(self) -> None:
        """Charge the reservation in full unless it was settled or cancelled."""
        if self.reservation is not None and self.reservation.open:
            self.reservation.charge_in_full()


class Hold:
    """`limit.hold(weight, flow, tokens=)`: acquire on enter, release the same on exit."""

    __slots__ = ("_flow", "_held", "_limit", "_tokens", "_weight")

    def __init__(
        self, limit: Reserving, weight: int, flow: Hashable, tokens: int | None = None
    ) -> None:
        self._limit = limit
        self._weight = weight
        self._flow = flow
        self._tokens = tokens
        self._held: Held | None = None

    async def __aenter__(self) -> Held:
        limit = self._limit  # its reservation settled by the caller (`held.settle`) or the exit
        reservation = await limit._reserve(self._weight, self._flow, None, self._tokens, False)
        self._held = Held(reservation)
        return self._held

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._held is not None:
                self._held.close()
        finally:
            self._held = None
            self._limit.release(self._weight, self._flow)


async def wait_in_queue(
    limit: Limit, weight: int = 1, flow: Hashable = None, deadline: float | None = None
) -> Admission:
    """Join `limit`'s queue and wait for how it ends, at most `deadline` seconds besides the
    limit's timeout (the request's: `deadline.deadline_remaining()`, as `acquire()` passes);
    cancelled, leave the queue (a slot handed over at that moment passes on) and re-raise.
    A reservation handed with the slot is charged in full: nothing here can settle it."""
    waiter = limit.enqueue(weight, flow, deadline, in_full=True)
    try:
        admission = await waiter
    except asyncio.CancelledError:
        limit.leave(waiter)
        raise
    reservation = limit.settle(waiter)
    if reservation is not None:
        reservation.charge_in_full()
    return admission
