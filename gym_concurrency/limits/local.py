"""MeteredSemaphore: an asyncio.BoundedSemaphore that counts its state in plain integers, in
units of weight, and serves flows fairly (see flows.py)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Hashable

from ..deadline import deadline_remaining, request_deadline
from ._base import LimitBase, check_count
from ._own_deadlines import OwnDeadlinesMixin
from .backfill import BackfillMixin, check_backfill_seconds
from .caps import CappedHolds
from .deadlines import OwnDeadlines
from .flows import Ask, FlowQueues, FlowStatistics, Waiting
from .limit import Admission

__all__ = ["MeteredSemaphore"]

_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution

Waiter = asyncio.Future[Admission]


class MeteredSemaphore(BackfillMixin, OwnDeadlinesMixin, LimitBase, asyncio.BoundedSemaphore):
    """A bounded semaphore whose limit, holders, waiters and failed admissions are readable.

    Every call takes a `weight` (default 1) and a `flow` (default None): `limit`, `active` and
    `available` count weight; freed capacity goes to the head of the waiting flow that holds
    the least weight (FIFO within a flow; with one flow, plain FIFO). `timeout` bounds the wait
    inside `acquire()` (expiry raises TimeoutError); `max_queue` bounds the waiters (a full
    queue raises QueueFullError at once); `backfill_seconds` (default 0: never) lets lighter
    waiters that fit pass the waiter chosen next for at most that long (backfill.py). Acquire
    and release make no telemetry call: the observer reads these integers at export.
    """

    _label = "limit"

    def __init__(
        self,
        value: int = 1,
        *,
        component: str | None = None,
        limit_name: str | None = None,
        server: str | None = None,
        timeout: float | None = None,
        max_queue: int | None = None,
        backfill_seconds: float = 0.0,
    ) -> None:
        check_count(type(self).__name__, "value", value)
        self._backfill_seconds = check_backfill_seconds(type(self).__name__, backfill_seconds)
        self._backfilled = 0
        self._blocked_at = 0.0
        LimitBase.__init__(
            self,
            component=component,
            limit_name=limit_name,
            server=server,
            timeout=timeout,
            max_queue=max_queue,
        )
        asyncio.BoundedSemaphore.__init__(self, value)
        self._limit = value
        self._active = 0  # weight held, including weight handed to a waiter not yet resumed
        # Weight held by each flow but the default one (None holds the rest of `_active`);
        # a flow is kept only while it holds weight.
        self._held: dict[Hashable, int] = {}
        self._held_by_flows = 0  # the sum of `_held`
        # Waiters in arrival order, each with its deadline (loop time, None without a
        # timeout); O(1) removal from the middle. Every waiter has the same timeout, so the
        # deadlines are in queue order too: one timer, for the oldest waiter, serves them all.
        self._queue: OrderedDict[Waiter, float | None] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None
        # While a waiter asks for a weight other than 1 or a flow other than None, every waiter
        # is also queued by flow and the next one is chosen fairly; with the queue empty again,
        # plain FIFO resumes.
        self._flows = FlowQueues(self._held_by)
        self._asks: dict[Waiter, Ask] = {}  # the ask of each waiter queued by flow
        self._next: Waiting | None = None  # chosen, holding freed capacity until it fits
        # Waiters handed weight whose tasks have not resumed yet (`settle()` or `leave()` ends
        # each hand-over), with what they were handed (None: weight 1 of the default flow).
        # Until they have, no later acquire takes weight at once, as in asyncio.Semaphore: a
        # task that releases and re-acquires runs after the waiters it handed slots to.
        self._handed: dict[Waiter, Ask | None] = {}
        self._caps = CappedHolds()  # holders admitted at a shrunk limit's size, below their ask
        # Made when a waiter first brings a deadline of its own (deadlines.py).
        self._deadlines: OwnDeadlines | None = None
        self._register()

    # --- state -----------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The capacity, in weight."""
        return self._limit

    @property
    def active(self) -> int:
        """Weight held now."""
        return self._active

    @property
    def available(self) -> int:
        """Weight free now: `limit - active`, or 0 while a shrunk limit drains."""
        return max(0, self._limit - self._active)

    @property
    def queue_depth(self) -> int:
        """Tasks waiting now."""
        return len(self._queue)

    @property
    def queued_weight(self) -> int:
        """The weight the waiting tasks ask for."""
        return self._flows.queued_weight if self._flows else len(self._queue)

    @property
    def waiting_flows(self) -> int:
        """Flows with a waiter now."""
        return len(self._flows) if self._flows else int(bool(self._queue))

    def flow_statistics(self) -> list[FlowStatistics]:
        """Every flow that holds weight or waits now (the default flow is None); read at
        export, from the exporter's thread too (each dict is copied at once)."""
        # The default flow's weight is `_active` less the named flows'. The loop raises a named
        # flow's count before `_active` and lowers `_active` first; read on either side of the
        # counts, the smaller `_active` can only under-count the default flow (another thread
        # reading mid-change), never show weight it does not hold.
        before = self._active
        held = dict(self._held)
        default = max(0, min(before, self._active) - sum(held.values()))
        waiting = {flow: (n, w) for flow, n, w in self._flows.flows()}
        if not self._flows and self._queue:
            waiting[None] = (len(self._queue), len(self._queue))
        if default:
            held[None] = default
        flows = set(held) | set(waiting)
        return [FlowStatistics(f, held.get(f, 0), *waiting.get(f, (0, 0))) for f in flows]

    def locked(self) -> bool:
        """True if `acquire()` would wait (or fail) rather than take a slot at once."""
        return self._active >= self._limit or bool(self._queue) or bool(self._handed)

    def __repr__(self) -> str:
        # asyncio's own shape ("... object at 0x... [unlocked, value:1]"), with the limit's
        # name, size and holders before the brackets.
        name = f" {self._component}/{self._limit_name}" if self._limit_name else ""
        state = "locked" if self.locked() else f"unlocked, value:{self.available}"
        if self._queue:
            state += f", waiters:{len(self._queue)}"
        return (
            f"<{type(self).__name__}{name} object at {id(self):#x} limit={self._limit} "
            f"active={self._active} [{state}]>"
        )

    def _held_by(self, flow: Hashable) -> int:
        """The weight `flow` holds now."""
        if flow is None:
            return self._active - self._held_by_flows
        return self._held.get(flow, 0)

    # --- acquire / release -----------------------------------------------------------

    def try_acquire(self, weight: int = 1, flow: Hashable = None) -> bool:
        """Take `weight` if it is free and nobody waits (nor was handed weight and has yet to
        resume), without waiting; True if taken. ValueError if `weight` exceeds the limit."""
        if weight == 1 and flow is None:  # the default, kept as cheap as it always was
            if self._active < self._limit and not self._queue and not self._handed:
                self._active += 1
                return True
            return False
        self._check_weight(weight)
        if self._active + weight <= self._limit and not self._queue and not self._handed:
            if flow is not None:  # a flow's count first: see flow_statistics()
                self._take(flow, weight)
            self._active += weight
            return True
        return False

    def enqueue(
        self, weight: int = 1, flow: Hashable = None, deadline: float | None = None
    ) -> Waiter:
        """Join the queue (call after `try_acquire()` failed): the future ends "admitted" (the
        weight is held), "timeout" (the limit's timeout) or "deadline" (the waiter's own
        `deadline`, in seconds from now, when sooner), or is done already: "shed" if
        `max_queue` tasks wait, "deadline" if the deadline is past or the measured hand-over
        rate says it cannot be met. ValueError if `weight` exceeds the limit; nothing else
        raises."""
        if weight != 1:
            self._check_weight(weight)
        loop = asyncio.get_running_loop()
        waiter: Waiter = loop.create_future()
        # Never shed while capacity is free (held back only for a waiter handed some, not yet
        # resumed): the request waits for that hand-over instead.
        full = self._max_queue is not None and len(self._queue) >= self._max_queue
        if full and (self._active >= self._limit or self._next is not None):
            self._shed += 1
            waiter.set_result("shed")
            return waiter
        if deadline is not None:
            deadline = self._admission_bound(waiter, weight, flow, deadline)
            if waiter.done():
                return waiter
        deadline_at = None
        if self._timeout is not None:
            deadline_at = loop.time() + self._timeout
            if self._timer is None:
                self._timer = loop.call_at(deadline_at, self._expire)
        self._queue[waiter] = deadline_at
        if self._deadlines is not None and len(self._queue) == 1:
            self._deadlines.queue_started()
        if deadline is not None and (self._timeout is None or deadline < self._timeout):
            self._own_deadlines().arm(waiter, deadline, self._expire_one)
        if weight != 1 or flow is not None or self._flows:
            self._queue_by_flow(waiter, weight, flow)
            if (self._next is None or self._backfill_seconds) and (
                self._active < self._limit and not self._handed
            ):
                self._admit_fairly()  # it does not fit: it is chosen, and capacity held for it
        return waiter

    def _queue_by_flow(self, waiter: Waiter, weight: int, flow: Hashable) -> None:
        flows = self._flows
        if not flows:  # the first such waiter: those before it wait in the default flow
            for earlier in self._queue:
                if earlier is not waiter:
                    self._asks[earlier] = (1, None)
                    flows.push(earlier, 1, None)
        self._asks[waiter] = (weight, flow)
        flows.push(waiter, weight, flow)

    def _forget(self, waiter: Waiter) -> bool:
        if waiter not in self._queue:
            return False
        # The timer, if it was for this waiter, re-arms when it fires.
        if self._unqueue(waiter) and self._queue:
            self._admit_waiters()  # the capacity held for it moves on
        return True

    def _unqueue(self, waiter: Waiter) -> bool:
        """Take `waiter` out of every queue it is in; True if it was the one chosen next."""
        del self._queue[waiter]
        if self._deadlines is not None and self._deadlines.timers:
            self._deadlines.disarm(waiter)
        if not self._flows:
            return False
        _, flow = self._asks.pop(waiter)
        self._flows.remove(waiter, flow)
        if not self._queue:
            self._flows.clear()
        chosen = self._next is not None and self._next.waiter is waiter
        if chosen:
            self._next = None
        return chosen

    def _expire(self) -> None:
        """Time out every waiter whose deadline has passed (the oldest ones), then re-arm the
        timer for the oldest waiter left."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time() + _CLOCK_RESOLUTION  # as the loop itself decides a timer is due
        queue = self._queue
        chosen = False
        while queue:
            waiter, deadline = next(iter(queue.items()))
            if deadline is not None and deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                break
            chosen |= self._unqueue(waiter)
            if not waiter.done():  # else cancelled with its task, which counts it when it leaves
                self._timeouts += 1
                waiter.set_result("timeout")
        if chosen and queue:
            self._admit_waiters()  # the capacity held for the one that timed out moves on

    def release(self, weight: int = 1, flow: Hashable = None) -> None:
        """Give back `weight` held by `flow` (what it was acquired with): to the waiters if
        any. ValueError if that flow holds less."""
        if weight == 1 and flow is None:  # the default, kept as cheap as it always was
            if self._active <= self._held_by_flows:
                raise self._not_held(weight, flow)
        else:
            self._check_weight(weight, limit=False)
            if self._caps:  # it may have been granted less than it asked (and releases)
                weight = self._caps.release(flow, weight)
            if self._held_by(flow) < weight:
                raise self._not_held(weight, flow)
            if flow is not None:  # `_active` first: see flow_statistics()
                self._active -= weight
                self._take(flow, -weight)
                weight = 0
        self._active -= weight
        if self._queue:
            if self._flows:
                self._flows.touched(flow)
            self._admit_waiters()

    async def __aenter__(self) -> None:
        # `acquire()` with the defaults, inline: the uncontended path takes no call at all.
        if self._active < self._limit and not self._queue and not self._handed:
            self._active += 1
            return
        # wait_in_queue(), inline (one coroutine less): the contended path is the hot one too.
        deadline = None if request_deadline() is None else deadline_remaining()
        waiter = self.enqueue(1, None, deadline)
        try:
            admission = await waiter
        except asyncio.CancelledError:
            self.leave(waiter)
            raise
        if self._handed:
            self.settle(waiter)
        if admission != "admitted":
            raise self._refused(admission, deadline)

    async def __aexit__(self, *exc: object) -> None:
        # release() with the defaults, inline.
        if self._active <= self._held_by_flows:
            raise self._not_held(1, None)
        self._active -= 1
        if self._queue:
            if self._flows:
                self._flows.touched(None)
            self._admit_waiters()

    def resize(self, limit: int) -> None:
        """Set the capacity: growing admits waiters at once; shrinking never revokes held
        weight (`active` may exceed `limit` until releases drain it), and a waiter heavier
        than the new size is admitted at it once it frees (see `_admit_fairly`). 0 pauses."""
        check_count(type(self).__name__, "value", limit)
        self._limit = limit
        self._admit_waiters()

    def _admit_waiters(self) -> None:
        """Hand free capacity to the next waiters: the longest waiting (one flow, weight 1),
        else as flows.py chooses."""
        if self._flows:
            self._admit_fairly()
            return
        queue = self._queue
        deadlines = self._deadlines
        while queue and self._active < self._limit:
            waiter, _ = queue.popitem(last=False)
            late = deadlines is not None and deadlines.disarm(waiter)
            if waiter.done():  # cancelled with its task, which counts it when it leaves
                continue
            if late:  # its deadline passed while the loop ran late: refused, not a slot
                self._timeouts += 1
                waiter.set_result("deadline")
                continue
            self._active += 1
            self._handed[waiter] = None
            if deadlines is not None:
                deadlines.handed(1)
            waiter.set_result("admitted")

    def _admit_fairly(self) -> None:
        while self._active < self._limit:
            chosen = self._next or self._flows.choose()
            if chosen is None:
                return
            # Heavier than a limit shrunk under it, it is capped at the size (>= 1 here: a
            # limit of 0 admits nobody): else it could never fit, nor be passed.
            weight = min(chosen.weight, self._limit)
            if self._active + weight > self._limit:
                fresh, self._next = self._next is None, chosen  # freed capacity is held for it
                if self._backfill_seconds:  # opt-in: lighter waiters pass it for a while
                    self._backfill(chosen, fresh)
                return
            self._next = None
            if self._hand(chosen.waiter, weight, chosen.flow) and weight < chosen.weight:
                self._handed[chosen.waiter] = (chosen.weight, chosen.flow)  # what it releases
                self._caps.add(chosen.flow, chosen.weight, weight)
                self._count_capped(chosen.weight, weight)

    def _hand(self, waiter: Waiter, weight: int, flow: Hashable) -> bool:
        """Admit the queued `waiter` (True), unless it left or its own deadline passed."""
        if waiter.done():  # cancelled with its task, which counts it when it leaves
            self._unqueue(waiter)
            return False
        if self._deadlines is not None and self._deadlines.late(waiter):
            self._unqueue(waiter)  # its deadline passed while the loop ran late
            self._timeouts += 1
            waiter.set_result("deadline")
            return False
        if flow is not None:  # a flow's count first: see flow_statistics()
            self._take(flow, weight)
        self._active += weight
        self._unqueue(waiter)  # its flow's next head is offered at the new held weight
        self._handed[waiter] = (weight, flow)
        if self._deadlines is not None:
            self._deadlines.handed(weight)
        waiter.set_result("admitted")
        return True

    def settle(self, waiter: Waiter) -> None:
        """The task awaiting `waiter` resumed: weight handed to it is its own from now on, and
        waiters that queued behind the hand-over get the capacity still free (as
        asyncio.Semaphore's resumed task does). Called in that task, not as a loop callback."""
        handed = self._handed
        if handed:
            handed.pop(waiter, None)
            if self._queue:
                self._admit_waiters()

    def refuse(self, waiter: Waiter) -> bool:
        """End a queued `waiter`'s wait with "unavailable" (shutting down; uncounted): True if
        it was queued. Capacity held for it is passed on to nobody: the server is draining."""
        if waiter not in self._queue:
            return False
        self._unqueue(waiter)
        if not waiter.done():
            waiter.set_result("unavailable")
        return True

    def _give_back(self, waiter: Waiter) -> None:
        ask = self._handed.pop(waiter, None)
        if ask is None:
            self.release()
        else:
            self.release(*ask)

    # --- weight accounting -----------------------------------------------------------

    def _take(self, flow: Hashable, weight: int) -> None:
        """Count `weight` (negative: given back) as held by `flow` (not None)."""
        held = self._held.get(flow, 0) + weight
        if held:
            self._held[flow] = held
        else:
            del self._held[flow]
        self._held_by_flows += weight

    def _check_weight(self, weight: int, *, limit: bool = True) -> None:
        check_count(type(self).__name__, "weight", weight, minimum=1)
        if limit and weight > self._limit and weight != 1:  # 1 waits on a limit of 0, as ever
            raise ValueError(
                f"{self._describe()}: weight {weight} is more than the limit {self._limit}; "
                "it could never be admitted"
            )

    def _not_held(self, weight: int, flow: Hashable) -> ValueError:
        held = self._held_by(flow)
        if flow is None and weight == 1 and held <= 0:
            return ValueError(f"{self._describe()} released with no slot held")
        return ValueError(
            f"{self._describe()} released weight {weight} for flow {flow!r}, which holds {held}"
        )
