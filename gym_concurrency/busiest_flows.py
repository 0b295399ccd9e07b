"""A limit's busiest flows, as the observer's per-flow series and the status view show them:
the top N by held + queued weight, each under a bounded label, the rest summed as one.

Flow keys come from clients (a header, a body field), so both the number of flows shown and the
length of each label are bounded. Flows that end up with one label are one flow here: the
default flow (None) and a flow named "default", or two keys whose first 63 characters agree.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from . import names
from .limits import FlowStatistics

__all__ = [
    "BusiestFlows",
    "FlowRow",
    "busiest_first",
    "busiest_flows",
    "flow_label",
    "merged_flows",
    "summed",
]


@dataclass(frozen=True, slots=True)
class FlowRow:
    """One flow as reported (or the rest, summed): its label, the weight it holds, its
    waiters and the weight they ask for."""

    flow: str
    held: int
    queue_depth: int
    queued_weight: int


@dataclass(frozen=True, slots=True)
class BusiestFlows:
    """`top`: the busiest flows, busiest first; `rest`: every other flow summed (labelled
    "other"), None when there is none; `rest_flows`: how many flows `rest` sums."""

    top: list[FlowRow]
    rest: FlowRow | None
    rest_flows: int


def flow_label(flow: Hashable) -> str:
    """The flow as a string: "default" for the default flow (None), else `str(flow)`, cut to
    64 characters (the last one "…" where it was cut)."""
    if flow is None:
        return names.DEFAULT_FLOW
    text = str(flow)
    limit = names.FLOW_LABEL_MAX_CHARS
    return text if len(text) <= limit else text[: limit - 1] + "…"


def merged_flows(flows: Iterable[FlowStatistics]) -> list[FlowRow]:
    """`flows` merged by label (the flows of limits reported as one are passed together)."""
    merged: dict[str, tuple[int, int, int]] = {}
    for flow in flows:
        label = flow_label(flow.flow)
        held, depth, queued = merged.get(label, (0, 0, 0))
        merged[label] = (held + flow.held, depth + flow.queue_depth, queued + flow.queued_weight)
    return [FlowRow(label, *counts) for label, counts in merged.items()]


def busiest_first(row: FlowRow) -> tuple[int, str]:
    """The order of busyness: the most weight held and asked for first (ties: by label)."""
    return -(row.held + row.queued_weight), row.flow


def busiest_flows(flows: Iterable[FlowStatistics], top: int) -> BusiestFlows:
    """The `top` flows holding and asking for the most weight (ties: by label), merged by
    label (the flows of limits reported as one are passed together), and the rest summed."""
    rows = merged_flows(flows)
    chosen = heapq.nsmallest(top, rows, key=busiest_first)
    if len(chosen) == len(rows):
        return BusiestFlows(chosen, None, 0)
    named = {row.flow for row in chosen}
    others = [row for row in rows if row.flow not in named]
    return BusiestFlows(chosen, summed(names.OTHER_FLOWS, others), len(others))


def summed(label: str, rows: Iterable[FlowRow]) -> FlowRow:
    """`rows` added up, under `label`."""
    held = depth = queued = 0
    for row in rows:
        held += row.held
        depth += row.queue_depth
        queued += row.queued_weight
    return FlowRow(label, held, depth, queued)
