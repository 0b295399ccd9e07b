"""A shared limit's flows in this process: the weight its leases hold and its waiters ask for,
by flow, as a process limit reports its own (state is SharedLimit's own)."""

from __future__ import annotations

from ..flows import FlowStatistics
from ._held import HeldLeases, lease_flow, lease_weight
from ._waiters import Waiters

__all__ = ["ProcessFlowsMixin"]


class ProcessFlowsMixin:
    """SharedLimit's `flow_statistics()`."""

    _held: HeldLeases
    _waiters: Waiters

    def flow_statistics(self) -> list[FlowStatistics]:
        """Every flow that holds weight or waits in this process now (the default flow is
        None): its leases' weight (local fallback slots too), its waiters and their weight.
        Read at export, from the exporter's thread too: each is read from a copy taken at
        once. Across processes: `statistics().shared`."""
        held: dict[str | None, int] = {}
        for lease in list(self._held):
            flow = lease_flow(lease)
            held[flow] = held.get(flow, 0) + lease_weight(lease)
        waiting: dict[str | None, tuple[int, int]] = {}
        for waiter in self._waiters.all():
            depth, weight = waiting.get(waiter.flow, (0, 0))
            waiting[waiter.flow] = (depth + 1, weight + waiter.weight)
        flows = held.keys() | waiting.keys()
        return [FlowStatistics(f, held.get(f, 0), *waiting.get(f, (0, 0))) for f in flows]
