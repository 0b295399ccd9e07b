"""The observer's per-flow series: a limit's busiest flows by name, the rest summed as "other",
so that the number of series per limit stays bounded however many flows clients make; a
series once reported reads 0 while its flow is idle (tests/core/test_flow_series.py: the
vocabulary's bounds)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Iterator
from typing import Any

import pytest

from gym_concurrency import (
    COMPONENT_ATTRIBUTE,
    CONCURRENCY_ACTIVE_INSTRUMENT,
    LIMIT_NAME_ATTRIBUTE,
    MeteredSemaphore,
    observe_concurrency,
    set_flow_series_per_limit,
)
from gym_concurrency.limits import FlowStatistics
from gym_concurrency.names import (
    DEFAULT_FLOW_SERIES_PER_LIMIT,
    FLOW_ATTRIBUTE,
    FLOW_HELD_INSTRUMENT,
    FLOW_QUEUE_DEPTH_INSTRUMENT,
    FLOW_QUEUED_WEIGHT_INSTRUMENT,
    QUEUED_WEIGHT_INSTRUMENT,
)
from tests.metrics_capture import MetricsCapture

FLOW_INSTRUMENTS = (
    FLOW_HELD_INSTRUMENT,
    FLOW_QUEUE_DEPTH_INSTRUMENT,
    FLOW_QUEUED_WEIGHT_INSTRUMENT,
)


@pytest.fixture(autouse=True)
def default_flow_series() -> Iterator[None]:
    """Every test starts and ends with the default number of flow series per limit."""
    set_flow_series_per_limit(DEFAULT_FLOW_SERIES_PER_LIMIT)
    yield
    set_flow_series_per_limit(DEFAULT_FLOW_SERIES_PER_LIMIT)


@pytest.fixture
async def waiters() -> AsyncIterator[list[asyncio.Task[Any]]]:
    """Tasks left waiting on a limit, cancelled when the test ends."""
    tasks: list[asyncio.Task[Any]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def by_flow(metrics: MetricsCapture, name: str, component: str) -> dict[str, Any]:
    """The flow instrument's points of `component`'s limits: flow -> value."""
    found = {}
    for attributes, value in metrics.values(name).items():
        pairs = dict(attributes)
        if pairs.get(COMPONENT_ATTRIBUTE) == component:
            assert pairs[LIMIT_NAME_ATTRIBUTE] == "judge"
            found[pairs[FLOW_ATTRIBUTE]] = value
    return found


def limit_key(component: str) -> frozenset[tuple[str, str]]:
    """The attribute set of `component`'s limit "judge" on the limit instruments."""
    return frozenset({COMPONENT_ATTRIBUTE: component, LIMIT_NAME_ATTRIBUTE: "judge"}.items())


async def wait(
    tasks: list[asyncio.Task[Any]], limit: MeteredSemaphore, weight: int, flow: Hashable
) -> None:
    tasks.append(asyncio.create_task(limit.acquire(weight, flow)))
    await asyncio.sleep(0)


async def test_fifty_flows_report_the_five_busiest_and_the_rest_as_other(
    metrics: MetricsCapture, waiters: list[asyncio.Task[Any]]
) -> None:
    observe_concurrency(metrics.provider)
    limit = MeteredSemaphore(2000, component="flows_top", limit_name="judge")
    for i in range(50):  # tenant-i holds i + 1
        await limit.acquire(i + 1, f"tenant-{i}")
    await limit.acquire(2000 - sum(range(1, 51)))  # the default flow fills the limit
    await wait(waiters, limit, 7, "tenant-3")  # waits: 4 held + 7 queued, still not top
    await wait(waiters, limit, 2, "tenant-0")
    await wait(waiters, limit, 60, "tenant-1")  # 2 held + 60 queued: among the busiest

    held = by_flow(metrics, FLOW_HELD_INSTRUMENT, "flows_top")
    assert set(held) == {"default", "tenant-1", "tenant-49", "tenant-48", "tenant-47", "other"}
    assert held["default"] == 725
    assert held["tenant-1"] == 2
    assert held["tenant-49"] == 50
    assert held["other"] == sum(range(1, 51)) - 2 - 50 - 49 - 48
    assert sum(held.values()) == limit.active == 2000
    queued = by_flow(metrics, FLOW_QUEUED_WEIGHT_INSTRUMENT, "flows_top")
    assert queued == {
        "default": 0,
        "tenant-1": 60,
        "tenant-49": 0,
        "tenant-48": 0,
        "tenant-47": 0,
        "other": 9,
    }
    depth = by_flow(metrics, FLOW_QUEUE_DEPTH_INSTRUMENT, "flows_top")
    assert depth["other"] == 2
    assert depth["tenant-1"] == 1
    queued_weight = metrics.values(QUEUED_WEIGHT_INSTRUMENT)
    assert queued_weight[limit_key("flows_top")] == 69  # the limit's own total, no flow

    set_flow_series_per_limit(2)  # fewer flows on their own: the names given stay
    for name in FLOW_INSTRUMENTS:
        shown = by_flow(metrics, name, "flows_top")
        assert set(shown) == {"default", "tenant-1", "tenant-49", "tenant-48", "tenant-47", "other"}
    assert sum(by_flow(metrics, FLOW_HELD_INSTRUMENT, "flows_top").values()) == 2000


