"""The process-local fallback of a shared limit (`redis_unavailable="local"`): while Redis
cannot be reached, admissions go through a MeteredSemaphore of `local_max_concurrent` slots."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ...engines.signal import EngineSignal
from ..limit import Admission
from ..local import MeteredSemaphore
from ._checks import RedisUnavailable

__all__ = ["Fallback", "fallback_note", "fallback_size"]


class Fallback:
    """A local semaphore standing in for the shared limit while its store is away."""

    __slots__ = ("_semaphore",)

    def __init__(self, slots: int, max_queue: int | None) -> None:
        self._semaphore = MeteredSemaphore(slots, max_queue=max_queue)

    @property
    def active(self) -> int:
        """Slots held through the fallback now."""
        return self._semaphore.active

    @property
    def available(self) -> int:
        """Slots free in the fallback now."""
        return self._semaphore.available

    def _weight(self, weight: int) -> int:
        """A weight over the fallback's size takes all of it (it could never be admitted)."""
        return min(weight, self._semaphore.limit)

    def admit(
        self, weight: int, on_admitted: Callable[[asyncio.Future[Admission]], None]
    ) -> Admission | asyncio.Future[Admission]:
        """ "admitted" (`weight` taken), "shed" (the local queue is full), or the future of
        the wait in the local queue, which calls `on_admitted(future)` when it ends."""
        semaphore, weight = self._semaphore, self._weight(weight)
        if semaphore.try_acquire(weight):
            return "admitted"
        inner = semaphore.enqueue(weight)
        if inner.done():
            return "shed"

        def ended(inner: asyncio.Future[Admission]) -> None:
            on_admitted(inner)
            # No task awaits the inner wait: its hand-over ends here (a no-op if left).
            semaphore.settle(inner)

        inner.add_done_callback(ended)
        return inner

    def leave(self, inner: asyncio.Future[Admission]) -> None:
        """Stop waiting in the local queue (a slot just handed to `inner` passes on)."""
        self._semaphore.leave(inner)

    def release(self, weight: int) -> None:
        """Give back `weight` taken through the fallback."""
        self._semaphore.release(self._weight(weight))


def fallback_note(mode: RedisUnavailable, fallback_slots: int | None) -> str:
    """What admissions do while Redis is away, as the warning of an outage says it."""
    if fallback_slots is not None:
        return "admitted through the fallback"
    if mode == "local":
        return (
            "refused, not admitted through the local fallback (a limit with a rate budget "
            "keeps it only in Redis: no process alone knows what the others spent)"
        )
    return "refused"


def fallback_size(
    local_max_concurrent: int | None, budget: object | None, engine: EngineSignal | None
) -> int | None:
    """The local fallback's slots, or None for none. A rate budget is kept only in Redis: no
    process alone knows what the others spent, so a limit with one has no fallback ("local"
    refuses too). An engine's room is the fleet's: a process alone admits at most the floor."""
    if local_max_concurrent is None or budget is not None:
        return None
    return local_max_concurrent if engine is None else min(local_max_concurrent, engine.floor)
