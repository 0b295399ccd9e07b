"""The flow series' bounded vocabulary (gym_concurrency/flow_series.py): a limit names its first
flows, puts its busiest flows without a name in rank slots "top:N" and the rest in "other";
every label once reported stays; the labels of all limits stay within a process-wide bound.
An SDK keeps every attribute set for the life of the process, so these bounds are what keep a
process's flow series named (no `otel.metric.overflow`) and its memory flat however many flows
it sees (the long run: tests/test_benchmarks_flow_series.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_concurrency import (
    COMPONENT_ATTRIBUTE,
    MeteredSemaphore,
    observe_concurrency,
    set_flow_names_per_limit,
    set_flow_series_per_limit,
)
from gym_concurrency.flow_series import FlowSeries, is_rank_label
from gym_concurrency.limits import FlowStatistics
from gym_concurrency.names import (
    DEFAULT_FLOW_NAMES_PER_LIMIT,
    DEFAULT_FLOW_SERIES_PER_LIMIT,
    FLOW_ATTRIBUTE,
    FLOW_HELD_INSTRUMENT,
)
from tests.metrics_capture import MetricsCapture


@pytest.fixture(autouse=True)
def default_bounds() -> Iterator[None]:
    """Every test starts and ends with the default numbers of flows on their own and names."""
    set_flow_series_per_limit(DEFAULT_FLOW_SERIES_PER_LIMIT)
    set_flow_names_per_limit(DEFAULT_FLOW_NAMES_PER_LIMIT)
    yield
    set_flow_series_per_limit(DEFAULT_FLOW_SERIES_PER_LIMIT)
    set_flow_names_per_limit(DEFAULT_FLOW_NAMES_PER_LIMIT)


def held(metrics: MetricsCapture, component: str) -> dict[str, Any]:
    """`component`'s flow.held points now: flow label -> value."""
    return {
        dict(attributes)[FLOW_ATTRIBUTE]: value
        for attributes, value in metrics.values(FLOW_HELD_INSTRUMENT).items()
        if dict(attributes).get(COMPONENT_ATTRIBUTE) == component
    }


async def test_a_limit_names_its_first_flows_then_ranks_busy_others_in_slots(
    metrics: MetricsCapture,
) -> None:
    observe_concurrency(metrics.provider)
    set_flow_names_per_limit(3)
    set_flow_series_per_limit(2)
    limit = MeteredSemaphore(100, component="series_slots", limit_name="judge")
    await limit.acquire(3, "a")
    await limit.acquire(2, "b")
    assert held(metrics, "series_slots") == {"a": 3, "b": 2}
    await limit.acquire(1, "c")  # beyond the 2 busiest: the rest
    await limit.acquire(4, "d")  # among the busiest, no room left for a name: top:1
    await limit.acquire(5, "e")  # the busiest: the third name
    assert held(metrics, "series_slots") == {"a": 3, "b": 2, "e": 5, "top:1": 4, "other": 1}
    limit.release(4, "d")
    await limit.acquire(9, "f")  # the busiest flow without a name now
    assert held(metrics, "series_slots") == {"a": 3, "b": 2, "e": 5, "top:1": 9, "other": 1}
    for weight, flow in ((3, "a"), (2, "b"), (1, "c"), (5, "e"), (9, "f")):
        limit.release(weight, flow)
    for _ in range(2):  # every label stays, at 0
        assert held(metrics, "series_slots") == {"a": 0, "b": 0, "e": 0, "top:1": 0, "other": 0}