async def test_no_flow_series_for_an_unused_limit_and_one_for_the_default_flow(
    metrics: MetricsCapture, waiters: list[asyncio.Task[Any]]
) -> None:
    observe_concurrency(metrics.provider)
    limit = MeteredSemaphore(2, component="flows_default", limit_name="judge")
    for name in FLOW_INSTRUMENTS:
        assert by_flow(metrics, name, "flows_default") == {}, name
    async with limit:
        await limit.acquire()
        await wait(waiters, limit, 1, None)
        assert by_flow(metrics, FLOW_HELD_INSTRUMENT, "flows_default") == {"default": 2}
        assert by_flow(metrics, FLOW_QUEUE_DEPTH_INSTRUMENT, "flows_default") == {"default": 1}
        assert by_flow(metrics, FLOW_QUEUED_WEIGHT_INSTRUMENT, "flows_default") == {"default": 1}
        waiter = waiters.pop()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        limit.release()
    for name in FLOW_INSTRUMENTS:  # idle again: the series reads 0
        assert by_flow(metrics, name, "flows_default") == {"default": 0}, name


async def test_a_flow_series_reads_0_when_its_flow_goes_idle_and_never_vanishes(
    metrics: MetricsCapture, waiters: list[asyncio.Task[Any]]
) -> None:
    observe_concurrency(metrics.provider)
    limit = MeteredSemaphore(3, component="flows_idle", limit_name="judge")
    await limit.acquire(2, "batch")
    await limit.acquire(1, "eval")
    await wait(waiters, limit, 1, "eval")
    assert by_flow(metrics, FLOW_HELD_INSTRUMENT, "flows_idle") == {"batch": 2, "eval": 1}
    limit.release(2, "batch")  # eval's waiter gets in
    await asyncio.sleep(0)
    assert by_flow(metrics, FLOW_HELD_INSTRUMENT, "flows_idle") == {"batch": 0, "eval": 2}
    assert by_flow(metrics, FLOW_QUEUE_DEPTH_INSTRUMENT, "flows_idle") == {"batch": 0, "eval": 0}
    limit.release(2, "eval")
    for _ in range(3):  # NeMo Gym issue 36: series seen in two exports, then gone
        for name in FLOW_INSTRUMENTS:
            assert by_flow(metrics, name, "flows_idle") == {"batch": 0, "eval": 0}, name
    assert metrics.values(CONCURRENCY_ACTIVE_INSTRUMENT)[limit_key("flows_idle")] == 0


async def test_the_limit_instruments_never_carry_the_flow(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    limit = MeteredSemaphore(3, component="flows_apart", limit_name="judge")
    async with limit.hold(2, "tenant"):
        for name, points in metrics.collect().items():
            if name not in FLOW_INSTRUMENTS:
                assert all(FLOW_ATTRIBUTE not in p.attributes for p in points), name


async def test_limits_reported_as_one_merge_their_flows(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    first = MeteredSemaphore(4, component="flows_merged", limit_name="judge")
    second = MeteredSemaphore(4, component="flows_merged", limit_name="judge")
    await first.acquire(3, "tenant")
    await second.acquire(2, "tenant")
    await second.acquire(1, ("tenant", 2))  # any hashable: reported as its str()
    await second.acquire(1, "default")  # a flow named "default" is the default flow's series
    await first.acquire(1)
    held = by_flow(metrics, FLOW_HELD_INSTRUMENT, "flows_merged")
    assert held == {"tenant": 5, "('tenant', 2)": 1, "default": 2}


async def test_a_flow_named_other_shares_the_rests_series(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    set_flow_series_per_limit(1)
    limit = MeteredSemaphore(9, component="flows_other", limit_name="judge")
    await limit.acquire(5, "other")  # the busiest: named, and named like the rest
    await limit.acquire(1, "a")
    await limit.acquire(1, "b")
    assert by_flow(metrics, FLOW_HELD_INSTRUMENT, "flows_other") == {"other": 7}


async def test_a_long_flow_key_is_cut_to_64_characters(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    limit = MeteredSemaphore(2, component="flows_long", limit_name="judge")
    async with limit.hold(1, "x" * 10_000):
        (label,) = by_flow(metrics, FLOW_HELD_INSTRUMENT, "flows_long")
    assert label == "x" * 63 + "…"


async def test_zero_series_per_limit_reports_no_flow_at_all(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    limit = MeteredSemaphore(2, component="flows_off", limit_name="judge")
    set_flow_series_per_limit(0)
    async with limit.hold(1, "tenant"):
        collected = metrics.collect()
        for name in FLOW_INSTRUMENTS:
            assert by_flow(metrics, name, "flows_off") == {}, name
        assert CONCURRENCY_ACTIVE_INSTRUMENT in collected


async def test_one_export_reads_each_limits_flows_once(metrics: MetricsCapture) -> None:
    class Counted(MeteredSemaphore):
        reads = 0

        def flow_statistics(self) -> list[FlowStatistics]:
            Counted.reads += 1
            return super().flow_statistics()

    observe_concurrency(metrics.provider)
    limit = Counted(2, component="flows_once", limit_name="judge")
    async with limit.hold(1, "tenant"):
        metrics.collect()
        first = Counted.reads
        metrics.collect()
    assert first == 1  # three flow instruments, one reading
    assert Counted.reads == 2


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (-1, ValueError, r"flow series per limit must be >= 0 \(0: no flow series\), got -1"),
        ("5", TypeError, r"flow series per limit must be an int, got '5'"),
        (2.0, TypeError, r"must be an int, got 2\.0"),
        (True, TypeError, r"must be an int, got True"),
    ],
)
def test_the_number_of_flow_series_is_checked(value: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        set_flow_series_per_limit(value)
