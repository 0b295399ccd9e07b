"""The adaptive controllers against a simulated upstream, and their guard-rails as hypothesis
properties: always within [min, max], down on overload, no upward creep behind a queue.

The simulation is a closed loop in virtual time: `clients` requests always want a slot, so a
queue stands in front of the limit whenever there are more clients than slots. The upstream's
latency depends on how many are in flight: flat up to its knee K, then growing as (c / K)**2
(past the knee it thrashes: goodput falls), and past `refuse_factor * K` it answers 503 at
once. Best goodput is K / base latency, at a static limit of K.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits.adaptive import (
    AdaptiveController,
    AdaptiveLimiter,
    AimdController,
    GradientController,
    make_controller,
)
from gym_concurrency.limits.handover_rate import HandoverRate

BASE = 0.1  # seconds, the upstream's latency below its knee


def knee_latency(inflight: int, knee: float, thrash: float = 2.0) -> float:
    x = inflight / knee
    return BASE * (x**thrash if x > 1 else 1.0)


@dataclass
class Run:
    """What a simulated run saw: (time, limit) after every sample, and each ok's finish."""

    limits: list[tuple[float, int]] = field(default_factory=list)
    ok: list[float] = field(default_factory=list)
    refused: int = 0

    def goodput(self, start: float, end: float) -> float:
        return sum(1 for t in self.ok if start <= t < end) / (end - start)

    def limits_between(self, start: float, end: float) -> list[int]:
        return [limit for t, limit in self.limits if start <= t < end]


def simulate(
    controller: AdaptiveController,
    *,
    knee: Callable[[float], float],
    seconds: float,
    clients: int = 96,
    noise: float = 0.1,
    seed: int = 0,
    latency: Callable[[int, float, float], float] | None = None,
    refuse_factor: float = 2.0,
) -> Run:
    """Drive `controller` with a closed loop of `clients` against the knee upstream."""
    rng = random.Random(seed)
    latency_of = latency or (lambda inflight, k, now: knee_latency(inflight, k))
    run = Run()
    events: list[tuple[float, int, float, bool]] = []
    inflight, waiting, sequence, limit = 0, clients, 0, controller.limit

    def admit(now: float) -> None:
        nonlocal inflight, waiting, sequence
        while waiting and inflight < limit:
            waiting -= 1
            inflight += 1
            k = knee(now)
            refused = inflight > refuse_factor * k
            jitter = rng.lognormvariate(0, noise)
            delay = 0.002 if refused else latency_of(inflight, k, now) * jitter
            sequence += 1
            heapq.heappush(events, (now + delay, sequence, now, refused))

    admit(0.0)
    while events:
        finished, _, started, refused = heapq.heappop(events)
        if finished > seconds:
            break
        new = controller.sample(started, finished, overload=refused, inflight=inflight)
        inflight -= 1
        waiting += 1
        if refused:
            run.refused += 1
        else:
            run.ok.append(finished)
        if new is not None:
            limit = new
        run.limits.append((finished, limit))
        admit(finished)
    return run


def gradient(initial: int = 4, **options: float) -> GradientController:
    return GradientController(4, 256, initial, **options)  # type: ignore[arg-type]


# --- against the simulated knee ---------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_finds_the_knee_and_keeps_goodput_near_the_best_static_limit(seed: int):
    controller = gradient()
    run = simulate(controller, knee=lambda t: 32, seconds=60, seed=seed)
    best = 32 / BASE
    assert run.goodput(10, 60) >= 0.88 * best
    limits = run.limits_between(10, 60)
    assert 28 <= sum(limits) / len(limits) <= 38
    assert run.refused == 0  # it never went anywhere near twice the knee


def test_gradient_follows_the_knee_down_within_a_few_seconds():
    controller = gradient()
    run = simulate(controller, knee=lambda t: 32 if t < 30 else 16, seconds=60)
    # The old limit (about 32) runs at twice the new knee: latency x4. It shrinks at once.
    assert max(run.limits_between(32, 60)) <= 20
    assert run.goodput(32, 60) >= 0.85 * 16 / BASE


def test_gradient_grows_from_the_floor_to_the_knee_in_a_few_seconds():
    run = simulate(gradient(), knee=lambda t: 64, seconds=10)
    assert run.goodput(5, 10) >= 0.85 * 64 / BASE


def test_aimd_steps_up_by_one_and_backs_off_on_overload_answers():
    controller = AimdController(4, 100, 10, tolerance=None, probe_seconds=None)
    # A saturated window with no overload: +1.
    for i in range(10):
        controller.sample(i, i + 0.1, overload=False, inflight=10)
    assert controller.limit == 11
    for i in range(11):
        controller.sample(20 + i, 20.1 + i, overload=i == 0, inflight=11)
    assert controller.limit == 10  # 11 * 0.9 = 9.9, rounded


def test_aimd_without_a_tolerance_ignores_latency():
    controller = AimdController(4, 100, 10, tolerance=None)
    for i in range(10):
        controller.sample(i, i + 0.1, overload=False, inflight=10)
    for i in range(11):
        controller.sample(20 + i, 20 + i + 5.0, overload=False, inflight=11)  # 50x slower
    assert controller.limit == 12


