"""A hypothesis state machine over RateBudget on a clock the test moves by hand: reservations
(with and without an input / output split), settlement with any usage (less, more, absurd),
charging in full, cancelling, calls charged in full at once (`take`, several in a row: a
sliding budget's allowance takes them, budget_allowance.py; `take_one`, and one of those given
back as a limit gives back a cancelled waiter's), provider reports (fresh, stale,
tighter and looser than the budget) and time passing by any amount, slot boundaries included.

Both shapes run. Checked after every step, against a record of every charge kept here:
- sliding: in any 60 s window, the tokens (and requests) charged after settlement never
  exceed the minute's budget plus the overruns charged in that window (calls that used more
  than their estimate); bucket: in any T seconds, never more than the budget + T / 60 of it,
  plus the overruns and the refunds credited then of calls reserved before;
- what the budget says remains is never below 0 or above its size (a refund never takes it
  past), nor above what the provider said less what was reserved since; sliding: nor above
  the size less what was charged in the last 60 s; and once all that was charged has had
  time to leave (61 s; a bucket: its refill) with no report in force, the whole budget is
  there;
- sliding: every admission fits what the last 60 s charged, overruns included;
- reservations take from every budget or none; `reserved` is the estimates not yet settled;
- the wait a refusal returns is exact: the same reservation a microsecond sooner is refused
  again, and at now + wait it succeeds.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gym_concurrency.limits.budget_allowance import GUARD_MARGIN
from gym_concurrency.limits.rate_budget import RateBudget, Reservation
from gym_concurrency.usage import Usage

WINDOW = 60.0
SOONER = 1e-6


class MachineLoop(asyncio.SelectorEventLoop):
    """An event loop on the machine's clock: a guard armed on it fires when the test says."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        self._machine_clock = clock

    def time(self) -> float:
        return self._machine_clock()


@dataclass
class Charge:
    """One charge as recorded here: when, how much (refunds lower it), whether an overrun;
    `estimate`: what a reservation took at first."""

    at: float
    amount: int
    overrun: bool = False
    estimate: int = 0
    counted_from: float | None = None  # charged later than made (a guard that fired late)


@dataclass
class Credit:
    """A refund, credited at `at`, of a reservation made at `reserved_at`."""

    at: float
    amount: int
    reserved_at: float


@dataclass
class Opened:
    reservation: Reservation
    step: int
    charges: dict[str, Charge]


@dataclass
class Report:
    remaining: int
    reset_at: float
    observed_at: float
    step: int
    spent: int = 0


@dataclass
class Model:
    charges: dict[str, list[Charge]] = field(default_factory=dict)
    credits: dict[str, list[Credit]] = field(default_factory=dict)
    refunded: dict[str, int] = field(default_factory=dict)
    reports: dict[str, Report] = field(default_factory=dict)


_ticks = st.sampled_from([0.0, 1e-9, 0.25, 0.5, 0.999999, 1.0, 30.0, 59.0, 60.0, 61.0]) | (
    st.floats(0.0, 130.0, allow_nan=False)
)