async def test_the_default_flow_takes_no_room_of_the_names(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    set_flow_names_per_limit(1)
    limit = MeteredSemaphore(10, component="series_default", limit_name="judge")
    await limit.acquire(1)
    await limit.acquire(2, "x")
    await limit.acquire(3, "y")
    assert held(metrics, "series_default") == {"default": 1, "y": 3, "top:1": 2}


async def test_a_flow_named_like_a_rank_slot_never_takes_its_name(
    metrics: MetricsCapture,
) -> None:
    observe_concurrency(metrics.provider)
    set_flow_names_per_limit(0)
    limit = MeteredSemaphore(10, component="series_spoof", limit_name="judge")
    await limit.acquire(1, "top:1")
    await limit.acquire(5, "b")
    # "top:1" is always the busiest flow without a name: b here, the client's "top:1" second.
    assert held(metrics, "series_spoof") == {"top:1": 5, "top:2": 1}


def stats(**flows: int) -> list[FlowStatistics]:
    return [FlowStatistics(flow, weight, 0, 0) for flow, weight in flows.items()]


def test_the_labels_of_all_limits_stay_within_the_process_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    series = FlowSeries(per_process=6)
    first = series.report("first", stats(a=3, b=2, c=1), top=5, names_per_limit=32)
    assert [(r.flow, r.held) for r in first] == [("a", 3), ("b", 2), ("c", 1)]
    with caplog.at_level(logging.WARNING, logger="gym_concurrency.flow_series"):
        second = series.report("second", stats(x=4, y=3, z=2, w=1), top=5, names_per_limit=32)
    assert [(r.flow, r.held) for r in second] == [("x", 4), ("y", 3), ("z", 2)]  # w: no label
    assert series.labels == 6
    assert "reached 6 labels" in caplog.text
    assert "left out" in caplog.text
    again = series.report("first", stats(a=1, d=7), top=5, names_per_limit=32)
    assert [(r.flow, r.held) for r in again] == [("a", 1), ("b", 0), ("c", 0)]  # d: no label


@pytest.mark.parametrize("label", ["top:1", "top:10", "top:123"])
def test_rank_labels_are_recognised(label: str) -> None:
    assert is_rank_label(label)


@pytest.mark.parametrize(
    "label", ["top:", "top:0", "top:01", "top:x", "Top:1", "top:\u0661", "tops:1"]
)
def test_other_labels_are_not_rank_labels(label: str) -> None:
    assert not is_rank_label(label)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (-1, ValueError, r"flow names per limit must be >= 0 \(0: none\), got -1"),
        ("5", TypeError, r"flow names per limit must be an int, got '5'"),
        (True, TypeError, r"must be an int, got True"),
    ],
)
def test_the_number_of_flow_names_is_checked(value: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        set_flow_names_per_limit(value)


# --- hypothesis: the bounds hold for any sequence of exports ------------------------------

_flow_names = st.sampled_from(["default", "other", "top:1", "top:2", *"abcdefghijkl"])
_export = st.dictionaries(
    st.sampled_from(["one", "two"]),
    st.dictionaries(_flow_names, st.tuples(*[st.integers(0, 9)] * 3), max_size=10),
)


@settings(max_examples=200, deadline=None)
@given(
    exports=st.lists(_export, min_size=1, max_size=12),
    top=st.integers(0, 4),
    names_per_limit=st.integers(0, 4),
    per_process=st.integers(1, 30),
)
def test_every_export_keeps_the_bounds(
    exports: list[dict[str, dict[str, tuple[int, int, int]]]],
    top: int,
    names_per_limit: int,
    per_process: int,
) -> None:
    series = FlowSeries(per_process=per_process)
    before: dict[str, list[str]] = {"one": [], "two": []}
    roomy = per_process >= 2 * (names_per_limit + top + 2)  # no limit ever runs out
    for export in exports:
        for limit, flows in export.items():
            given_ = [FlowStatistics(None if f == "default" else f, *c) for f, c in flows.items()]
            rows = series.report(limit, given_, top, names_per_limit)
            labels = [row.flow for row in rows]
            assert labels[: len(before[limit])] == before[limit]  # nothing ever vanishes
            assert len(set(labels)) == len(labels)
            assert len(labels) <= names_per_limit + top + 2  # names, default, slots, other
            slots = [label for label in labels if is_rank_label(label)]
            assert all(int(label[4:]) <= top for label in slots)
            for row in rows:  # a real flow's label shows that flow
                if row.flow in flows and row.flow != "other" and row.flow not in slots:
                    assert (row.held, row.queue_depth, row.queued_weight) == flows[row.flow]
            if roomy:  # nothing left out: the limit's totals
                for field in (0, 1, 2):
                    shown = sum((r.held, r.queue_depth, r.queued_weight)[field] for r in rows)
                    assert shown == sum(c[field] for c in flows.values())
            before[limit] = labels
        assert series.labels <= per_process