def test_aimd_with_a_tolerance_backs_off_on_latency():
    run = simulate(make_controller("aimd", 4, 256, 4), knee=lambda t: 32, seconds=60)
    limits = run.limits_between(20, 60)
    assert max(limits) <= 45
    assert run.goodput(20, 60) >= 0.8 * 32 / BASE


def test_an_idle_limit_does_not_grow():
    controller = gradient(initial=20)
    for i in range(200):  # plenty of fast samples, never more than 5 in flight
        controller.sample(i * 0.01, i * 0.01 + 0.1, overload=False, inflight=5)
    assert controller.limit == 20


def test_samples_admitted_before_a_change_do_not_count():
    controller = AimdController(4, 100, 10, probe_seconds=None)
    for i in range(10):
        controller.sample(1.0, 2.0 + i * 0.001, overload=False, inflight=10)
    assert controller.limit == 11  # changed at t = 2.009
    for _ in range(50):  # all admitted at 1.0, before the change: ignored
        assert controller.sample(1.0, 3.0, overload=True, inflight=11) is None
    assert controller.limit == 11


def probe_run(controller: AdaptiveController, seconds: float) -> list[int]:
    """The limits a saturated limit with flat latency goes through."""
    changes, t = [controller.limit], 0.0
    while t < seconds:
        t += 0.002
        new = controller.sample(t - 0.1, t, overload=False, inflight=controller.limit)
        if new is not None:
            changes.append(new)
    return changes


def test_a_probe_steps_down_to_a_fraction_of_the_limit_never_below_the_floor():
    changes = probe_run(GradientController(10, 100, 40, probe_seconds=5.0), 30)
    # The limit only grew (saturated, latency flat) but for probes every 5 s, each 0.75x.
    drops = [(a, b) for a, b in itertools.pairwise(changes) if b < a]
    assert 3 <= len(drops) <= 6
    assert all(0.7 * a <= b < a for a, b in drops)  # 0.75x the estimate grown that window
    floored = probe_run(GradientController(10, 12, 12, probe_seconds=5.0), 30)
    assert min(floored) == 10  # 0.75 * 12 = 9: the floor holds


def test_an_upstream_slower_for_everyone_is_relearned_at_the_floor_within_a_probe_interval():
    slow_from = 30.0

    def latency(inflight: int, k: float, now: float) -> float:
        return knee_latency(inflight, k) * (2.0 if now >= slow_from else 1.0)

    controller = gradient()
    run = simulate(controller, knee=lambda t: 32, seconds=60, latency=latency)
    # Twice as slow at every concurrency: the limit shrinks (latency is past the tolerance),
    # at its floor the next probe takes the latency there for the baseline, and it grows back
    # to the knee, still 32 in flight.
    assert min(run.limits_between(30, 45)) == 4
    assert run.goodput(50, 60) >= 0.85 * 32 / (2 * BASE)


def test_adaptive_limiter_resizes_the_limit_it_drives():
    async def main() -> None:
        semaphore = MeteredSemaphore(16)
        changes: list[tuple[int, int]] = []
        limiter = AdaptiveLimiter(
            semaphore,
            AimdController(4, 64, 8, probe_seconds=None),
            on_change=lambda old, new: changes.append((old, new)),
        )
        assert semaphore.limit == 8  # the controller's initial limit at once
        for _ in range(8):
            await semaphore.acquire()
        for i in range(10):  # a window: 10 samples, 8 in flight (all of the limit)
            limiter.record(float(i), i + 0.05, overload=False)
        assert semaphore.limit == 9
        assert changes == [(8, 9)]
        for _ in range(8):
            semaphore.release()

    asyncio.run(main())


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="min_limit"):
        GradientController(0, 10)
    with pytest.raises(ValueError, match="min_limit"):
        GradientController(10, 5)
    with pytest.raises(ValueError, match="outside"):
        GradientController(1, 5, 6)
    with pytest.raises(ValueError, match="tolerance"):
        GradientController(1, 5, tolerance=1.0)
    with pytest.raises(ValueError, match="needs a latency tolerance"):
        make_controller("gradient", 1, 5, tolerance=None)
    with pytest.raises(ValueError, match="unknown algorithm"):
        make_controller("vegas", 1, 5)  # type: ignore[arg-type]


# --- hypothesis: guard-rails for any input ------------------------------------------------

algorithms = st.sampled_from(["gradient", "aimd"])
samples = st.lists(
    st.tuples(
        st.floats(0.0, 10.0),  # latency
        st.booleans(),  # overload
        st.integers(0, 300),  # in flight
        st.floats(0.0, 1.0),  # time since the previous sample
    ),
    max_size=400,
)


@settings(max_examples=200, deadline=None)
@given(
    algorithm=algorithms,
    low=st.integers(1, 50),
    span=st.integers(0, 200),
    data=samples,
    start=st.floats(0, 1),
)
def test_the_limit_is_always_within_its_floor_and_ceiling(algorithm, low, span, data, start):
    high = low + span
    controller = make_controller(algorithm, low, high, low + int(start * span))
    now = 0.0
    for latency, overload, inflight, gap in data:
        now += gap
        new = controller.sample(now - latency, now, overload=overload, inflight=inflight)
        assert low <= controller.limit <= high
        assert new is None or new == controller.limit


