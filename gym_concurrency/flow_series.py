"""The flow series the observer exports per limit, from a bounded vocabulary of labels.

An SDK keeps every attribute set an instrument was ever given for the life of the process (and
past its cardinality limit, 2000 by default, reports the rest as one overflow series without
the limit's name), so the labels a limit's flow series carry must be bounded whatever the
number of flows a process sees. Per limit (attribute set) they are:

- "default": the default flow;
- its names: the first `names_per_limit` other flows it reports by name;
- "top:1".."top:N": once it has no room for another name, its busiest flows without a name
  (ranked among the N busiest of the export, busiest first);
- "other": the rest, summed.

A label once reported is reported at every export after (0 while its flow is idle), so a
series never vanishes while its limit lives. Flows holding the same label are one (a flow
named "default" is the default flow, one named "other" is in the rest); a flow whose label is
a rank slot's ("top:3") never gets a name. Across all limits at most FLOW_SERIES_PER_PROCESS
labels: past them, a flow that needs a new label takes a rank slot the limit has, else
"other", else it is left out (logged once).
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Hashable, Iterable

from . import names
from .busiest_flows import FlowRow, busiest_first, merged_flows
from .limits import FlowStatistics

__all__ = ["FlowSeries", "is_rank_label", "rank_label"]

_log = logging.getLogger(__name__)

_Counts = list[int]  # held, queue depth, queued weight


def rank_label(rank: int) -> str:
    """The label of the `rank`-th busiest flow without a name (from 1)."""
    return f"{names.RANK_FLOW_PREFIX}{rank}"


def is_rank_label(label: str) -> bool:
    """True if `label` is (or could be) a rank slot's: "top:" and a number from 1."""
    digits = label.removeprefix(names.RANK_FLOW_PREFIX)
    return digits != label and digits.isdecimal() and digits.isascii() and digits[:1] != "0"


class _Labels:
    """One limit's vocabulary: every label it reported, in order, and which are names."""

    __slots__ = ("names", "reported")

    def __init__(self) -> None:
        self.reported: dict[str, None] = {}
        self.names: set[str] = set()  # flows' own labels ("default" included)

    @property
    def named(self) -> int:
        """Names that count against the limit's room ("default" does not)."""
        return len(self.names) - (names.DEFAULT_FLOW in self.names)


class FlowSeries:
    """Every limit's labels in this process; `report()` places a limit's flows under them."""

    def __init__(self, per_process: int = names.FLOW_SERIES_PER_PROCESS) -> None:
        self._lock = threading.Lock()
        self._limits: dict[Hashable, _Labels] = {}
        self._per_process = per_process
        self._total = 0
        self._logged: set[str] = set()

    @property
    def labels(self) -> int:
        """Labels reported so far, over every limit."""
        return self._total

    def report(
        self, limit: Hashable, flows: Iterable[FlowStatistics], top: int, names_per_limit: int
    ) -> list[FlowRow]:
        """A row for every label `limit` (its attribute set) reports now, in the order they
        were first reported: its flows, merged by label, under their name, a rank slot (the
        `top` busiest without a name) or "other", and 0 for the labels whose flows are idle."""
        rows = merged_flows(flows)
        with self._lock:
            labels = self._limits.get(limit)
            if labels is None:
                labels = self._limits[limit] = _Labels()
            counts = self._place(labels, rows, top, names_per_limit)
            return [FlowRow(label, *counts.get(label, (0, 0, 0))) for label in labels.reported]

    def _place(
        self, labels: _Labels, rows: list[FlowRow], top: int, names_per_limit: int
    ) -> dict[str, _Counts]:
        """label -> the counts of the flows placed under it now."""
        counts: dict[str, _Counts] = {}
        busiest = heapq.nsmallest(top, rows, key=busiest_first)
        ranked = 0
        for row in busiest:
            if row.flow == names.OTHER_FLOWS:  # a flow named "other" is in the rest
                _add(counts, row.flow, row)
                continue
            if self._named(labels, row.flow, names_per_limit):
                _add(counts, row.flow, row)
                continue
            ranked += 1
            slot = rank_label(ranked)
            _add(counts, slot if self._reported(labels, slot) else names.OTHER_FLOWS, row)
        shown = {row.flow for row in busiest}
        for row in rows:
            if row.flow not in shown:
                named = row.flow in labels.names
                _add(counts, row.flow if named else names.OTHER_FLOWS, row)
        if names.OTHER_FLOWS in counts and not self._reported(labels, names.OTHER_FLOWS):
            self._log_full("left out")
            del counts[names.OTHER_FLOWS]
        return counts

    def _named(self, labels: _Labels, label: str, names_per_limit: int) -> bool:
        """True if `label` is a name of the limit, or has just become one."""
        if label in labels.names:
            return True
        if label == names.OTHER_FLOWS or is_rank_label(label):
            return False
        if label != names.DEFAULT_FLOW and labels.named >= names_per_limit:
            return False
        if not self._reported(labels, label):
            return False
        labels.names.add(label)
        return True

    def _reported(self, labels: _Labels, label: str) -> bool:
        """True if the limit reports `label`: it did already, or it may from now on."""
        if label in labels.reported:
            return True
        if self._total >= self._per_process:
            self._log_full('reported in a rank slot or as "other"')
            return False
        labels.reported[label] = None
        self._total += 1
        return True

    def _log_full(self, what: str) -> None:
        if what not in self._logged:
            self._logged.add(what)
            _log.warning(
                "gym_concurrency: the limits' flow series reached %d labels in this process; "
                "from now on a flow that needs a new label is %s",
                self._per_process,
                what,
            )


def _add(counts: dict[str, _Counts], label: str, row: FlowRow) -> None:
    found = counts.get(label)
    if found is None:
        counts[label] = [row.held, row.queue_depth, row.queued_weight]
    else:
        found[0] += row.held
        found[1] += row.queue_depth
        found[2] += row.queued_weight
