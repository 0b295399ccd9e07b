"""The one abstraction for "a limit": what the observer, the status view and the middleware
read and call, whatever kind of limit it is (a process's MeteredSemaphore, a limit shared
across processes).

Admission without raising: `try_acquire()` takes a free slot at once; otherwise `enqueue()`
returns a future that ends with an `Admission`: "admitted" (the slot is held), "timeout",
"shed" (the queue was full; the future is then done already) or "unavailable" (a shared limit
could not be reached). A waiter that gives up (its client left, its task was cancelled) calls
`leave(waiter)`, which also passes on a slot handed to it in that same moment.
"""

from __future__ import annotations

import asyncio
from typing import Literal, Protocol

__all__ = ["ADMISSION_RESULTS", "Admission", "Limit", "LimitScope", "wait_in_queue"]

Admission = Literal["admitted", "timeout", "shed", "unavailable"]
ADMISSION_RESULTS: frozenset[Admission] = frozenset({"admitted", "timeout", "shed", "unavailable"})
LimitScope = Literal["process", "global"]


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

    def try_acquire(self) -> bool:
        """Take a free slot without waiting (never ahead of a waiter); True if taken."""
        ...

    def enqueue(self) -> asyncio.Future[Admission]:
        """Join the queue; the future ends with how the wait ended (done at once if shed)."""
        ...

    def leave(self, waiter: asyncio.Future[Admission], *, cancelled: bool = True) -> None:
        """Give up waiting: counted as cancelled (if `cancelled`) unless the wait had ended;
        a slot handed to `waiter` at that moment passes on."""
        ...

    def release(self) -> None:
        """Give a held slot back."""
        ...

    def resize(self, limit: int) -> None:
        """Change the number of slots; held slots are never revoked."""
        ...

    async def acquire(self) -> Literal[True]:
        """Take a slot, waiting in FIFO order; TimeoutError / QueueFullError / cancellation."""
        ...


async def wait_in_queue(limit: Limit) -> Admission:
    """Join `limit`'s queue and wait for how it ends; cancelled, leave the queue (a slot
    handed over at that moment passes on) and re-raise."""
    waiter = limit.enqueue()
    try:
        return await waiter
    except asyncio.CancelledError:
        limit.leave(waiter)
        raise