@settings(max_examples=200, deadline=None)
@given(algorithm=algorithms, data=samples, fraction=st.floats(0.1, 1.0))
def test_a_window_with_overload_answers_lowers_the_limit(algorithm, data, fraction):
    controller = make_controller(algorithm, 2, 500, 100, probe_seconds=None)
    now = 0.0
    for latency, overload, inflight, gap in data:  # any history
        now += gap
        controller.sample(now - latency, now, overload=overload, inflight=inflight)
    before = controller.limit
    now += 1.0
    overloads = max(1, int(400 * fraction))
    for i in range(400):  # admitted after any change, at least one window's worth
        controller.sample(now, now + 0.1 + i * 1e-6, overload=i < overloads, inflight=100)
    assert controller.limit < before or controller.limit == 2


@settings(max_examples=15, deadline=None)
@given(
    algorithm=algorithms,
    knee=st.integers(8, 48),
    thrash=st.floats(1.0, 4.0),
    noise=st.floats(0.0, 0.2),
    seed=st.integers(0, 2**16),
)
# A low middle by chance (CI, 3.13): over 120 s the means of its 15-s windows stay 8.5-10.5.
@example(algorithm="gradient", knee=9, thrash=1.25, noise=0.1875, seed=23937)
def test_no_upward_creep_behind_a_standing_queue(algorithm, knee, thrash, noise, seed):
    """Latency that rises with the limit while a queue stands in front of it never pulls the
    limit up past where latency crossed the tolerance, however long it runs."""
    controller = make_controller(algorithm, 2, 1000, 2)
    run = simulate(
        controller,
        knee=lambda t: knee,
        seconds=45,
        clients=3 * knee + 20,
        noise=noise,
        seed=seed,
        latency=lambda inflight, k, now: knee_latency(inflight, k, thrash),
        refuse_factor=math.inf,
    )
    tolerance = controller.tolerance
    assert tolerance is not None
    # The highest limit at which latency is still within tolerance (noise aside), plus one
    # step of growth and the noise's reach: nothing ever goes past it, early or late.
    crossing = knee * (tolerance * math.exp(3 * noise)) ** (1 / thrash)
    bound = crossing + math.sqrt(crossing) + 2
    assert max(limit for _, limit in run.limits) <= bound
    middle, late = run.limits_between(15, 30), run.limits_between(30, 45)
    # No drift with time: a window's mean moves by the noise's reach (as the bound's does).
    reach = math.sqrt(crossing) + 1
    assert sum(late) / len(late) <= 1.1 * sum(middle) / len(middle) + reach


@settings(max_examples=100, deadline=None)
@given(
    algorithm=algorithms,
    rises=st.lists(st.floats(1.0, 1.5), min_size=5, max_size=60),
    start=st.integers(10, 200),
)
def test_rising_latency_with_a_standing_queue_never_raises_the_limit(algorithm, rises, start):
    """Once latency is past the tolerance, a queue in front of the limit (every slot in use
    at every sample) and a latency still rising (or level) window after window never raise
    it. (Probes off: at its floor a probe would take the latency there for the baseline.)"""
    controller = make_controller(algorithm, 1, 1000, start, probe_seconds=None)
    now, latency = 0.0, 0.1
    for i in range(controller.limit):  # a first window sets the baseline
        controller.sample(now, now + latency + i * 1e-6, overload=False, inflight=start)
    now = 1.0
    latency *= controller.tolerance * 1.01  # past the tolerance from here on
    previous = controller.limit
    for rise in rises:
        latency *= rise
        limit = controller.limit
        for i in range(limit):
            controller.sample(now, now + latency + i * 1e-6, overload=False, inflight=limit)
        now += latency + 1.0
        assert controller.limit <= previous
        previous = controller.limit


# --- the hand-over rate behind Retry-After: auto ---------------------------------------------


def test_ten_queued_at_five_releases_a_second_is_about_two_seconds():
    rate = HandoverRate()
    for i in range(15):  # 5 a second for 3 s
        rate.release(100.0 + i * 0.2)
    assert rate.per_second(103.0) == pytest.approx(5.0, rel=0.05)
    assert rate.retry_after(10, 103.0) == 2


def test_retry_after_is_clamped_to_one_and_sixty_seconds():
    rate = HandoverRate()
    assert rate.retry_after(0, 5.0) == 60  # nothing released yet: the queue does not move
    for i in range(1000):
        rate.release(5.0 + i * 0.001)
    assert rate.retry_after(0, 6.0) == 1
    slow = HandoverRate()
    slow.release(10.0)
    assert slow.retry_after(500, 10.5) == 60


def test_an_idle_second_forgets_the_rate_before_it():
    rate = HandoverRate()
    for i in range(50):
        rate.release(10.0 + i * 0.01)
    assert rate.per_second(12.5) == 0.0  # nothing in second 11 or 12
