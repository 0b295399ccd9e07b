"""A hypothesis state machine: one caller admitting through an EngineSignal into a model
engine (running at most B requests, a FIFO waiting queue beyond them),
with scrapes sent and landing at any moment between admissions, arrivals, completions and
the clock's steps. Whatever the interleaving, the engine's queue never passes waiting_max (nor
the floor, which bounds the caller's calls while the signal is stale): when calls reach the
engine at once, and also when they take a while to, with batch_size (the caller's calls in
flight never pass batch_size + waiting_max).

Scrapes are driven by hand through the poller's `landed()`, the one place a landed scrape
is recorded, so that a scrape can be in flight across any number of admissions."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gym_concurrency.engines import EngineLoad, EngineSignal
from gym_concurrency.engines.poller import EnginePoller
from tests.engines.bodies import Bodies, engine_url

STALE_AFTER = 1.0


@dataclass
class Scrape:
    load: EngineLoad
    sent: float
    base: int


class Engine:
    """Running requests up to `slots` (the batch, or fewer when the KV cache holds fewer),
    the rest waiting in arrival order."""

    def __init__(self, slots: int) -> None:
        self.slots, self.running, self.waiting = slots, 0, 0

    def arrive(self) -> None:
        if self.waiting == 0 and self.running < self.slots:
            self.running += 1
        else:
            self.waiting += 1

    def complete(self) -> None:
        self.running -= 1
        if self.waiting:
            self.waiting -= 1
            self.running += 1

    def load(self) -> EngineLoad:
        return EngineLoad(float(self.waiting), self.running / self.slots, float(self.running))


class Admission(RuleBasedStateMachine):
    @initialize(
        waiting_max=st.integers(1, 6),
        batch=st.integers(1, 8),
        with_batch_size=st.booleans(),
        cache_max=st.sampled_from([None, None, 0.5, 1.0]),
        transit=st.booleans(),
        data=st.data(),
    )
    def start(
        self,
        waiting_max: int,
        batch: int,
        with_batch_size: bool,
        cache_max: float | None,
        transit: bool,
        data: st.DataObject,
    ) -> None:
        self.floor = data.draw(st.integers(0, waiting_max))
        # Calls in transit: admitted, not at the engine yet (what no scrape nor count sees).
        self.transit: int | None = 0 if transit else None
        self.waiting_max = waiting_max
        self.batch_size = batch if with_batch_size else None
        self.signal = EngineSignal(
            engine_url(),
            waiting_max=waiting_max,
            cache_max=cache_max,
            floor=self.floor,
            batch_size=self.batch_size,
            interval_seconds=STALE_AFTER / 3,
            stale_after_seconds=STALE_AFTER,
            fetch=Bodies(),  # never called: no loop runs, scrapes are driven by hand
        )
        self.poller: EnginePoller = self.signal._poller
        # Without batch_size the signal assumes nothing of the batch: the engine may run
        # fewer (its KV cache holding fewer requests than its batch). With it, batch_size is
        # what the engine runs at once at most, as documented.
        slots = batch if with_batch_size else data.draw(st.integers(1, batch))
        self.engine = Engine(slots)
        self.in_flight = 0
        self.now = 1000.0
        self.scrape: Scrape | None = None

    @rule()
    def admit(self) -> None:
        stale = self.signal.statistics(self.now).stale
        if not self.signal.admits(self.now, self.in_flight):
            return
        assert not stale or self.in_flight < self.floor, "stale: only up to the floor"
        self.signal.admitted(1)
        self.in_flight += 1
        if self.transit is None:
            self.engine.arrive()
        else:
            self.transit += 1

    @precondition(lambda self: bool(self.transit))
    @rule()
    def arrive(self) -> None:
        assert self.transit is not None
        self.transit -= 1
        self.engine.arrive()

    @precondition(lambda self: self.engine.running > 0)
    @rule()
    def complete(self) -> None:
        self.engine.complete()
        self.in_flight -= 1

    @precondition(lambda self: self.scrape is None)
    @rule()
    def send_scrape(self) -> None:
        self.scrape = Scrape(self.engine.load(), self.now, self.poller.admitted_total)

    @precondition(lambda self: self.scrape is not None)
    @rule()
    def land_scrape(self) -> None:
        assert self.scrape is not None
        self.poller.landed(self.scrape.load, self.scrape.sent, self.scrape.base)
        self.scrape = None

    @precondition(lambda self: self.scrape is not None)
    @rule()
    def fail_scrape(self) -> None:
        self.scrape = None

    @rule(seconds=st.sampled_from([0.01, 0.3, 0.9, 2.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def the_queue_stays_within_waiting_max_and_the_floor(self) -> None:
        if not hasattr(self, "engine"):
            return
        if self.transit is None or self.batch_size is not None:
            assert self.engine.waiting <= max(self.waiting_max, self.floor)

    @invariant()
    def with_a_batch_size_calls_in_flight_stay_within_batch_and_queue(self) -> None:
        if getattr(self, "batch_size", None) is not None:
            assert self.in_flight <= self.batch_size + self.waiting_max  # type: ignore[operator]


Admission.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestAdmission = Admission.TestCase
