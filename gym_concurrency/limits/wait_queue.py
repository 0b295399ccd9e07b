"""The wait queue of a MeteredSemaphore: its waiters in arrival order, each with when the
limit's timeout ends its wait; by flow once one asks for more than weight 1 of the default
flow or (a limit with an upstream) an estimate other than 1 or one to settle (flows.py); their
own deadlines and the hand-over rate (deadlines.py); the waiter chosen next, capacity held for
it until its weight fits, and who may pass it meanwhile (backfill.py).

It says who waits and who is admitted next. It ends no wait and holds no weight: the
semaphore (local.py) hands weight over, ends waits and counts how they ended.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Hashable

from .backfill import Backfill, others
from .deadlines import OwnDeadlines
from .flows import Ask, FlowQueues, Waiting
from .limit import Admission

__all__ = ["WaitQueue"]

Waiter = asyncio.Future[Admission]


class WaitQueue:
    """The waiters of one MeteredSemaphore, and the choice of the next to admit.

    `held(flow)` is the semaphore's answer to "how much weight does this flow hold now"; it
    calls `touched(flow)` whenever that changes for a flow that may be waiting. Two plain
    attributes are read on the semaphore's hot paths and written only here: `waiters` (arrival
    order: waiter -> when its timeout is due, loop time, None without one; never rebound, so
    the semaphore may keep a reference to it) and `fair`. With `estimates` (a limit with an
    upstream) each waiter asks its own estimate of it too: one other than 1, or one the caller
    settles (not `in_full`: it needs a reservation), queues every waiter by flow, as a weight
    other than 1 does. Plain FIFO, every waiter is charged in full: its upstream's allowance
    may take it (local.py).
    """

    __slots__ = (
        "_asks",
        "_backfill",
        "_deadlines",
        "_estimates",
        "_flows",
        "_keeps_estimates",
        "_next",
        "fair",
        "waiters",
    )

    def __init__(
        self, held: Callable[[Hashable], int], backfill_seconds: float, estimates: bool = False
    ) -> None:
        # O(1) removal from the middle. Every waiter has the same timeout, so the due times
        # are in queue order too: the semaphore's one timer, for the oldest, serves them all.
        self.waiters: OrderedDict[Waiter, float | None] = OrderedDict()
        # While a waiter asks for a weight other than 1, a flow other than None or an estimate
        # other than 1, every waiter is also queued by flow (`fair`) and the next one is chosen
        # fairly; with the queue empty again, plain FIFO resumes (the oldest is next, and asks
        # weight 1 and an estimate of 1).
        self.fair = False
        self._keeps_estimates = estimates
        self._flows = FlowQueues(held)
        self._asks: dict[Waiter, Ask] = {}  # the ask of each waiter queued by flow
        self._estimates: dict[Waiter, int] = {}  # what each asks of the upstream (fair only)
        self._next: Waiting | None = None  # chosen, capacity held for it until it fits
        self._backfill = Backfill(backfill_seconds) if backfill_seconds else None
        self._deadlines: OwnDeadlines | None = None  # made when a waiter first brings one

    # --- what waits ------------------------------------------------------------------

    @property
    def queued_weight(self) -> int:
        """The weight the waiters ask for."""
        return self._flows.queued_weight if self.fair else len(self.waiters)

    @property
    def waiting_flows(self) -> int:
        """Flows with a waiter now."""
        return len(self._flows) if self.fair else int(bool(self.waiters))

    def waiting(self) -> dict[Hashable, tuple[int, int]]:
        """(waiters, queued weight) of each flow with a waiter; safe to call from another
        thread (an exporter's): it reads copies taken at once."""
        if self.fair:
            return {flow: (n, weight) for flow, n, weight in self._flows.flows()}
        depth = len(self.waiters)
        return {None: (depth, depth)} if depth else {}

    @property
    def holding(self) -> bool:
        """True while a waiter is chosen next and capacity is held for it until it fits."""
        return self._next is not None

    @property
    def backfill_seconds(self) -> float:
        """How long the waiter chosen next may be passed by lighter ones that fit (0: never)."""
        return 0.0 if self._backfill is None else self._backfill.seconds

    # --- joining and leaving ---------------------------------------------------------

    def add(
        self,
        waiter: Waiter,
        weight: int,
        flow: Hashable,
        due: float | None,
        estimate: int,
        in_full: bool,
    ) -> None:
        """Queue `waiter`, asking `weight` for `flow` (and `estimate` of the upstream, charged
        `in_full` or settled, if it keeps `estimates`), its timeout due at `due` (loop time)."""
        waiters = self.waiters
        waiters[waiter] = due
        if self._deadlines is not None and len(waiters) == 1:
            self._deadlines.queue_started()
        if (
            weight == 1
            and flow is None
            and not self.fair
            and ((estimate == 1 and in_full) or not self._keeps_estimates)
        ):
            return
        flows, asks = self._flows, self._asks
        if not self.fair:  # the first such waiter: those before it wait in the default flow
            self.fair = True
            for earlier in waiters:
                if earlier is not waiter:
                    asks[earlier] = (1, None)
                    flows.push(earlier, 1, None)
        asks[waiter] = (weight, flow)
        flows.push(waiter, weight, flow)
        if self._keeps_estimates:
            self._estimates[waiter] = estimate

    def remove(self, waiter: Waiter) -> bool:
        """Take the queued `waiter` out of every queue it is in; True if it was the one chosen
        next (the capacity held for it is free to move on)."""
        del self.waiters[waiter]
        deadlines = self._deadlines
        if deadlines is not None and deadlines.timers:
            deadlines.disarm(waiter)
        if self.fair:
            _, flow = self._asks.pop(waiter)
            self._flows.remove(waiter, flow)
            if self._keeps_estimates:
                self._estimates.pop(waiter, None)
            if not self.waiters:
                self._flows.clear()
                self.fair = False
        chosen = self._next
        if chosen is None or chosen.waiter is not waiter:
            return False
        self._next = None
        return True

    def admitted(self, waiter: Waiter, weight: int) -> None:
        """The queued `waiter` was handed `weight` (counted as its flow's already): out of every
        queue, its flow's next head offered at the new held weight; counted in the rate."""
        self.remove(waiter)
        if self._deadlines is not None:
            self._deadlines.handed(weight)

    # --- who is admitted next --------------------------------------------------------

    def pop_oldest(self) -> tuple[Waiter, bool] | None:
        """Not `fair`: the oldest waiter still waiting, out of the queue, and True if its own
        deadline has passed (the loop ran late: to be refused); else it is handed weight 1 now,
        counted in the rate. None if nobody waits. Waiters cancelled with their tasks are
        dropped on the way: their tasks count them when they leave."""
        waiters = self.waiters
        deadlines = self._deadlines
        while waiters:
            waiter, _ = waiters.popitem(last=False)
            late = deadlines is not None and deadlines.disarm(waiter)
            if waiter.done():
                continue
            if deadlines is not None and not late:
                deadlines.handed(1)
            return waiter, late
        return None

    def estimate(self, waiter: Waiter) -> int:
        """What the queued `waiter` asks of the upstream (1: it was queued not `fair`, or the
        queue keeps no `estimates`)."""
        return self._estimates.get(waiter, 1)

    def choose(self) -> Waiting | None:
        """The waiter admitted next, still queued: the one capacity is held for, else (`fair`)
        flows.py's choice, else the oldest (it may be done: cancelled with its task). None if
        nobody waits."""
        if self._next is not None or self.fair:
            return self._next or self._flows.choose()
        oldest = next(iter(self.waiters), None)
        return None if oldest is None else Waiting(oldest, 1, None)

    def hold(self, chosen: Waiting) -> list[tuple[Waiter, Ask]]:
        """`chosen` does not fit yet: capacity that frees is held for it. The waiters that may
        pass it now, oldest first, with their asks (backfill.py; none without backfill)."""
        fresh, self._next = self._next is None, chosen
        if self._backfill is None:
            return []
        passers = self._backfill.passers(self.waiters, chosen.waiter, fresh)  # (its clock runs)
        if not self.fair:  # nobody behind it asks less
            return []
        asks = self._asks
        return [(waiter, asks[waiter]) for waiter in passers]

    def behind(self, chosen: Waiter) -> list[tuple[Waiter, Ask]]:
        """The first BACKFILL_SCAN waiters but `chosen`, oldest first, with their asks: those a
        budget's backfill may admit past it (upstream.py); none if not `fair`."""
        if not self.fair:
            return []
        asks = self._asks
        return [(waiter, asks[waiter]) for waiter in others(self.waiters, chosen)]

    def touched(self, flow: Hashable) -> None:
        """`fair`: `flow`'s held weight changed; offer it again at its new place, if it waits."""
        self._flows.touched(flow)

    # --- timeouts and deadlines ------------------------------------------------------

    def due(self, now: float) -> list[Waiter]:
        """The oldest waiters, whose timeout is due by `now` (still queued)."""
        due = []
        for waiter, at in self.waiters.items():
            if at is not None and at > now:
                break
            due.append(waiter)
        return due

    def next_due(self) -> float | None:
        """When the oldest waiter's timeout is due; None if nobody waits with one."""
        return next(iter(self.waiters.values()), None)

    def admission_bound(
        self, weight: int, flow: Hashable, seconds: float, limit: int
    ) -> float | None:
        """The latest (seconds from now) a waiter asking `weight` for `flow`, with `seconds`
        left, may be admitted and still finish in time (deadlines.py); None if that cannot be
        met: past, or more weight ahead of it (in its flow, when `fair`) than the measured
        rate hands out by then."""
        deadlines = self._own_deadlines()
        bound = deadlines.bound(seconds, limit)
        ahead = self._flows.queued_weight_of(flow) if self.fair else len(self.waiters)
        return None if deadlines.hopeless(ahead + weight, bound) else bound

    def arm(self, waiter: Waiter, seconds: float, expire: Callable[[Waiter], None]) -> None:
        """Call `expire(waiter)` in `seconds` (its own deadline) unless it leaves first."""
        self._own_deadlines().arm(waiter, seconds, expire)

    def late(self, waiter: Waiter) -> bool:
        """True if `waiter` has a deadline of its own that has passed."""
        return self._deadlines is not None and self._deadlines.late(waiter)

    def handover_wait(self) -> float | None:
        """Seconds until the weight queued now, and one more, would be handed out at the
        measured hand-over rate; None before waiters with deadlines have measured one."""
        if self._deadlines is None:
            return None
        return self._deadlines.clears_in(self.queued_weight + 1)

    def _own_deadlines(self) -> OwnDeadlines:
        if self._deadlines is None:
            self._deadlines = OwnDeadlines()
        return self._deadlines
