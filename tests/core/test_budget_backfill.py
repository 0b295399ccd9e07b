"""Backfill past a waiter that its rate budget alone holds back (RateBudget.target / spare /
reserve_within; MeteredSemaphore(backfill_seconds=..., budget=...)), on a clock the test
sets: lighter calls are admitted past it only within what it can spare, and however they are
admitted, at what times and sizes, it still fits at its target (hypothesis). Also: `take()`,
the path of a call charged in full, leaves a budget as reserving and charging in full does."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits.rate_budget import RateBudget, Reservation
from tests.core.test_rate_budget import Clock


def tpm(clock: Clock, shape: str = "sliding") -> RateBudget:
    return RateBudget(tokens_per_minute=1000, requests_per_minute=100, shape=shape, clock=clock)  # type: ignore[arg-type]


def test_what_a_held_back_call_spares_is_its_room_at_its_target() -> None:
    clock = Clock(100.0)
    budget = tpm(clock)
    assert isinstance(budget.reserve(300), Reservation)  # second 100: leaves at 161
    clock.now = 102.0
    assert isinstance(budget.reserve(400), Reservation)  # second 102: leaves at 163
    target = budget.target(500, backfill_seconds=1.0)
    assert target == pytest.approx(162.0)  # 500 fits once the 300 leave, at 161; plus 1 s
    spare = budget.spare(500, target)
    assert spare == [100, 98]  # 1000 - 400 - 500 tokens; 100 - 1 - 1 requests
    assert budget.reserve_within(150, spare) is None  # fits now, not within what is spared
    assert spare == [100, 98]  # (nothing taken)
    assert isinstance(budget.reserve_within(80, spare), Reservation)
    assert spare == [20, 97]
    assert budget.reserve_within(30, spare) is None
    clock.now = 162.0
    assert isinstance(budget.reserve(500), Reservation)  # at its target, as promised


@settings(max_examples=200, deadline=None)
@given(
    shape=st.sampled_from(["sliding", "bucket"]),
    before=st.lists(st.tuples(st.floats(0, 70), st.integers(0, 600)), max_size=8),
    head=st.integers(1, 1000),
    backfill=st.floats(0.001, 90),
    passers=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 700)), max_size=30),
)
def test_a_held_back_call_fits_at_its_target_whatever_passes_it(
    shape: str,
    before: list[tuple[float, int]],
    head: int,
    backfill: float,
    passers: list[tuple[float, int]],
) -> None:
    clock = Clock(1000.0)
    budget = tpm(clock, shape)
    for step, tokens in before:  # whatever was charged before it came
        clock.now += step
        budget.reserve(tokens)
    if budget.wait_for(head) == 0.0:
        return  # not held back: nothing to pass
    target = budget.target(head, backfill)
    spare = budget.spare(head, target)
    for share, tokens in passers:  # passers at any moment before its target
        clock.now += share * (target - clock.now)
        budget.reserve_within(tokens, spare)
    clock.now = max(clock.now, target)
    assert isinstance(budget.reserve(head), Reservation), budget.statistics()


async def test_a_semaphore_admits_a_lighter_waiter_past_one_its_budget_holds_back() -> None:
    clock = Clock(100.0)
    limit = MeteredSemaphore(4, budget=tpm(clock), backfill_seconds=1.0)
    assert limit.try_acquire(tokens=300)
    clock.now = 102.0
    assert limit.try_acquire(tokens=400)
    head = limit.enqueue(tokens=500)  # fits at 161; its target: 162
    too_much = limit.enqueue(tokens=150)  # fits now, but not within what the head spares
    fits = limit.enqueue(tokens=80)
    last = limit.enqueue(tokens=30)
    await asyncio.sleep(0)
    assert fits.done()
    assert fits.result() == "admitted"
    assert not any(w.done() for w in (head, too_much, last))
    assert limit.admission_backfilled == 1
    assert limit.settle(fits) is not None
    clock.now = 162.0
    limit.resize(4)  # (admits waiters again, as the budget's timer would)
    assert head.done()
    assert head.result() == "admitted"
    for waiter in (too_much, last):
        limit.leave(waiter)


async def test_without_backfill_nobody_passes_a_waiter_its_budget_holds_back() -> None:
    clock = Clock(100.0)
    limit = MeteredSemaphore(4, budget=tpm(clock))
    assert limit.try_acquire(tokens=900)
    head = limit.enqueue(tokens=500)
    light = limit.enqueue(tokens=50)  # fits the 100 left now
    await asyncio.sleep(0)
    assert not head.done()
    assert not light.done()
    assert limit.admission_backfilled == 0
    for waiter in (head, light):
        limit.leave(waiter)


@settings(max_examples=100, deadline=None)
@given(
    calls=st.lists(st.tuples(st.floats(0, 40), st.integers(0, 1200), st.booleans()), max_size=25)
)
def test_taking_in_full_is_reserving_and_charging_in_full(
    calls: list[tuple[float, int, bool]],
) -> None:
    clock = Clock(1000.0)
    taking, reserving = tpm(clock), tpm(clock)
    for step, tokens, report in calls:
        clock.now += step
        if report:  # a provider's reading, the same on both
            for budget in (taking, reserving):
                budget.report("tokens", remaining=tokens, reset_at=clock.now + 30)
        wait = taking.take(min(tokens, 1000))
        reservation = reserving.reserve(min(tokens, 1000))
        if isinstance(reservation, Reservation):
            assert wait == 0.0
            reservation.charge_in_full()
        else:
            assert wait == reservation
        assert taking.statistics() == reserving.statistics()
