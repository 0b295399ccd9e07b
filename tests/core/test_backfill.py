"""Bounded backfill (`MeteredSemaphore(backfill_seconds=...)`): lighter waiters that fit pass
a blocked waiter chosen next, for at most `backfill_seconds`, then capacity is held for it
(the hypothesis machine in test_flows_stateful.py runs it on random schedules too)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Hashable

import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits.backfill import BACKFILL_SCAN


async def settle(rounds: int = 6) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def take(sem: MeteredSemaphore, weight: int, flow: Hashable = None) -> asyncio.Task[bool]:
    return asyncio.ensure_future(sem.acquire(weight, flow))


def held(sem: MeteredSemaphore) -> dict[Hashable, int]:
    return {s.flow: s.held for s in sem.flow_statistics() if s.held}


async def test_a_lighter_waiter_passes_a_blocked_head_within_the_bound() -> None:
    sem = MeteredSemaphore(4, backfill_seconds=60)
    await sem.acquire(weight=3)
    heavy = take(sem, 4)
    await settle()
    light = take(sem, 1)
    await settle()
    assert (light.done(), heavy.done()) == (True, False)  # passed the blocked head
    assert (sem.active, sem.queue_depth, sem.admission_backfilled) == (4, 1, 1)
    sem.release(weight=3)
    await settle()
    assert not heavy.done()  # still 1 held by the backfilled call
    sem.release(weight=1)
    await settle()
    assert heavy.done()  # the head is admitted as soon as its weight fits
    assert (sem.active, sem.queue_depth) == (4, 0)


async def test_without_backfill_the_head_is_never_passed() -> None:
    sem = MeteredSemaphore(4)  # backfill_seconds=0, the default
    assert sem.backfill_seconds == 0.0
    await sem.acquire(weight=3)
    heavy = take(sem, 4)
    await settle()
    light = take(sem, 1)
    await settle()
    assert (light.done(), heavy.done()) == (False, False)
    sem.release(weight=3)
    await settle()
    assert (heavy.done(), light.done()) == (True, False)
    assert (sem.active, sem.admission_backfilled) == (4, 0)
    sem.release(weight=4)
    await light
    sem.release()


async def test_backfill_stops_once_the_head_has_waited_the_bound() -> None:
    sem = MeteredSemaphore(4, backfill_seconds=0.05)
    await sem.acquire(weight=2)
    heavy = take(sem, 4)
    await settle()
    early = take(sem, 1)
    await settle()
    assert early.done()  # within the bound
    await asyncio.sleep(0.08)
    late = take(sem, 1)
    await settle()
    assert not late.done()  # past it: the last free unit is held for the head
    assert (sem.active, sem.available, sem.admission_backfilled) == (3, 1, 1)
    sem.release(weight=2)
    sem.release(weight=1)
    await settle()
    assert (heavy.done(), late.done()) == (True, False)  # the head first
    sem.release(weight=4)
    await late
    assert (sem.active, sem.queue_depth) == (1, 0)


async def test_a_new_head_gets_a_new_bound() -> None:
    sem = MeteredSemaphore(4, backfill_seconds=0.05)
    await sem.acquire(weight=3)
    first = take(sem, 4, flow="a")
    await settle()
    await asyncio.sleep(0.08)
    first.cancel()  # the blocked head leaves after its bound; the next one is chosen anew
    second = take(sem, 3, flow="b")
    await settle()
    light = take(sem, 1, flow="c")
    await settle()
    assert (light.done(), second.done()) == (True, False)
    assert (sem.active, sem.admission_cancelled, sem.admission_backfilled) == (4, 1, 1)


async def test_backfill_looks_at_a_bounded_number_of_waiters() -> None:
    sem = MeteredSemaphore(10, backfill_seconds=60)
    await sem.acquire(weight=9)
    heavy = take(sem, 10)
    await settle()
    tasks = [take(sem, 2) for _ in range(BACKFILL_SCAN)]  # none fits in the free unit
    beyond = take(sem, 1)
    await settle()
    assert not beyond.done()  # the 33rd waiter behind the head is not looked at
    assert sem.admission_backfilled == 0
    tasks[0].cancel()
    await settle()
    assert not beyond.done()  # no capacity freed: nothing is looked at again yet
    for task in [heavy, *tasks, beyond]:
        task.cancel()
    await settle()
    assert (sem.active, sem.queue_depth) == (9, 0)


async def test_a_backfilled_waiter_keeps_its_flows_place_in_the_fair_order() -> None:
    sem = MeteredSemaphore(5, backfill_seconds=60)
    await sem.acquire(weight=4, flow="x")
    heavy = take(sem, 4, flow="b")
    await settle()
    a1 = take(sem, 2, flow="a")  # does not fit: stays its flow's head
    a2 = take(sem, 1, flow="a")  # fits: admitted from behind its flow's head
    await settle()
    assert (a2.done(), a1.done()) == (True, False)
    assert held(sem) == {"x": 4, "a": 1}
    sem.release(weight=4, flow="x")
    await settle()
    assert heavy.done()
    sem.release(weight=4, flow="b")
    await settle()
    assert a1.done()  # flow a, holding 1, is still offered when capacity frees
    assert held(sem) == {"a": 3}


async def test_a_backfilled_waiter_cancelled_before_it_resumes_gives_its_weight_back() -> None:
    sem = MeteredSemaphore(4, backfill_seconds=60)
    await sem.acquire(weight=3, flow="x")
    heavy = take(sem, 4, flow="h")
    await settle()
    mid = take(sem, 2, flow="m")
    await settle()
    assert not mid.done()
    sem.release(weight=1, flow="x")  # 2 free: not enough for the head, handed to `mid`
    assert (sem.active, sem.admission_backfilled) == (4, 1)
    mid.cancel()  # before its task resumed to take it
    await settle()
    assert (sem.active, held(sem), sem.admission_cancelled) == (2, {"x": 2}, 1)
    sem.release(weight=2, flow="x")
    await heavy
    assert (sem.active, held(sem), sem.queue_depth) == (4, {"h": 4}, 0)


async def test_a_queued_waiter_cancelled_or_timed_out_leaves_counts_right() -> None:
    sem = MeteredSemaphore(4, timeout=0.05, backfill_seconds=60)
    await sem.acquire(weight=3, flow="x")
    heavy = take(sem, 4, flow="h")
    await settle()
    mid = take(sem, 2, flow="m")  # does not fit in the free unit either
    await settle()
    mid.cancel()
    await settle()
    assert (sem.queue_depth, sem.queued_weight, sem.admission_cancelled) == (1, 4, 1)
    with pytest.raises(TimeoutError):
        await heavy  # the blocked head times out
    light = take(sem, 1, flow="l")
    await settle()
    assert light.done()
    assert (sem.active, held(sem), sem.queue_depth, sem.admission_timeouts) == (
        4,
        {"x": 3, "l": 1},
        0,
        1,
    )


async def test_when_the_blocked_head_leaves_the_next_one_is_chosen() -> None:
    sem = MeteredSemaphore(4, backfill_seconds=0.05)
    await sem.acquire(weight=2)
    heavy = take(sem, 4)
    await settle()
    await asyncio.sleep(0.08)
    light = take(sem, 2)  # past the bound: waits behind the head
    await settle()
    assert not light.done()
    heavy.cancel()
    await settle()
    assert light.done()  # what was held for the head moves on at once
    assert (sem.active, sem.queue_depth, sem.admission_cancelled) == (4, 0, 1)


@pytest.mark.parametrize("value", [-1, -0.5, math.inf, math.nan])
def test_a_bad_backfill_is_refused_naming_it(value: float) -> None:
    with pytest.raises(ValueError, match="backfill_seconds must be >= 0 and finite"):
        MeteredSemaphore(4, backfill_seconds=value)


@pytest.mark.parametrize("value", ["1", True, None])
def test_a_backfill_that_is_not_a_number_is_refused(value: object) -> None:
    with pytest.raises(TypeError, match="backfill_seconds must be a number of seconds"):
        MeteredSemaphore(4, backfill_seconds=value)  # type: ignore[arg-type]
