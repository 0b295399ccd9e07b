"""Fair queuing by flow: the waiters of a limit grouped by flow, FIFO within each, and the
choice of the next one: the head of the flow holding the least weight now (ties: the head that
has waited longest). A flow is kept here only while it has a waiter.

The choice is a min-heap of (held weight, head's arrival, flow) with lazy deletion: an entry is
pushed whenever a waiting flow's held weight or head changes and is checked against the flow's
state when it reaches the top; stale entries are dropped then, or all at once when they
outnumber the live ones. Choosing costs O(log flows), amortized.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from .limit import Admission

__all__ = ["Ask", "FlowQueues", "FlowStatistics", "Waiting", "flow_statistics"]

Waiter = asyncio.Future[Admission]
Ask = tuple[int, Hashable]
"""What a waiter asks for: (weight, flow)."""


class Waiting(NamedTuple):
    """The waiter chosen next: the limit holds freed capacity for it until its weight fits.
    (A tuple: made at every fair admission, where a frozen dataclass costs twice as much.)"""

    waiter: Waiter
    weight: int
    flow: Hashable


@dataclass(frozen=True, slots=True)
class FlowStatistics:
    """One flow of a limit now: the weight its holders hold, its waiters and their weight."""

    flow: Hashable
    held: int
    queue_depth: int
    queued_weight: int


def flow_statistics(
    active: int, held: dict[Hashable, int], waiting: dict[Hashable, tuple[int, int]]
) -> list[FlowStatistics]:
    """Every flow of a limit that holds weight or waits: `active` (all the weight held),
    `held` (by each named flow: the default flow None holds the rest) and `waiting` ((waiters,
    queued weight) by flow). The loop raises a named flow's count before `active` and lowers
    `active` first: read from an exporter's thread, the smaller of two reads of `active` (one
    before the counts are copied, one after) can only under-count the default flow, never show
    weight it does not hold."""
    default = max(0, active - sum(held.values()))
    flows = dict(held)
    if default:
        flows[None] = default
    every = set(flows) | set(waiting)
    return [FlowStatistics(f, flows.get(f, 0), *waiting.get(f, (0, 0))) for f in every]


class _Flow:
    """One flow's waiters in arrival order: waiter -> (weight, arrival number)."""

    __slots__ = ("queue", "weight")

    def __init__(self) -> None:
        self.queue: OrderedDict[Waiter, tuple[int, int]] = OrderedDict()
        self.weight = 0  # the queued weight

    def head(self) -> tuple[Waiter, int, int]:
        waiter, (weight, arrival) = next(iter(self.queue.items()))
        return waiter, weight, arrival


class FlowQueues:
    """The waiters of one limit by flow, and the fair choice among them.

    `held(flow)` is the limit's answer to "how much weight does this flow hold now"; the limit
    calls `touched(flow)` whenever that changes for a flow that may be waiting.
    """

    __slots__ = ("_arrivals", "_flows", "_heap", "_held", "queued_weight")

    def __init__(self, held: Callable[[Hashable], int]) -> None:
        self._held = held
        self._flows: dict[Hashable, _Flow] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._arrivals = 0
        self.queued_weight = 0

    def __bool__(self) -> bool:
        return bool(self._flows)

    def __len__(self) -> int:
        """Flows with a waiter now."""
        return len(self._flows)

    def push(self, waiter: Waiter, weight: int, flow: Hashable) -> None:
        """Queue `waiter` at the back of its flow."""
        state = self._flows.get(flow)
        if state is None:
            state = self._flows[flow] = _Flow()
        self._arrivals += 1
        state.queue[waiter] = (weight, self._arrivals)
        state.weight += weight
        self.queued_weight += weight
        if len(state.queue) == 1:
            self._offer(flow, state)

    def remove(self, waiter: Waiter, flow: Hashable) -> None:
        """Take `waiter` out of its flow's queue (it was admitted, timed out or left)."""
        state = self._flows[flow]
        was_head = next(iter(state.queue)) is waiter
        weight, _ = state.queue.pop(waiter)
        state.weight -= weight
        self.queued_weight -= weight
        if not state.queue:
            del self._flows[flow]
        elif was_head:
            self._offer(flow, state)

    def queued_weight_of(self, flow: Hashable) -> int:
        """The weight `flow`'s waiters ask for."""
        state = self._flows.get(flow)
        return 0 if state is None else state.weight

    def ask_of(self, waiter: Waiter, flow: Hashable) -> int:
        """The weight `waiter` (queued in `flow`) asks for."""
        return self._flows[flow].queue[waiter][0]

    def touched(self, flow: Hashable) -> None:
        """`flow`'s held weight changed: offer it again at its new place, if it waits."""
        state = self._flows.get(flow)
        if state is not None:
            self._offer(flow, state)

    def choose(self) -> Waiting | None:
        """The head of the flow holding the least weight now (ties: the longest waiting);
        None if nobody waits. The waiter stays queued until `remove()`."""
        heap = self._heap
        flows = self._flows
        while heap:
            held, arrival, flow = heap[0]
            state = flows.get(flow)
            if state is not None:
                waiter, weight, head_arrival = state.head()
                if head_arrival == arrival and self._held(flow) == held:
                    return Waiting(waiter, weight, flow)
            heapq.heappop(heap)  # stale: the flow's head or held weight moved on
        return None

    def flows(self) -> Iterator[tuple[Hashable, int, int]]:
        """(flow, waiters, queued weight) for each flow with a waiter. Safe to call from
        another thread (an exporter's): it walks a copy taken at once."""
        for flow, state in list(self._flows.items()):
            yield flow, len(state.queue), state.weight

    def clear(self) -> None:
        """Forget every flow (the limit's queue is empty)."""
        self._flows.clear()
        self._heap.clear()
        self.queued_weight = 0

    def _offer(self, flow: Hashable, state: _Flow) -> None:
        _, _, arrival = state.head()
        heap = self._heap
        if len(heap) > 2 * len(self._flows) + 32:  # mostly stale: rebuild from the live flows
            heap[:] = [(self._held(f), s.head()[2], f) for f, s in self._flows.items()]
            heapq.heapify(heap)
            return
        heapq.heappush(heap, (self._held(flow), arrival, flow))
