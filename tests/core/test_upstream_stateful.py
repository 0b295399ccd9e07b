"""A hypothesis state machine over a MeteredSemaphore with a rate budget (a sliding minute of
tokens, and of requests or not), on an event loop whose clock only the test moves: random
acquires (through `acquire()` and `async with`, charged in full; through `enqueue()` +
`settle()`; through `hold()`; often weight 1 and an estimate of 1, which queue in plain FIFO
order until another ask joins), releases that settle the reservation from a usage, charge it
in full or cancel it, cancellations (also of a waiter handed its slots and budget in that same
step), timeouts and clock advances.

After every step: no 60 s interval holds more tokens (nor requests) than the budget, counting
what each call was finally charged; held weight never exceeds the limit; the limit is never
idle while the waiter next in line fits both its slots and the budget; what the budget holds
reserved is exactly the open reservations; every failed admission is counted once, as what it
was. At the end every waiter's wait has ended.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits import UpstreamCapacityError
from gym_concurrency.limits.rate_budget import RateBudget, Reservation
from tests.core.clock import ManualClockLoop

Usage = int | str | None  # tokens used, "cancel" (never sent) or None (charged in full)


@dataclass(eq=False)
class Call:
    """One task asking for `weight` slots and `tokens` of the budget, one of three ways."""

    weight: int
    tokens: int
    how: str  # "acquire", "async with", "enqueue" or "hold"
    outcome: str | None = None  # admitted, timeout, budget, cancelled
    holding: bool = False
    done: bool = False
    admitted_at: float | None = None
    charged: int = 0  # the tokens this call is charged now (its final charge once closed)
    requests: int = 0
    open_reservation: bool = False
    usage: Usage = None
    release: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def run(self, sem: MeteredSemaphore, budget: RateBudget) -> None:
        try:
            if self.how == "async with":  # weight 1, an estimate of 1, charged in full
                async with sem:
                    self._admitted(sem, open_reservation=False)
                    await self.release.wait()
                self.holding, self.done = False, True
                return
            if self.how == "hold":
                async with sem.hold(self.weight, tokens=self.tokens) as held:
                    self._admitted(sem, open_reservation=True)
                    await self.release.wait()
                    self._close(held.settle, held.cancel, lambda: None)  # exit charges it
                self.holding, self.done = False, True
                return
            reservation: Reservation | None = None
            if self.how == "acquire":
                await sem.acquire(self.weight, tokens=self.tokens)
            else:
                waiter = sem.enqueue(self.weight, tokens=self.tokens)
                try:
                    admission = await waiter
                except asyncio.CancelledError:
                    sem.leave(waiter)
                    raise
                reservation = sem.settle(waiter)
                if admission != "admitted":
                    self.outcome, self.done = admission, True
                    return
            self._admitted(sem, open_reservation=reservation is not None)
            try:
                await self.release.wait()
                if reservation is not None:
                    r = reservation
                    self._close(
                        lambda used: budget.settle(r, used),
                        lambda: budget.cancel(r),
                        lambda: budget.charge_in_full(r),
                    )
            finally:
                sem.release(self.weight)
                self.holding, self.done = False, True
        except UpstreamCapacityError as error:
            self.outcome, self.done = error.reason, True
        except TimeoutError:
            self.outcome, self.done = "timeout", True
        except asyncio.CancelledError:
            if self.outcome is None:
                self.outcome = "cancelled"
            self.done = True
            raise

    def _admitted(self, sem: MeteredSemaphore, open_reservation: bool) -> None:
        self.outcome, self.holding = "admitted", True
        self.admitted_at = asyncio.get_running_loop().time()
        self.charged, self.requests = self.tokens, 1
        self.open_reservation = open_reservation
        assert sem.active <= sem.limit

    def _close(self, settle, cancel, charge_in_full) -> None:  # type: ignore[no-untyped-def]
        # Before the slots are released: the admission that release makes sees the refund.
        if self.usage == "cancel":
            cancel()
            self.charged, self.requests = 0, 0
        elif isinstance(self.usage, int):
            settle(self.usage)
            self.charged = self.usage
        else:
            charge_in_full()
        self.open_reservation = False


class UpstreamMachine(RuleBasedStateMachine):
    """Random schedules against one MeteredSemaphore with a RateBudget."""

    @initialize(
        limit=st.integers(1, 3),
        tokens_per_minute=st.sampled_from([60, 100]),
        requests_per_minute=st.none() | st.just(3),
        timeout=st.none() | st.sampled_from([20.0, 90.0]),
    )
    def setup(
        self, limit: int, tokens_per_minute: int, requests_per_minute: int | None, timeout: float
    ) -> None:
        self.loop = ManualClockLoop()
        self.budget = RateBudget(
            tokens_per_minute=tokens_per_minute,
            requests_per_minute=requests_per_minute,
            clock=self.loop.time,
        )
        self.tpm, self.rpm = tokens_per_minute, requests_per_minute
        self.sem = MeteredSemaphore(limit, budget=self.budget, timeout=timeout)
        self.calls: list[Call] = []

    def spin(self) -> None:
        for _ in range(6):
            self.loop.run_until_complete(asyncio.sleep(0))

    def teardown(self) -> None:
        if not hasattr(self, "sem"):
            return
        # Every wait ends: holders release, the clock runs on; nobody is cancelled here. A
        # minute admits at least one call, whatever it asks: a bound of a minute a call.
        for _ in range(len(self.calls) + 2):
            for call in self.calls:
                call.release.set()
            self.loop.now += 61.0
            self.spin()
            if all(c.done for c in self.calls):
                break
        stuck = [c for c in self.calls if not c.done]
        for call in stuck:
            assert call.task is not None
            call.task.cancel()
        self.spin()
        self.loop.close()
        assert stuck == [], "waits that never ended"
        assert (self.sem.active, self.sem.queue_depth) == (0, 0)

    def waiting(self) -> list[Call]:
        return [c for c in self.calls if c.outcome is None and not c.done]

    def holding(self) -> list[Call]:
        return [c for c in self.calls if c.holding]

    @rule(
        weight=st.integers(1, 2),
        tokens=st.integers(0, 60) | st.just(1),
        how=st.sampled_from(["acquire", "async with", "enqueue", "hold"]),
    )
    def ask(self, weight: int, tokens: int, how: str) -> None:
        if how == "async with":
            weight, tokens = 1, 1
        call = Call(min(weight, self.sem.limit), tokens, how)
        call.task = self.loop.create_task(call.run(self.sem, self.budget))
        self.calls.append(call)
        self.spin()

    @precondition(lambda self: bool(self.holding()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        call = data.draw(st.sampled_from(self.holding()))
        call.usage = data.draw(st.none() | st.just("cancel") | st.integers(0, call.tokens))
        call.release.set()
        self.spin()

    @precondition(lambda self: bool(self.waiting()))
    @rule(data=st.data())
    def cancel_waiter(self, data: st.DataObject) -> None:
        call = data.draw(st.sampled_from(self.waiting()))
        assert call.task is not None
        call.task.cancel()
        self.spin()

    @precondition(lambda self: bool(self.waiting()) and bool(self.holding()))
    @rule(data=st.data())
    def release_and_cancel_in_one_step(self, data: st.DataObject) -> None:
        # The holder's release hands slots (and a reservation) to the head waiter, whose task
        # is cancelled before it resumes: both come back.
        data.draw(st.sampled_from(self.holding())).release.set()
        self.loop.call_soon(self._cancel_first_waiter)
        self.spin()

    def _cancel_first_waiter(self) -> None:
        waiting = self.waiting()
        if waiting and waiting[0].task is not None:
            waiting[0].task.cancel()

    @rule(seconds=st.sampled_from([0.5, 7.0, 30.0, 61.0]))
    def advance_clock(self, seconds: float) -> None:
        self.loop.now += seconds
        self.spin()

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def no_minute_holds_more_than_the_budget(self) -> None:
        if not hasattr(self, "sem"):
            return
        admitted = sorted(
            (c.admitted_at, c.charged, c.requests) for c in self.calls if c.admitted_at is not None
        )
        for start, _, _ in admitted:
            window = [(t, r) for at, t, r in admitted if start <= at < start + 60.0]
            assert sum(t for t, _ in window) <= self.tpm, (start, window)
            if self.rpm is not None:
                assert sum(r for _, r in window) <= self.rpm, (start, window)

    @invariant()
    def slots_held_are_the_holders(self) -> None:
        if hasattr(self, "sem"):
            assert self.sem.active == sum(c.weight for c in self.holding())
            assert self.sem.active <= self.sem.limit

    @invariant()
    def never_idle_while_the_next_waiter_fits(self) -> None:
        if not hasattr(self, "sem"):
            return
        waiting = self.waiting()
        if waiting:  # one flow: the oldest waiter is next
            head = waiting[0]
            fits_slots = self.sem.active + head.weight <= self.sem.limit
            assert not fits_slots or self.budget.wait_for(head.tokens) > 0.0

    @invariant()
    def the_budget_holds_exactly_the_open_reservations(self) -> None:
        if not hasattr(self, "sem"):
            return
        tokens = self.budget.statistics().tokens
        assert tokens is not None
        assert tokens.reserved == sum(c.tokens for c in self.calls if c.open_reservation)

    @invariant()
    def every_failed_admission_is_counted_once_as_what_it_was(self) -> None:
        if not hasattr(self, "sem"):
            return
        outcomes = [c.outcome for c in self.calls]
        late = sum(o in ("timeout", "budget", "saturated") for o in outcomes)
        assert self.sem.admission_timeouts == late
        assert self.sem.admission_budget == outcomes.count("budget")
        assert self.sem.admission_saturated == 0
        assert self.sem.admission_cancelled == outcomes.count("cancelled")


UpstreamMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None
)
test_upstream_state_machine = UpstreamMachine.TestCase