class RateBudgetMachine(RuleBasedStateMachine):
    @initialize(
        shape=st.sampled_from(["sliding", "bucket"]),
        start=st.floats(0.0, 10_000.0, allow_nan=False),
        tokens=st.integers(1, 300),
        requests=st.none() | st.integers(1, 6),
        input_tokens=st.none() | st.integers(1, 300),
        output_tokens=st.none() | st.integers(1, 300),
    )
    def setup(
        self,
        shape: str,
        start: float,
        tokens: int,
        requests: int | None,
        input_tokens: int | None,
        output_tokens: int | None,
    ) -> None:
        self.now = start
        self.budget = RateBudget(
            tokens_per_minute=tokens,
            requests_per_minute=requests,
            input_tokens_per_minute=input_tokens,
            output_tokens_per_minute=output_tokens,
            shape=shape,  # type: ignore[arg-type]
            clock=lambda: self.now,
        )
        self.shape = shape
        self.limits: dict[str, int] = dict(self.budget.limits)
        self.model = Model(
            {name: [] for name in self.limits},
            {name: [] for name in self.limits},
            dict.fromkeys(self.limits, 0),
        )
        self.opened: list[Opened] = []
        self.step = 0
        self.loop = MachineLoop(lambda: self.now)
        self.ones: list[dict[str, Charge]] = []  # what the open allowance's take_one took
        # Every take_one's charges, with the allowance's generation then: `give_back`'s.
        self.handed_out: list[tuple[int, dict[str, Charge]]] = []

    def teardown(self) -> None:
        if hasattr(self, "loop"):
            self.loop.close()

    def move_to(self, at: float) -> None:
        """Time passes to `at`, the loop on time: a guard due on the way (it ends a second's
        allowance GUARD_MARGIN before the second does) fires when due."""
        due = math.floor(self.now + GUARD_MARGIN) + 1 - GUARD_MARGIN
        if due <= at:
            self.now = due
            self.spin()
        self.now = at

    def spin(self) -> None:
        self.loop.run_until_complete(asyncio.sleep(0))

    # --- the rules -----------------------------------------------------------------------

    @rule(seconds=_ticks)
    def tick(self, seconds: float) -> None:
        self.move_to(self.now + seconds)

    @rule(data=st.data(), split=st.booleans(), retry=st.booleans())
    def reserve(self, data: st.DataObject, split: bool, retry: bool) -> None:
        limits = self.limits
        if split:
            tokens = data.draw(st.integers(0, limits["tokens"]))
            input_tokens = data.draw(st.integers(0, limits.get("input_tokens", 300)))
            output_tokens = data.draw(st.integers(0, limits.get("output_tokens", 300)))
        else:
            cap = min(limits[n] for n in ("tokens", "input_tokens", "output_tokens") if n in limits)
            tokens, input_tokens, output_tokens = data.draw(st.integers(0, cap)), None, None
        asks = {"tokens": tokens, "requests": 1}
        asks["input_tokens"] = tokens if input_tokens is None else input_tokens
        asks["output_tokens"] = tokens if output_tokens is None else output_tokens
        asks = {name: amount for name, amount in asks.items() if name in limits}

        def attempt() -> Reservation | float:
            before = self.reserved()
            got = self.budget.reserve(
                tokens, input_tokens=input_tokens, output_tokens=output_tokens
            )
            after = self.reserved()
            if isinstance(got, Reservation):  # every budget gave its part: all
                assert after == {n: before[n] + asks[n] for n in limits}, (before, after, asks)
                self.opened_now(got, asks)
            else:  # none
                assert after == before, (before, after)
                assert got > 0.0, got
            return got

        got = attempt()
        if isinstance(got, float) and retry:
            refused_at = self.now
            if got > SOONER:
                self.move_to(refused_at + got - SOONER)
                sooner = attempt()
                assert isinstance(sooner, float), f"fits {SOONER} s before the wait of {got}"
            self.move_to(refused_at + got)
            at_wait = attempt()
            assert isinstance(at_wait, Reservation), f"the wait of {got} s was not enough"

    @rule(data=st.data(), retry=st.booleans(), times=st.integers(1, 4))
    def take(self, data: st.DataObject, retry: bool, times: int) -> None:
        """`times` calls charged in full at once (the allowance's path after the first)."""
        cap = min(
            self.limits[n] for n in ("tokens", "input_tokens", "output_tokens") if n in self.limits
        )
        tokens = data.draw(st.integers(0, cap))
        asks = {name: 1 if name == "requests" else tokens for name in self.limits}

        def attempt() -> float:
            before = self.remaining()
            wait = self.budget.take(tokens)
            if wait == 0.0:
                self.opened_now(None, asks)
            else:
                assert wait > 0.0, wait
                assert self.remaining() == before, (before, self.remaining())
            return wait

        for _ in range(times):
            wait = attempt()
        if wait > 0.0 and retry:
            refused_at = self.now
            if wait > SOONER:
                self.move_to(refused_at + wait - SOONER)
                assert attempt() > 0.0, f"fits {SOONER} s before the wait of {wait}"
            self.move_to(refused_at + wait)
            assert attempt() == 0.0, f"the wait of {wait} s was not enough"

    @rule(times=st.integers(1, 8), cancelled=st.integers(0, 2))
    def take_ones(self, times: int, cancelled: int) -> None:
        """`times` uncontended `async with`s of a limit with this budget, on a running loop:
        `take_one` (no clock: a guard ends the allowance), else `take(1)`; then the last
        `cancelled` calls `take_one` let go (these or earlier ones) are given back."""

        async def ones() -> None:
            for _ in range(times):
                self.one()

        self.loop.run_until_complete(ones())
        for _ in range(min(cancelled, len(self.handed_out))):
            self.give_back_at(len(self.handed_out) - 1)

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0, 61.0]), ones_first=st.integers(0, 3))
    def loop_runs_late(self, seconds: float, ones_first: int) -> None:
        """Time passes while the loop is blocked; then the callbacks ahead of a guard due
        meanwhile take `ones_first` (after its second, maybe) before it fires, late: what
        `take_one` took is charged now, later than taken."""
        self.now += seconds
        for _ in range(ones_first):
            self.one()
        self.charged_late()
        self.spin()

    def one(self) -> None:
        """One `async with`'s admission: `take_one`, else `take(1)`."""
        asks = dict.fromkeys(self.limits, 1)
        allowance = self.budget.allowance
        before = self.remaining()
        if allowance.take_one():
            if allowance.ones == 1:  # the first of this allowance: the ones before charged
                self.ones.clear()
            self.opened_now(None, asks)
            self.ones.append({name: c[-1] for name, c in self.model.charges.items()})
            # The last few: mostly of the open allowance, one of an older one now and then.
            self.handed_out = [*self.handed_out[-3:], (allowance.generation, self.ones[-1])]
            return
        self.charged_late()  # a `take` past the allowance's second charges it first
        if self.budget.take(1) == 0.0:
            self.opened_now(None, asks)
        else:
            assert self.remaining() == before, (before, self.remaining())

    @precondition(lambda self: bool(self.handed_out))
    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        """A waiter a limit handed a slot with `take_one` is cancelled before it resumes: its
        call, never sent, goes back while that allowance is open (else it stays charged)."""
        self.give_back_at(data.draw(st.integers(0, len(self.handed_out) - 1)))

    def give_back_at(self, index: int) -> None:
        generation, charges = self.handed_out.pop(index)
        allowance = self.budget.allowance
        if generation == allowance.generation:  # not charged to the meters yet
            for charge in charges.values():
                charge.amount = 0
            self.ones = [one for one in self.ones if one is not charges]
        allowance.give_back_one(generation)

    def charged_late(self) -> None:
        """The open allowance's ones, if the budget will charge them late (any call now
        does): counted from now."""
        late = self.budget.allowance.late_ones(self.now)
        if late:
            assert late == len(self.ones), (late, len(self.ones))
            for charges in self.ones:
                for charge in charges.values():
                    charge.counted_from = self.now
            self.ones.clear()

    @precondition(lambda self: bool(self.opened))
    @rule(data=st.data(), as_total=st.booleans())
    def settle(self, data: st.DataObject, as_total: bool) -> None:
        opened = self.opened.pop(data.draw(st.integers(0, len(self.opened) - 1)))
        usage: Usage | int
        if as_total:
            usage = data.draw(st.integers(0, 3 * self.limits["tokens"]) | st.just(10**30))
            used = {"tokens": usage}
        else:
            usage = Usage(data.draw(st.integers(0, 400)), data.draw(st.integers(0, 400)))
            used = {"tokens": usage.total, "input_tokens": usage.input_tokens}
            used["output_tokens"] = usage.output_tokens
        self.budget.settle(opened.reservation, usage)
        self.closed(opened, lambda name, estimate: used.get(name, estimate))

    @precondition(lambda self: bool(self.opened))
    @rule(data=st.data())
    def charge_in_full(self, data: st.DataObject) -> None:
        opened = self.opened.pop(data.draw(st.integers(0, len(self.opened) - 1)))
        self.budget.charge_in_full(opened.reservation)
        self.closed(opened, lambda _name, estimate: estimate)

    @precondition(lambda self: bool(self.opened))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        opened = self.opened.pop(data.draw(st.integers(0, len(self.opened) - 1)))
        self.budget.cancel(opened.reservation)
        self.closed(opened, lambda _name, _estimate: 0)

    @rule(
        data=st.data(),
        reset_in=st.sampled_from([0.0, 0.5, 1.0, 30.0]) | st.floats(0.0, 90.0),
        age=st.sampled_from([0.0, 0.0, 5.0]),
    )
    def report(self, data: st.DataObject, reset_in: float, age: float) -> None:
        name = data.draw(st.sampled_from(sorted(self.limits)))
        remaining = data.draw(st.integers(0, 2 * self.limits[name]))
        observed = self.now - age
        self.budget.report(
            name, remaining=remaining, reset_at=self.now + reset_in, observed_at=observed
        )
        self.step += 1
        current = self.report_in_force(name)
        reset_at = self.now + reset_in
        if reset_at > self.now and (current is None or observed >= current.observed_at):
            self.model.reports[name] = Report(remaining, reset_at, observed, self.step)

    # --- what is checked -----------------------------------------------------------------

    @invariant()
    def no_window_holds_more_than_the_budget_and_its_overruns(self) -> None:
        for name, limit in self.limits.items():
            charges = self.model.charges[name]
            starts = sorted({c.at for c in charges})
            for start in starts:
                ends = [start + WINDOW] if self.shape == "sliding" else starts
                for end in (e for e in ends if e >= start):
                    if self.shape == "sliding":
                        inside = [c for c in charges if start <= c.at < end]
                        allowed = limit
                    else:  # a bucket: its size and the refill, and late refunds
                        inside = [c for c in charges if start <= c.at <= end]
                        late = self.model.credits[name]
                        allowed = limit + limit * (end - start) / WINDOW + 1e-6 * limit
                        allowed += sum(
                            c.amount for c in late if start <= c.at <= end and c.reserved_at < start
                        )
                    charged = sum(c.amount for c in inside)
                    overruns = sum(c.amount for c in inside if c.overrun)
                    assert charged <= allowed + overruns, (name, start, end, charged, allowed)

    @invariant()
    def remaining_is_bounded_by_the_budget_the_window_and_the_provider(self) -> None:
        statistics = self.budget.statistics()
        for name, limit in self.limits.items():
            stats = getattr(statistics, name)
            recent = sum(c.amount for c in self.model.charges[name] if c.at >= self.now - WINDOW)
            assert 0 <= stats.remaining <= limit, stats
            if self.shape == "sliding":
                assert stats.remaining <= max(0, limit - recent), (stats, recent)
            report = self.report_in_force(name)
            if report is None:
                assert stats.reported_remaining is None, stats
                if self.all_charges_have_left(name):
                    assert stats.remaining == limit, (stats, self.now)  # nothing held back
            else:
                assert stats.reported_remaining == report.remaining, stats
                assert stats.remaining <= max(0, report.remaining - report.spent), (stats, report)

    @invariant()
    def reserved_and_refunded_are_what_happened(self) -> None:
        expected = {
            name: sum(o.reservation.estimate(name) for o in self.opened) for name in self.limits
        }
        assert self.reserved() == expected
        statistics = self.budget.statistics()
        refunded = {name: getattr(statistics, name).refunded_total for name in self.limits}
        assert refunded == self.model.refunded

    # --- the record ----------------------------------------------------------------------

    def reserved(self) -> dict[str, int]:
        statistics = self.budget.statistics()
        return {name: getattr(statistics, name).reserved for name in self.limits}

    def all_charges_have_left(self, name: str) -> bool:
        charges = [c for c in self.model.charges[name] if c.amount or c.estimate]
        if not charges:
            return True
        if self.shape == "sliding":
            return all((c.counted_from or c.at) <= self.now - 61.0 for c in charges)
        taken = sum(c.estimate if not c.overrun else c.amount for c in charges)
        last = max(c.at for c in charges)
        return (self.now - last) * self.limits[name] / WINDOW >= taken

    def report_in_force(self, name: str) -> Report | None:
        report = self.model.reports.get(name)
        if report is not None and self.now >= report.reset_at:
            del self.model.reports[name]
            return None
        return report

    def remaining(self) -> dict[str, int]:
        statistics = self.budget.statistics()
        return {name: getattr(statistics, name).remaining for name in self.limits}

    def opened_now(self, reservation: Reservation | None, asks: dict[str, int]) -> None:
        """Charged now; kept open unless `reservation` is None (charged in full at once)."""
        self.step += 1
        if self.shape == "sliding":  # it fit what the last 60 s charged (overruns included)
            for name, amount in asks.items():
                recent = sum(c.amount for c in self.model.charges[name] if c.at > self.now - WINDOW)
                assert not amount or recent + amount <= self.limits[name], (name, recent, amount)
        charges = {name: Charge(self.now, amount, estimate=amount) for name, amount in asks.items()}
        for name, charge in charges.items():
            self.model.charges[name].append(charge)
            report = self.report_in_force(name)
            if report is not None:
                if charge.amount:  # (a reservation of nothing is never refused)
                    assert report.spent + charge.amount <= report.remaining, (name, report)
                report.spent += charge.amount
        if reservation is not None:
            self.opened.append(Opened(reservation, self.step, charges))

    def closed(self, opened: Opened, used: Callable[[str, int], int]) -> None:
        self.step += 1
        for name, charge in opened.charges.items():
            estimate = opened.reservation.estimate(name)
            actual = min(used(name, estimate), self.limits[name])  # a usage past it: capped
            if actual < estimate:
                charge.amount -= estimate - actual
                self.model.refunded[name] += estimate - actual
                credit = Credit(self.now, estimate - actual, charge.at)
                self.model.credits[name].append(credit)
            elif actual > estimate:
                self.model.charges[name].append(Charge(self.now, actual - estimate, overrun=True))
            report = self.report_in_force(name)
            if report is not None and opened.step > report.step:
                report.spent += actual - estimate


RateBudgetMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRateBudget = RateBudgetMachine.TestCase
