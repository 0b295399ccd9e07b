"""A hypothesis state machine over weights and flows: random interleavings of acquires (each with
a weight and a flow, through `acquire()` and through `enqueue()` / `leave()`), releases,
cancellations (also of a waiter handed weight in that same step), timeouts and resizes (also
below a queued waiter's weight), with and without bounded backfill (`backfill_seconds`).

Beside the semaphore runs a model written for reading, not speed: waiters in a list, the next
one found by a scan. After every step the semaphore's holders are exactly the model's, which
proves, step by step: held weight never above the limit at an admission, a flow holds what its
holders took, freed capacity goes to the head of the least-held waiting flow (ties: the longest
waiting) and the waiter chosen is never passed, nothing leaks, every failure is counted once.
With backfill, the model admits past a blocked waiter chosen next exactly those the rule allows
(the first `BACKFILL_SCAN` others in arrival order that fit, while it has been blocked less than
`backfill_seconds`): held weight stays within the limit, flows hold what their holders took,
nothing leaks; the fair order holds for every waiter not admitted by backfill. A waiter heavier
than a limit shrunk under it is admitted at the limit's size (counted once) and gives back what
it was granted when it releases what it asked for: the queue always moves (no waiter waits on
an idle limit but a paused one, of size 0) and `active` never goes below what is held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gym_concurrency import MeteredSemaphore, QueueFullError
from gym_concurrency.limits.backfill import BACKFILL_SCAN
from tests.core.clock import ManualClockLoop

FLOWS: list[Hashable] = [None, "a", "b", ("tenant", 3)]


@dataclass(eq=False)
class Attempt:
    """One task asking the semaphore for `weight` in `flow`; holds until told to release."""

    weight: int
    flow: Hashable
    arrival: int
    deadline: float | None
    granted: int = 0  # the weight admitted with: `weight`, or a shrunk limit's size
    outcome: str | None = None  # as the task saw it: admitted, timeout, shed, invalid, cancelled
    holding: bool = False
    done: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def run(self, sem: MeteredSemaphore, through_enqueue: bool) -> None:
        try:
            outcome = await (self._enqueue(sem) if through_enqueue else self._acquire(sem))
        except asyncio.CancelledError:
            self.outcome, self.done = "cancelled", True
            raise
        except ValueError:
            self.outcome, self.done = "invalid", True
            return
        self.outcome = outcome
        if outcome != "admitted":
            self.done = True
            return
        self.holding = True
        try:
            await self.release.wait()
        finally:
            sem.release(self.weight, self.flow)
            self.holding, self.done = False, True

    async def _acquire(self, sem: MeteredSemaphore) -> str:
        try:
            await sem.acquire(self.weight, self.flow)
        except TimeoutError:
            return "timeout"
        except QueueFullError:
            return "shed"
        return "admitted"

    async def _enqueue(self, sem: MeteredSemaphore) -> str:
        if sem.try_acquire(self.weight, self.flow):
            return "admitted"
        waiter = sem.enqueue(self.weight, self.flow)
        try:
            admission = await waiter
        except asyncio.CancelledError:
            sem.leave(waiter)
            raise
        sem.settle(waiter)
        return admission


class Model:
    """What the semaphore must do, the slow and obvious way."""

    def __init__(
        self,
        limit: int,
        timeout: float | None,
        max_queue: int | None,
        backfill: float = 0.0,
        clock: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.limit, self.timeout, self.max_queue = limit, timeout, max_queue
        self.backfill, self.clock = backfill, clock
        self.waiting: list[Attempt] = []  # arrival order
        self.holders: list[Attempt] = []
        self.chosen: Attempt | None = None
        self.blocked_at = 0.0  # when the chosen one was first found not to fit
        self.backfilled = 0
        self.capped = 0
        # The weight each flow holds as the semaphore counts it. A release names what its
        # holder asked for; while a holder of that ask (flow, weight) was granted less (capped),
        # the release gives back one such grant, whoever releases: until every holder of the
        # ask has released, a flow may count more than its holders were granted, never less.
        self.ledger: dict[Hashable, int] = {}
        self.caps: dict[tuple[Hashable, int], list[int]] = {}
        self.outcomes: list[str] = []

    @property
    def active(self) -> int:
        return sum(self.ledger.values())

    def held(self, flow: Hashable) -> int:
        return self.ledger.get(flow, 0)

    def hold(self, attempt: Attempt, granted: int) -> None:
        attempt.granted = granted
        self.holders.append(attempt)
        self.ledger[attempt.flow] = self.held(attempt.flow) + granted
        if granted < attempt.weight:
            self.caps.setdefault((attempt.flow, attempt.weight), []).append(granted)

    def arrive(self, attempt: Attempt) -> None:
        if attempt.weight > max(self.limit, 1):  # weight 1 waits on a limit of 0, as ever
            self.outcomes.append("invalid")
        elif not self.waiting and self.active + attempt.weight <= self.limit:
            self.hold(attempt, attempt.weight)
        elif (
            self.max_queue is not None
            and len(self.waiting) >= self.max_queue
            and (self.active >= self.limit or self.chosen is not None)
        ):
            self.outcomes.append("shed")
        else:
            self.waiting.append(attempt)
            self.admit()  # capacity is free only for a waiter that does not fit: it is chosen

    def admit(self) -> None:
        while self.waiting and self.active < self.limit:
            fresh = self.chosen is None
            if self.chosen is None:
                heads = [a for a in self.waiting if a is self._head_of(a.flow)]
                self.chosen = min(heads, key=lambda a: (self.held(a.flow), a.arrival))
            granted = min(self.chosen.weight, self.limit)  # capped at a limit shrunk under it
            if self.active + granted > self.limit:
                if self.backfill:
                    self._backfill(self.chosen, fresh)
                return
            self.waiting.remove(self.chosen)
            self.hold(self.chosen, granted)
            self.capped += granted < self.chosen.weight
            self.chosen = None

    def _backfill(self, chosen: Attempt, fresh: bool) -> None:
        if fresh:
            self.blocked_at = self.clock()
        elif self.clock() - self.blocked_at >= self.backfill:
            return
        others = [a for a in self.waiting[: BACKFILL_SCAN + 1] if a is not chosen]
        for attempt in others[:BACKFILL_SCAN]:
            if self.active + attempt.weight <= self.limit:
                self.waiting.remove(attempt)
                self.hold(attempt, attempt.weight)
                self.backfilled += 1

    def _head_of(self, flow: Hashable) -> Attempt:
        return next(a for a in self.waiting if a.flow == flow)

    def release(self, attempt: Attempt) -> None:
        self.holders.remove(attempt)
        caps = self.caps.get((attempt.flow, attempt.weight))
        given = caps.pop() if caps else attempt.weight
        self.ledger[attempt.flow] -= given
        if not self.ledger[attempt.flow]:
            del self.ledger[attempt.flow]
        self.admit()

    def leave(self, attempt: Attempt, outcome: str) -> None:
        self.outcomes.append(outcome)
        if attempt in self.holders:  # handed weight in the same step: it passes on
            self.release(attempt)
            return
        self.waiting.remove(attempt)
        if self.chosen is attempt:
            self.chosen = None
            self.admit()

    def expire(self, now: float) -> None:
        # All at once, as the semaphore's timer does: then, if the chosen one was among them,
        # what was held for it moves on.
        expired = [a for a in self.waiting if a.deadline is not None and a.deadline <= now]
        for attempt in expired:
            self.outcomes.append("timeout")
            self.waiting.remove(attempt)
        if self.chosen in expired:
            self.chosen = None
            self.admit()


class FlowMachine(RuleBasedStateMachine):
    """Random schedules against one MeteredSemaphore and its model."""

    @initialize(
        limit=st.integers(0, 5),
        timeout=st.none() | st.sampled_from([1.0, 2.5]),
        max_queue=st.none() | st.integers(0, 4),
        backfill=st.sampled_from([0.0, 0.0, 1.0, 2.0]),
    )
    def setup(
        self, limit: int, timeout: float | None, max_queue: int | None, backfill: float
    ) -> None:
        self.loop = ManualClockLoop()
        self.sem = MeteredSemaphore(
            limit, timeout=timeout, max_queue=max_queue, backfill_seconds=backfill
        )
        self.model = Model(limit, timeout, max_queue, backfill, lambda: self.loop.now)
        self.attempts: list[Attempt] = []

    def settle(self) -> None:
        for _ in range(6):
            self.loop.run_until_complete(asyncio.sleep(0))

    def teardown(self) -> None:
        for attempt in self.attempts:
            if attempt.task is not None:
                attempt.task.cancel()
            attempt.release.set()
        self.settle()
        self.loop.close()

    def waiting(self) -> list[Attempt]:
        return [a for a in self.attempts if a in self.model.waiting]

    @rule(weight=st.integers(1, 3), flow=st.sampled_from(FLOWS), through_enqueue=st.booleans())
    def acquire(self, weight: int, flow: Hashable, through_enqueue: bool) -> None:
        timeout = self.model.timeout
        deadline = None if timeout is None else self.loop.now + timeout
        attempt = Attempt(weight, flow, len(self.attempts), deadline)
        self.attempts.append(attempt)
        attempt.task = self.loop.create_task(attempt.run(self.sem, through_enqueue))
        self.model.arrive(attempt)
        self.settle()

    @rule(limit=st.integers(0, 6))
    def resize(self, limit: int) -> None:
        self.sem.resize(limit)
        self.model.limit = limit
        self.model.admit()
        self.settle()

    @precondition(lambda self: bool(self.model.holders))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        attempt = data.draw(st.sampled_from(self.model.holders))
        attempt.release.set()
        self.model.release(attempt)
        self.settle()

    @precondition(lambda self: bool(self.model.waiting))
    @rule(data=st.data())
    def cancel_waiter(self, data: st.DataObject) -> None:
        attempt = data.draw(st.sampled_from(self.waiting()))
        assert attempt.task is not None
        attempt.task.cancel()
        self.model.leave(attempt, "cancelled")
        self.settle()

    @precondition(lambda self: bool(self.model.waiting) and bool(self.model.holders))
    @rule(data=st.data())
    def release_and_cancel_in_one_step(self, data: st.DataObject) -> None:
        # The first waiter (in arrival order) is cancelled in the loop step in which the
        # holder releases: if it was just handed weight, it has not resumed to take it.
        holder = data.draw(st.sampled_from(self.model.holders))
        first = self.waiting()[0]
        assert first.task is not None
        holder.release.set()
        self.loop.call_soon(first.task.cancel)
        self.model.release(holder)
        self.model.leave(first, "cancelled")
        self.settle()

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0]))
    def advance_clock(self, seconds: float) -> None:
        self.loop.now += seconds
        self.model.expire(self.loop.now)
        self.settle()

    @invariant()
    def holders_are_the_models(self) -> None:
        if hasattr(self, "sem"):
            holding = [a.arrival for a in self.attempts if a.holding]
            assert holding == sorted(a.arrival for a in self.model.holders)
            assert self.sem.active == self.model.active
            assert self.sem.queue_depth == len(self.model.waiting)
            assert self.sem.queued_weight == sum(a.weight for a in self.model.waiting)
            assert self.sem.admission_backfilled == self.model.backfilled
            assert self.sem.admission_capped == self.model.capped
            if not self.model.backfill:
                assert self.model.backfilled == 0

    @invariant()
    def each_flow_holds_what_its_holders_took(self) -> None:
        if hasattr(self, "sem"):
            held = {s.flow: s.held for s in self.sem.flow_statistics() if s.held}
            expected = {f: self.model.held(f) for f in FLOWS if self.model.held(f)}
            assert held == expected
            for flow in FLOWS:  # never less than its holders were granted; 0 once none hold
                granted = [a.granted for a in self.model.holders if a.flow == flow]
                assert held.get(flow, 0) >= sum(granted)
                assert granted or flow not in held

    @invariant()
    def never_above_the_limit_but_by_a_shrink(self) -> None:
        if hasattr(self, "sem"):
            sem = self.sem
            assert sem.available == max(0, sem.limit - sem.active)
            if self.model.waiting:  # the next waiter is held back only because it does not fit
                chosen = self.model.chosen
                assert chosen is not None or sem.active >= sem.limit
                fits = 1 if chosen is None else min(chosen.weight, max(sem.limit, 1))
                assert sem.active + fits > sem.limit  # (at most the limit: capped, if shrunk)

    @invariant()
    def the_queue_always_moves(self) -> None:
        # A waiter on an idle limit waits for ever: only a limit of 0 (a pause) may hold one.
        if hasattr(self, "sem"):
            sem = self.sem
            assert sem.active >= 0
            if sem.queue_depth and sem.limit:
                assert sem.active > 0, "a waiter waits on an idle limit"

    @invariant()
    def nothing_is_kept_for_idle_flows(self) -> None:
        if hasattr(self, "sem"):
            assert {s.flow for s in self.sem.flow_statistics()} == {
                a.flow for a in self.model.holders + self.model.waiting
            }

    @invariant()
    def every_failed_admission_counted_once(self) -> None:
        if hasattr(self, "sem"):
            seen = [a.outcome for a in self.attempts]
            for outcome in ("timeout", "shed", "invalid", "cancelled"):
                assert seen.count(outcome) == self.model.outcomes.count(outcome), outcome
            assert self.sem.admission_timeouts == seen.count("timeout")
            assert self.sem.admission_cancelled == seen.count("cancelled")
            assert self.sem.admission_shed == seen.count("shed")


class BackfillMachine(FlowMachine):
    """The same with backfill always on, limits that block heavier waiters and timeouts rarer:
    schedules where waiters pass a blocked one, and where its bound runs out, are common."""

    @initialize(
        limit=st.integers(2, 5),
        timeout=st.none() | st.just(2.5),
        max_queue=st.none() | st.just(4),
        backfill=st.sampled_from([0.5, 1.0, 2.0]),
    )
    def setup(
        self, limit: int, timeout: float | None, max_queue: int | None, backfill: float
    ) -> None:
        super().setup(limit, timeout, max_queue, backfill)


FlowMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestFlowMachine = FlowMachine.TestCase
BackfillMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None
)
TestBackfillMachine = BackfillMachine.TestCase
