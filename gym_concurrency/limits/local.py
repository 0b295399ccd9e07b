"""MeteredSemaphore: an asyncio.BoundedSemaphore that counts its state in plain integers, in
units of weight, and serves flows fairly (flows.py); its waiters live in its WaitQueue
(wait_queue.py), its upstream behind its UpstreamGate (upstream.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from ..deadline import deadline_remaining, request_deadline
from ..engines.signal import EngineSignal
from ._base import LimitBase, check_count
from .admission_counts import AdmissionCounts
from .asks import check_weight, not_held
from .backfill import check_backfill_seconds
from .budget_allowance import NoAllowance
from .caps import CappedHolds
from .deadlines import check_deadline
from .flows import Ask, FlowStatistics, flow_statistics
from .limit import Admission
from .queue_timer import QueueTimer
from .rate_budget import RateBudget, Reservation
from .upstream import UpstreamGate
from .wait_queue import WaitQueue

__all__ = ["MeteredSemaphore"]

Waiter = asyncio.Future[Admission]


class MeteredSemaphore(LimitBase, asyncio.BoundedSemaphore):
    """A bounded semaphore whose limit, holders, waiters and failed admissions are readable.

    Every call takes a `weight` (default 1) and a `flow` (default None): `limit`, `active` and
    `available` count weight; freed capacity goes to the head of the waiting flow that holds
    the least weight (FIFO within a flow; with one flow, plain FIFO). `timeout` bounds the wait
    inside `acquire()` (TimeoutError); `max_queue` the waiters (QueueFullError at once).
    Acquire and release make no telemetry call: the observer reads these integers at export.
    A `budget` (RateBudget) and an `engine` (EngineSignal) are asked with the slots
    (upstream.py). `backfill_seconds` (default 0: never) lets lighter waiters that fit pass
    the waiter chosen next for at most that long (backfill.py); held back by its budget alone,
    it is admitted at most that long after the budget alone would take it (`spare_for`).

    An asyncio.BoundedSemaphore by type and behaviour, not state: asyncio's `_value` and
    `_waiters` are never made; `_get_loop` and `_wake_up_next` go unused (test_contract.py)."""

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
        budget: RateBudget | None = None,
        engine: EngineSignal | None = None,
    ) -> None:
        owner = type(self).__name__
        check_count(owner, "value", value)
        backfill_seconds = check_backfill_seconds(owner, backfill_seconds)
        # LimitBase does not chain on to asyncio.BoundedSemaphore.__init__: nothing reads it.
        super().__init__(
            component=component,
            limit_name=limit_name,
            server=server,
            timeout=timeout,
            max_queue=max_queue,
            counts=AdmissionCounts(),  # this semaphore counts every way a wait ends
            budget=budget,
            engine=engine,
        )
        self._limit = value
        self._active = 0  # weight held, including weight handed to a waiter not yet resumed
        # Weight held by each flow while it holds some, but None's (the rest of `_active`).
        self._held: dict[Hashable, int] = {}
        self._held_by_flows = 0  # the sum of `_held`
        # Waiters handed weight (None, or the allowance's generation: 1 of the default flow) whose
        # tasks have not resumed yet (`settle()`, `leave()`): no acquire takes weight till then.
        self._handed: dict[Waiter, Ask | int | None] = {}
        self._caps = CappedHolds()  # holders admitted at a shrunk limit's size, below their ask
        self._backfilled = 0
        self._gate = UpstreamGate.of(self._upstream, self._admit_waiters)
        self._allowance = NoAllowance() if self._gate is None else self._gate.allowance
        self._queue = WaitQueue(self._held_by, backfill_seconds, estimates=self._gate is not None)
        # The queue's waiters in arrival order, read (never written) here: on the hot paths an
        # attribute of the queue costs the uncontended `async with` about 2% more instructions.
        self._waiting = self._queue.waiters
        self._timer = QueueTimer(self._time_out, self._queue.next_due)  # the limit's timeout
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
    def queue_depth(self) -> int:
        """Tasks waiting now."""
        return len(self._waiting)

    @property
    def queued_weight(self) -> int:
        """The weight the waiting tasks ask for."""
        return self._queue.queued_weight

    @property
    def waiting_flows(self) -> int:
        """Flows with a waiter now."""
        return self._queue.waiting_flows

    @property
    def backfill_seconds(self) -> float:
        """How long the waiter chosen next may be passed by lighter ones that fit (0: never)."""
        return self._queue.backfill_seconds

    @property
    def admission_backfilled(self) -> int:
        """Waiters admitted past a blocked waiter chosen before them (monotonic)."""
        return self._backfilled

    def handover_wait(self) -> float | None:
        """Seconds to hand out what is queued and one more at the measured rate (None: unknown)."""
        return self._queue.handover_wait()

    def flow_statistics(self) -> list[FlowStatistics]:
        """Every flow that holds weight or waits now (the default flow is None); read at
        export, from the exporter's thread too (copied at once; `_active` read twice: flows.py)."""
        before, held = self._active, dict(self._held)
        return flow_statistics(min(before, self._active), held, self._queue.waiting())

    def locked(self) -> bool:
        """True if `acquire()` would wait (or fail) rather than take a slot at once."""
        if self._active >= self._limit or self._waiting or self._handed:
            return True
        return self._gate is not None and self._gate.refusal(1, self._active) is not None

    def _held_by(self, flow: Hashable) -> int:
        """The weight `flow` holds now."""
        if flow is None:
            return self._active - self._held_by_flows
        return self._held.get(flow, 0)

    # --- acquire / release -----------------------------------------------------------

    def try_acquire(
        self, weight: int = 1, flow: Hashable = None, *, tokens: int | None = None
    ) -> bool:
        """Take `weight` (and `tokens` of the upstream, charged in full) at once if free and
        nobody waits or is yet to resume; True if taken. ValueError for a weight over the limit."""
        if flow is not None or weight != 1:
            check_weight(type(self).__name__, self._describe, weight, self._limit)
        if self._active + weight > self._limit or self._waiting or self._handed:
            return False
        gate = self._gate
        estimate = weight if gate is None and tokens is None else self._estimate(weight, tokens)
        if gate is not None and not gate.take_in_full(estimate, self._active):
            return False
        if flow is not None:  # a flow's count first: see flow_statistics()
            self._take(flow, weight)
        self._active += weight
        return True

    async def __aenter__(self) -> None:
        # acquire() with the defaults, try_acquire() inline (a call costs 14 %: performance.md)
        if self._active < self._limit and not self._waiting and not self._handed:
            if self._gate is None or self._allowance.take_one():  # (the budget's: a C call)
                self._active += 1
                return
            if self.try_acquire():  # the upstream asked, charged in full
                return
        # wait_in_queue(), inline (one coroutine less): the contended path is the hot one too.
        deadline = None if request_deadline() is None else deadline_remaining()
        waiter = self.enqueue(1, None, deadline, in_full=True)
        try:
            admission = await waiter
        except asyncio.CancelledError:
            self.leave(waiter)
            raise
        if self._handed:
            reservation = self.settle(waiter)
            if reservation is not None:  # charged in full: `async with` cannot settle
                reservation.charge_in_full()
        if admission != "admitted":
            raise self._refused(admission, deadline)

    async def __aexit__(self, *exc: object) -> None:
        # release() with the defaults, inline (as try_acquire() in __aenter__).
        if self._active <= self._held_by_flows:
            raise not_held(self._describe(), 1, None, 0)
        self._active -= 1
        if self._waiting:
            queue = self._queue
            if queue.fair:
                queue.touched(None)
            self._admit_waiters()

    def release(self, weight: int = 1, flow: Hashable = None) -> None:
        """Give back `weight` held by `flow` (what it was acquired with): to the waiters if
        any. ValueError if that flow holds less."""
        if weight == 1 and flow is None:  # the default, kept as cheap as it always was
            if self._active <= self._held_by_flows:
                raise not_held(self._describe(), weight, flow, self._held_by(flow))
        else:
            check_weight(type(self).__name__, self._describe, weight, None)
            if self._caps:  # it may have been granted less than it asked (and releases)
                weight = self._caps.release(flow, weight)
            if self._held_by(flow) < weight:
                raise not_held(self._describe(), weight, flow, self._held_by(flow))
            if flow is not None:  # `_active` first: see flow_statistics()
                self._active -= weight
                self._take(flow, -weight)
                weight = 0
        self._active -= weight
        if self._waiting:
            queue = self._queue
            if queue.fair:
                queue.touched(flow)
            self._admit_waiters()

    def enqueue(
        self,
        weight: int = 1,
        flow: Hashable = None,
        deadline: float | None = None,
        *,
        tokens: int | None = None,
        in_full: bool = False,
    ) -> Waiter:
        """Join the queue (call after `try_acquire()` failed): the future ends "admitted" (the
        weight is held), "timeout" (the limit's timeout) or "deadline" (the waiter's own
        `deadline`, in seconds from now, when sooner), or is done already: "shed" if
        `max_queue` tasks wait, "deadline" if the deadline is past or the measured hand-over
        rate says it cannot be met; upstream.py says how `tokens` end it (`in_full`: limit.py).
        ValueError for a weight over the limit or bad `tokens`; nothing else raises."""
        if weight != 1:
            check_weight(type(self).__name__, self._describe, weight, self._limit)
        loop = asyncio.get_running_loop()
        waiter: Waiter = loop.create_future()
        queue = self._queue
        # Never shed while capacity is free (held back only for a waiter handed some, not yet
        # resumed): the request waits for that hand-over instead.
        full = self._max_queue is not None and len(self._waiting) >= self._max_queue
        if full and (self._active >= self._limit or queue.holding):
            self._counts.shed_one()
            waiter.set_result("shed")
            return waiter
        if deadline is not None:
            seconds = check_deadline(type(self).__name__, deadline)
            deadline = queue.admission_bound(weight, flow, seconds, self._limit)
            if deadline is None:  # it cannot be met
                self._end_late(waiter, "deadline")  # counted as a timeout, its own refusal
                return waiter
        gate = self._gate
        estimate = weight if gate is None and tokens is None else self._estimate(weight, tokens)
        if gate is not None:
            free = self._active + weight <= self._limit and not (self._waiting or self._handed)
            if free and gate.admit(waiter, estimate, self._active):  # at once, never queued
                return self._grant(waiter, weight, flow)
            if gate.too_late(estimate, self._timeout, deadline):
                self._end_late(waiter, "budget")  # the budget holds it only too late
                return waiter
        due = None
        if self._timeout is not None:
            due = loop.time() + self._timeout
            self._timer.arm(loop, due)
        queue.add(waiter, weight, flow, due, estimate, in_full)
        if deadline is not None and (self._timeout is None or deadline < self._timeout):
            queue.arm(waiter, deadline, self._deadline_passed)
        free = self._active < self._limit and not self._handed
        fair = free and (queue.fair or gate is not None)  # (an upstream may hold it back)
        if fair and (not queue.holding or queue.backfill_seconds):
            self._admit_fairly()  # it does not fit: it is chosen, and capacity held for it
        return waiter

    def settle(self, waiter: Waiter) -> Reservation | None:
        """The task awaiting `waiter` resumed (called in it): what it was handed is its own, its
        reservation returned (None: none); waiters behind it get what is free, as asyncio's."""
        if self._handed:
            self._handed.pop(waiter, None)
            if self._waiting:
                self._admit_waiters()
        return None if self._gate is None else self._gate.claim(waiter)

    def refuse(self, waiter: Waiter) -> bool:
        """End a queued `waiter`'s wait "unavailable" (draining: uncounted, and what was held
        for it passed on to nobody); True if it was queued."""
        if waiter not in self._waiting:
            return False
        self._queue.remove(waiter)
        if not waiter.done():
            waiter.set_result("unavailable")
        return True

    def resize(self, limit: int) -> None:
        """Set the capacity: growing admits waiters at once; shrinking revokes nothing held
        (`active` may exceed `limit` for a while); a heavier waiter is capped at it. 0 pauses."""
        check_count(type(self).__name__, "value", limit)
        self._limit = limit
        self._admit_waiters()

    # --- waits that end without weight ------------------------------------------------

    def _forget(self, waiter: Waiter) -> bool:
        if waiter not in self._waiting:
            return False
        if self._queue.remove(waiter) and self._waiting:
            self._admit_waiters()  # the capacity held for it moves on
        return True

    def _deadline_passed(self, waiter: Waiter) -> None:
        """`waiter`'s own deadline passed (its timer): its wait ends "deadline" if it waits."""
        if waiter in self._waiting:
            self._end_late(waiter, "deadline")
            self._forget(waiter)  # the capacity held for it moves on

    def _time_out(self, now: float) -> None:
        """The limit's timer (queue_timer.py): every waiter whose timeout passed by `now` ends."""
        queue, held_for = self._queue, False
        gate = self._gate  # "budget" / "saturated" while it holds back the one chosen next
        refusal = "timeout" if gate is None else gate.late(queue, self._active, self._limit)
        for waiter in queue.due(now):
            held_for |= queue.remove(waiter)
            self._end_late(waiter, refusal)
        if held_for and self._waiting:
            self._admit_waiters()  # the capacity held for the one that timed out moves on

    def _give_back(self, waiter: Waiter) -> None:
        handed = self._handed.pop(waiter, None)
        if self._gate is not None:  # its call is never sent: what was taken for it goes back
            self._gate.cancel(waiter)
            if isinstance(handed, int):  # (`take_one` let it go, in that generation)
                self._allowance.give_back_one(handed)
        self.release(*(handed if isinstance(handed, tuple) else (1, None)))

    # --- admission -------------------------------------------------------------------

    def _admit_waiters(self) -> None:
        """Hand free capacity to the next waiters: the oldest (one flow, weight 1; an upstream's
        allowance takes each), else the one chosen next (`_admit_fairly`: by flow, or upstream)."""
        queue = self._queue
        if queue.fair or (self._gate is not None and queue.holding):
            self._admit_fairly()  # (an upstream holds the oldest back)
            return
        take_one = None if self._gate is None else self._allowance.take_one  # (a C call)
        taken_in = None if take_one is None else self._allowance.generation  # (for _give_back)
        while self._active < self._limit:
            if take_one is not None and not (self._waiting and take_one()):
                self._admit_fairly()  # nobody waits, or the upstream may hold the oldest back
                return
            oldest = queue.pop_oldest()
            if oldest is None:  # (only waiters cancelled with their tasks were left)
                self._allowance.untake_one()  # what it took goes back
                return
            waiter, late = oldest
            if late:  # its deadline passed while the loop ran late: refused, not a slot
                self._allowance.untake_one()
                self._end_late(waiter, "deadline")
                continue
            self._active += 1
            self._handed[waiter] = taken_in
            waiter.set_result("admitted")

    def _admit_fairly(self) -> None:
        queue = self._queue
        while self._active < self._limit:
            chosen = queue.choose()
            if chosen is None:
                return
            # Heavier than a limit shrunk under it, it is capped at the size (>= 1 here: a
            # limit of 0 admits nobody): else it could never fit, nor be passed.
            weight = min(chosen.weight, self._limit)
            fits = self._active + weight <= self._limit
            handed = self._hand(chosen.waiter, weight, chosen.flow) if fits else None
            if handed is None:  # it does not fit, or the upstream cannot take it yet:
                passers, kept = queue.hold(chosen), 0  # freed capacity is held for it
                spare = self._gate.spare_for(queue, chosen) if fits and self._gate else None
                if spare is not None:  # only its budget holds it back: passed within that
                    passers, kept = queue.behind(chosen.waiter), weight
                self._backfill(passers, kept, spare)
                return
            if handed and weight < chosen.weight:
                self._handed[chosen.waiter] = (chosen.weight, chosen.flow)  # what it releases
                self._caps.add(chosen.flow, chosen.weight, weight)
                self._counts.cap(self._describe(), chosen.weight, weight)

    def _backfill(
        self, passers: list[tuple[Waiter, Ask]], kept: int = 0, spare: list[int] | None = None
    ) -> None:
        """Admit each of `passers` (the waiters that may pass the one held for, backfill.py)
        that fits in what is free, beside `kept` weight kept for that one and (given) within
        what its budget can `spare` (upstream.py), oldest first."""
        for waiter, (weight, flow) in passers:
            free = self._active + weight + kept <= self._limit
            if free and self._hand(waiter, weight, flow, spare):
                self._backfilled += 1
                # Maybe not its flow's head: its flow's place in the fair order moved.
                self._queue.touched(flow)
                if self._active >= self._limit:
                    return

    def _hand(
        self, waiter: Waiter, weight: int, flow: Hashable, spare: list[int] | None = None
    ) -> bool | None:
        """Admit the queued `waiter` (True), unless it left or its own deadline passed (False)
        or the upstream cannot take it now (within `spare`, if given: None)."""
        queue = self._queue
        if waiter.done():  # cancelled with its task, which counts it when it leaves
            queue.remove(waiter)
            return False
        if queue.late(waiter):  # its deadline passed while the loop ran late
            queue.remove(waiter)
            self._end_late(waiter, "deadline")
            return False
        gate = self._gate
        if gate is not None and not gate.admit(waiter, queue.estimate(waiter), self._active, spare):
            return None
        self._grant(waiter, weight, flow)
        queue.admitted(waiter, weight)  # after the count: its flow is offered at it
        return True

    def _grant(self, waiter: Waiter, weight: int, flow: Hashable) -> Waiter:
        """Hand `weight` of `flow` to `waiter`, not queued (any more): it is admitted."""
        if flow is not None:  # a flow's count first: see flow_statistics()
            self._take(flow, weight)
        self._active += weight
        self._handed[waiter] = (weight, flow)  # until its task resumes: settle() or leave()
        waiter.set_result("admitted")
        return waiter

    # --- weight accounting -----------------------------------------------------------

    def _take(self, flow: Hashable, weight: int) -> None:
        """Count `weight` (negative: given back) as held by `flow` (not None)."""
        held = self._held.get(flow, 0) + weight
        if held:
            self._held[flow] = held
        else:
            del self._held[flow]
        self._held_by_flows += weight
