"""A hypothesis state machine over random interleavings of acquire, timeout, cancel, release.

The loop runs on a clock the test advances, so deadlines fire exactly when a rule says so.
After every step: never more holders than the limit, active + available == limit,
queue_depth == tasks waiting, and every finished attempt counted exactly once.
"""

from __future__ import annotations

import asyncio
from enum import Enum

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gym_concurrency import MeteredSemaphore, QueueFullError


class ManualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose time only moves when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now


class State(Enum):
    WAITING = "waiting"
    HOLDING = "holding"
    DONE = "done"


class Attempt:
    """One task trying the semaphore: waits, holds until told to release, then ends."""

    def __init__(self, sem: MeteredSemaphore, loop: asyncio.AbstractEventLoop) -> None:
        self.state = State.WAITING
        self.outcome: str | None = None
        self.release = asyncio.Event()
        self.task = loop.create_task(self.run(sem))

    async def run(self, sem: MeteredSemaphore) -> None:
        try:
            await sem.acquire()
        except TimeoutError:
            self.outcome, self.state = "timeout", State.DONE
            return
        except QueueFullError:
            self.outcome, self.state = "shed", State.DONE
            return
        except asyncio.CancelledError:
            self.outcome, self.state = "cancelled", State.DONE
            raise
        self.outcome, self.state = "admitted", State.HOLDING
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

    @rule()
    def acquire(self) -> None:
        self.attempts.append(Attempt(self.sem, self.loop))
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
    def never_over_the_limit(self) -> None:
        if hasattr(self, "sem"):
            assert self.sem.active <= self.sem.limit
            assert self.sem.active + self.sem.available == self.sem.limit

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
