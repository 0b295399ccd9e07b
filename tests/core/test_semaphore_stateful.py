"""A hypothesis state machine over random interleavings of acquire (through `acquire()` and
through `enqueue()` / `leave()`, as the middleware does), timeout, cancel, release and resize.

The loop runs on a clock the test advances, so deadlines fire exactly when a rule says so.
After every step: no admission ever took `active` past the limit in force, no waiter waits
while a slot is free, admissions come in arrival order, queue_depth == tasks waiting, and
every finished attempt is counted exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from enum import Enum

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gym_concurrency import MeteredSemaphore, QueueFullError
from tests.core.clock import ManualClockLoop


class State(Enum):
    WAITING = "waiting"
    HOLDING = "holding"
    DONE = "done"


class Attempt:
    """One task trying the semaphore: waits, holds until told to release, then ends."""

    def __init__(
        self,
        sem: MeteredSemaphore,
        loop: asyncio.AbstractEventLoop,
        on_admitted: Callable[[Attempt], None],
        *,
        through_enqueue: bool,
    ) -> None:
        self.state = State.WAITING
        self.outcome: str | None = None
        self.release = asyncio.Event()
        self._on_admitted = on_admitted
        wait = self.enqueue if through_enqueue else self.acquire
        self.task = loop.create_task(self.run(sem, wait))

    async def acquire(self, sem: MeteredSemaphore) -> str:
        try:
            await sem.acquire()
        except TimeoutError:
            return "timeout"
        except QueueFullError:
            return "shed"
        return "admitted"

    async def enqueue(self, sem: MeteredSemaphore) -> str:
        if sem.try_acquire():
            return "admitted"
        waiter = sem.enqueue()
        try:
            admission = await waiter
        except asyncio.CancelledError:
            sem.leave(waiter)
            raise
        sem.settle(waiter)  # as the middleware does once its wait ended
        return admission

    async def run(
        self, sem: MeteredSemaphore, wait: Callable[[MeteredSemaphore], Awaitable[str]]
    ) -> None:
        try:
            outcome = await wait(sem)
        except asyncio.CancelledError:
            self.outcome, self.state = "cancelled", State.DONE
            raise
        if outcome != "admitted":
            self.outcome, self.state = outcome, State.DONE
            return
        self.outcome, self.state = "admitted", State.HOLDING
        self._on_admitted(self)
        try:
            await self.release.wait()
        finally:
            sem.release()
            self.state = State.DONE


class SemaphoreMachine(RuleBasedStateMachine):
    """Random schedules against one MeteredSemaphore."""

    @initialize(
        limit=st.integers(0, 4),
        timeout=st.none() | st.sampled_from([1.0, 2.5]),
        max_queue=st.none() | st.integers(0, 3),
    )
    def setup(self, limit: int, timeout: float | None, max_queue: int | None) -> None:
        self.loop = ManualClockLoop()
        self.sem = MeteredSemaphore(limit, timeout=timeout, max_queue=max_queue)
        self.attempts: list[Attempt] = []
        self.admitted_over_limit: list[tuple[int, int]] = []
        self.overtaken: list[int] = []

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def settle(self) -> None:
        for _ in range(4):
            self.run(asyncio.sleep(0))

    def teardown(self) -> None:
        for attempt in self.attempts:
            attempt.task.cancel()
            attempt.release.set()
        self.settle()
        self.loop.close()

    def of(self, state: State) -> list[Attempt]:
        return [a for a in self.attempts if a.state is state]

    def admitted(self, attempt: Attempt) -> None:
        # Checked at the moment of admission: within the limit in force, and nobody who
        # arrived earlier is still waiting.
        if self.sem.active > self.sem.limit:
            self.admitted_over_limit.append((self.sem.active, self.sem.limit))
        earlier = self.attempts[: self.attempts.index(attempt)]
        if any(a.state is State.WAITING for a in earlier):
            self.overtaken.append(self.attempts.index(attempt))

    @rule(through_enqueue=st.booleans())
    def acquire(self, through_enqueue: bool) -> None:
        attempt = Attempt(self.sem, self.loop, self.admitted, through_enqueue=through_enqueue)
        self.attempts.append(attempt)
        self.settle()

    @rule(limit=st.integers(0, 5))
    def resize(self, limit: int) -> None:
        self.sem.resize(limit)
        self.settle()

    @precondition(lambda self: bool(self.of(State.HOLDING)))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(self.of(State.HOLDING))).release.set()
        self.settle()

    @precondition(lambda self: bool(self.of(State.WAITING)))
    @rule(data=st.data())
    def cancel_waiter(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(self.of(State.WAITING))).task.cancel()
        self.settle()

    @precondition(lambda self: bool(self.of(State.WAITING)) and bool(self.of(State.HOLDING)))
    @rule(data=st.data())
    def release_and_cancel_in_one_step(self, data: st.DataObject) -> None:
        # The slot is handed to the first waiter and that waiter is cancelled before it runs.
        data.draw(st.sampled_from(self.of(State.HOLDING))).release.set()
        self.loop.call_soon(self.cancel_first_waiter_handed_a_slot)
        self.settle()

    def cancel_first_waiter_handed_a_slot(self) -> None:
        # Scheduled right behind the holder's wake-up, it runs in the same loop step just
        # after the holder released: the head waiter owns a slot it has not resumed to take.
        waiting = self.of(State.WAITING)
        if waiting:
            waiting[0].task.cancel()

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0]))
    def advance_clock(self, seconds: float) -> None:
        self.loop.now += seconds
        self.settle()

    @invariant()
    def never_admitted_over_the_limit(self) -> None:
        if hasattr(self, "sem"):
            assert self.admitted_over_limit == []
            assert self.sem.available == max(0, self.sem.limit - self.sem.active)

    @invariant()
    def no_waiter_while_a_slot_is_free(self) -> None:
        if hasattr(self, "sem"):
            assert not (self.sem.queue_depth and self.sem.active < self.sem.limit)

    @invariant()
    def no_hand_over_outlives_its_task(self) -> None:
        # Once every task has run, a slot is held back for nobody: locked() only when full or
        # someone waits (a hand-over never settled would keep try_acquire() failing forever).
        if hasattr(self, "sem"):
            sem = self.sem
            assert sem.locked() == (sem.active >= sem.limit or sem.queue_depth > 0)

    @invariant()
    def admitted_in_arrival_order(self) -> None:
        if hasattr(self, "sem"):
            assert self.overtaken == []

    @invariant()
    def holders_and_waiters_match_the_counts(self) -> None:
        if hasattr(self, "sem"):
            assert self.sem.active == len(self.of(State.HOLDING))
            assert self.sem.queue_depth == len(self.of(State.WAITING))

    @invariant()
    def every_failed_admission_counted_once(self) -> None:
        if hasattr(self, "sem"):
            outcomes = [a.outcome for a in self.attempts]
            assert self.sem.admission_timeouts == outcomes.count("timeout")
            assert self.sem.admission_cancelled == outcomes.count("cancelled")
            assert self.sem.admission_shed == outcomes.count("shed")


SemaphoreMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=50, deadline=None
)
TestSemaphoreMachine = SemaphoreMachine.TestCase
