"""The one shape of "a limit": what the observer, the status view, the middleware and the
outbound clients read and call, whatever kind of limit it is (a process's MeteredSemaphore, a
limit shared across processes).

Every admission takes a `weight` (an int >= 1, default 1: `limit`, `active` and `available`
count weight) and a `flow` (any hashable, default None): freed capacity goes to the head of the
waiting flow that holds the least weight (FIFO within a flow); see flows.py.

Admission without raising: `try_acquire()` takes a free slot at once; otherwise `enqueue()`
returns a future that ends with an `Admission`: "admitted" (the slot is held), or a `Refusal`:
"timeout" (the limit's own timeout), "deadline" (the waiter's own deadline passed, or cannot be
met), "shed" (the queue was full; the future is then done already) or "unavailable" (a shared
limit could not be reached). The task that awaited the future calls `settle(waiter)`
once it resumes and keeps what it got, or, if it gives up (its client left, its task was
cancelled), `leave(waiter)`, which also passes on a slot handed to it in that same moment.
`wait_in_queue()` does both; every caller of `enqueue()` ends its wait one of these two ways.
State is read as one frozen `statistics()` value, as anyio's CapacityLimiter answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, get_args

if TYPE_CHECKING:
    from .flows import FlowStatistics

__all__ = [
    "REFUSALS",
    "Admission",
    "DeadlineExceededError",
    "GlobalStatistics",
    "Hold",
    "Limit",
    "LimitConfigurationError",
    "LimitScope",
    "LimitStatistics",
    "LimitUnavailableError",
    "QueueFullError",
    "Refusal",
    "WaitOutcome",
    "wait_in_queue",
]

Refusal = Literal["timeout", "deadline", "shed", "unavailable"]
"""How an admission fails: no slot within the limit's timeout, nor (or never) within the
waiter's own deadline, a full queue, an unreachable store."""
Admission = Literal["admitted", Refusal]
"""How a wait in a limit's queue ends."""
WaitOutcome = Literal[Admission, "cancelled"]
"""How a wait ended as its waiter saw it: an `Admission`, or it left (cancelled)."""
LimitScope = Literal["process", "global"]

REFUSALS: tuple[Refusal, ...] = get_args(Refusal)


class DeadlineExceededError(TimeoutError):
    """Raised by a limit's `acquire()` when the waiter's own deadline (`deadline=`, or what is
    left of the request's) passed before a slot was free, or cannot be met at the rate the
    limit hands slots out; a TimeoutError, counted as the limit's timeout."""


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

    def try_acquire(self, weight: int = 1, flow: Hashable = None) -> bool:
        """Take `weight` without waiting (never ahead of a waiter); True if taken."""
        ...

    def enqueue(
        self, weight: int = 1, flow: Hashable = None, deadline: float | None = None
    ) -> asyncio.Future[Admission]:
        """Join the queue; the future ends with how the wait ended (done at once if shed)."""
        ...

    def flow_statistics(self) -> list[FlowStatistics]:
        """Every flow that holds weight or waits now (the default flow is None)."""
        ...

    def settle(self, waiter: asyncio.Future[Admission]) -> object:
        """The task awaiting `waiter` resumed and keeps what the wait ended with: a slot
        handed to it is its own from now on (and a kind with rate budgets returns the
        reservation handed with it)."""
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
        self, weight: int = 1, flow: Hashable = None, *, deadline: float | None = None
    ) -> Literal[True]:
        """Take `weight` for `flow`, waiting in fair order at most `timeout` or `deadline`
        seconds (the sooner); TimeoutError (DeadlineExceededError for the deadline) /
        QueueFullError / LimitUnavailableError, or cancellation (leaving the queue)."""
        ...

    def hold(self, weight: int = 1, flow: Hashable = None) -> Hold:
        """`async with limit.hold(weight, flow):` acquires on enter, releases on exit."""
        ...

    async def __aenter__(self) -> None:
        """`acquire()`."""
        ...

    async def __aexit__(self, *exc: object) -> None:
        """`release()`."""
        ...


class Hold:
    """`limit.hold(weight, flow)`: acquire on enter, release the same on exit."""

    __slots__ = ("_flow", "_limit", "_weight")

    def __init__(self, limit: Limit, weight: int, flow: Hashable) -> None:
        self._limit = limit
        self._weight = weight
        self._flow = flow

    async def __aenter__(self) -> None:
        await self._limit.acquire(self._weight, self._flow)

    async def __aexit__(self, *exc: object) -> None:
        self._limit.release(self._weight, self._flow)


async def wait_in_queue(
    limit: Limit, weight: int = 1, flow: Hashable = None, deadline: float | None = None
) -> Admission:
    """Join `limit`'s queue and wait for how it ends, at most `deadline` seconds besides the
    limit's timeout (the request's: `deadline.deadline_remaining()`, as `acquire()` passes);
    cancelled, leave the queue (a slot handed over at that moment passes on) and re-raise."""
    waiter = limit.enqueue(weight, flow, deadline)
    try:
        admission = await waiter
    except asyncio.CancelledError:
        limit.leave(waiter)
        raise
    limit.settle(waiter)
    return admission
