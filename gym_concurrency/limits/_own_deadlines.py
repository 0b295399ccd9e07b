"""MeteredSemaphore's waiters with a deadline of their own: how late each may be admitted,
refused at once when that cannot be met, refused when it passes (both end "deadline", counted
as a timeout); the state is the semaphore's own, deadlines.py keeps the timers and the rate."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Hashable

from .deadlines import OwnDeadlines, check_deadline
from .flows import FlowQueues
from .limit import Admission

__all__ = ["OwnDeadlinesMixin"]

Waiter = asyncio.Future[Admission]


class OwnDeadlinesMixin:
    """The deadline side of MeteredSemaphore."""

    _deadlines: OwnDeadlines | None
    _flows: FlowQueues
    _queue: OrderedDict[Waiter, float | None]
    _limit: int
    _timeouts: int

    def _unqueue(self, waiter: Waiter) -> bool:
        raise NotImplementedError

    def _admit_waiters(self) -> None:
        raise NotImplementedError

    def _admission_bound(
        self, waiter: Waiter, weight: int, flow: Hashable, deadline: float
    ) -> float:
        """The latest `waiter` may be admitted and still finish within `deadline` (deadlines.py);
        it ends with "deadline" at once if that cannot be met: past, or more weight ahead of it
        (in its flow, when flows wait) than the measured rate hands out by then."""
        deadlines = self._own_deadlines()
        bound = deadlines.bound(check_deadline(type(self).__name__, deadline), self._limit)
        flows = self._flows
        ahead = flows.queued_weight_of(flow) if flows else len(self._queue)
        if deadlines.hopeless(ahead + weight, bound):
            self._timeouts += 1  # counted as a timeout, answered as its own refusal
            waiter.set_result("deadline")
        return bound

    def handover_wait(self) -> float | None:
        """Seconds until the weight queued now, and one more, would be handed out at the
        measured hand-over rate; None before waiters with deadlines have measured one."""
        deadlines = self._deadlines
        if deadlines is None:
            return None
        flows = self._flows
        return deadlines.clears_in((flows.queued_weight if flows else len(self._queue)) + 1)

    def _own_deadlines(self) -> OwnDeadlines:
        if self._deadlines is None:
            self._deadlines = OwnDeadlines()
        return self._deadlines

    def _expire_one(self, waiter: Waiter) -> None:
        """`waiter`'s own deadline passed: its wait ends "deadline" if it still waits."""
        if waiter not in self._queue:
            return
        chosen = self._unqueue(waiter)
        if not waiter.done():  # else cancelled with its task, which counts it when it leaves
            self._timeouts += 1
            waiter.set_result("deadline")
        if chosen and self._queue:
            self._admit_waiters()  # the capacity held for it moves on
