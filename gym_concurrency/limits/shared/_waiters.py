"""This process's waiters of one shared limit: found by their future (the caller's handle)
and, while they queue in Redis, by their id (how Redis names them in grants); once admitted,
what each asked for until its task resumes."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable

from ..limit import Admission
from ._budget import SharedReservation

__all__ = ["Handed", "Waiter", "Waiters"]

Handed = tuple[int, str | None, SharedReservation | None]
"""What an admitted waiter was handed: its weight, its flow, its budgets' reservation."""


class Waiter:
    """One local wait for `weight` in `flow`: `id` while it queues in Redis (None once it
    waits in the fallback), `registered` once Redis has its ticket (`sent_at`: when it was sent,
    monotonic), `fallback` its future in the local fallback, `tokens` its estimate for the
    limit's rate budgets (None: none)."""

    __slots__ = (
        "fallback", "flow", "future", "id", "registered", "sent_at", "timer", "tokens",
        "unavailable", "weight",
    )  # fmt: skip

    def __init__(
        self,
        ident: str | None,
        future: asyncio.Future[Admission],
        weight: int = 1,
        flow: str | None = None,
        tokens: int | None = None,
    ) -> None:
        self.id = ident
        self.tokens = tokens
        self.future = future
        self.weight = weight
        self.flow = flow
        self.registered = False
        self.sent_at = -math.inf
        self.timer: asyncio.TimerHandle | None = None
        self.fallback: asyncio.Future[Admission] | None = None
        self.unavailable = False  # counted in admission_unavailable (once per arrival)


class Waiters:
    """The waiters of this process in arrival order, each with its timeout timer; `weight`
    is what they ask for together."""

    __slots__ = ("_by_future", "_by_id", "_handed", "weight")

    def __init__(self) -> None:
        self._by_future: dict[asyncio.Future[Admission], Waiter] = {}
        self._by_id: dict[str, Waiter] = {}  # queued (or queueing) in Redis
        # Admitted, their task not resumed yet: what each was handed.
        self._handed: dict[asyncio.Future[Admission], Handed] = {}
        self.weight = 0

    def __len__(self) -> int:
        return len(self._by_future)

    def add(
        self,
        waiter: Waiter,
        timeout: float | None,
        loop: asyncio.AbstractEventLoop,
        on_timeout: Callable[[Waiter], None],
    ) -> Waiter:
        """Keep `waiter`; `on_timeout(waiter)` runs after `timeout` seconds unless it ends."""
        self._by_future[waiter.future] = waiter
        self.weight += waiter.weight
        if waiter.id is not None:
            self._by_id[waiter.id] = waiter
        if timeout is not None:
            waiter.timer = loop.call_later(timeout, on_timeout, waiter)
        return waiter

    def end(self, waiter: Waiter) -> None:
        """Forget `waiter` (it was admitted, refused, timed out or left)."""
        if self._by_future.pop(waiter.future, None) is not None:
            self.weight -= waiter.weight
        if waiter.id is not None:
            self._by_id.pop(waiter.id, None)
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None

    def admitted(self, waiter: Waiter, reservation: SharedReservation | None = None) -> None:
        """`waiter` was handed its slot (and `reservation`): it waits no more, and what it was
        handed is kept until its task resumes (`settled()`): a task that leaves at that moment
        gives that back."""
        self.end(waiter)
        self._handed[waiter.future] = (waiter.weight, waiter.flow, reservation)

    def settled(self, future: asyncio.Future[Admission]) -> Handed | None:
        """The task awaiting `future` resumed: what it was handed (None if not admitted)."""
        return self._handed.pop(future, None)

    def forget_id(self, waiter: Waiter) -> None:
        """`waiter` no longer queues in Redis (it waits for the fallback, or is refused)."""
        if waiter.id is not None:
            self._by_id.pop(waiter.id, None)
            waiter.id = None

    def name(self, waiter: Waiter, ident: str) -> None:
        """`waiter` (waiting here) queues in Redis from now on, as `ident`."""
        waiter.id = ident
        waiter.registered = False
        self._by_id[ident] = waiter

    def current(self, waiter: Waiter) -> bool:
        """True while `waiter` waits here."""
        return self._by_future.get(waiter.future) is waiter

    def of(self, future: asyncio.Future[Admission]) -> Waiter | None:
        """The waiter whose future is `future`, while it waits."""
        return self._by_future.get(future)

    def named(self, ident: str) -> Waiter | None:
        """The waiter queued in Redis as `ident`."""
        return self._by_id.get(ident)

    @property
    def queued_in_redis(self) -> bool:
        """True while any waiter queues (or is being queued) in Redis."""
        return bool(self._by_id)

    def registered_ids(self, at_most: int | None = None) -> list[str]:
        """Ids of waiters Redis has a ticket for, oldest first (`at_most` of them). Safe from
        the heartbeat thread: the dict is copied at once (under the GIL) before it is read."""
        registered = (ident for ident, w in list(self._by_id.items()) if w.registered)
        return list(registered if at_most is None else itertools.islice(registered, at_most))

    def flows(self) -> int:
        """How many flows the waiters here are in (read at export: O(waiters))."""
        return len({waiter.flow for waiter in self._by_future.values()})

    def all(self) -> list[Waiter]:
        """Every waiter, oldest first."""
        return list(self._by_future.values())

    def clear(self) -> None:
        self._by_future.clear()
        self._by_id.clear()
        self._handed.clear()
        self.weight = 0
