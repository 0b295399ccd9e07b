"""The slot one outbound attempt holds: its weight of the limit in its flow, and the
settlement of its budget's reservation, given back once (calls.py hands it to a transport)."""

from __future__ import annotations

from collections.abc import Hashable
from time import perf_counter

from ..limits import Limit
from ..limits.adaptive import AdaptiveLimiter
from ..settlement import Settlement

__all__ = ["Slot"]


class Slot:
    """The `weight` of the limit one attempt holds, in `flow`, and its budget's `settlement`
    (None: no budget). `release()` gives back that weight in that flow the first time (later
    calls do nothing), first telling the adaptive limiter how long the attempt held it and
    whether it ended in overload; a reservation not settled by then is charged in full."""

    __slots__ = (
        "_limit",
        "_limiter",
        "_started",
        "flow",
        "held",
        "overload",
        "settlement",
        "weight",
    )

    def __init__(
        self,
        limit: Limit,
        limiter: AdaptiveLimiter | None,
        weight: int = 1,
        flow: Hashable = None,
        settlement: Settlement | None = None,
    ) -> None:
        self._limit = limit
        self.settlement = settlement
        self._limiter = limiter
        self.weight = weight
        self.flow = flow
        self._started = perf_counter() if limiter is not None else 0.0
        self.held = True
        self.overload = False  # set from the attempt's outcome, read at release

    def release(self, *, measured: bool = True) -> None:
        """Give the slot back (once); `measured=False`: the attempt is no latency sample (it
        was cancelled or cut off by the deadline)."""
        if not self.held:
            return
        self.held = False
        try:
            if self.settlement is not None:
                self.settlement.abort()  # nothing if the body's usage settled it
            limiter = self._limiter
            if limiter is not None and measured:
                limiter.record(self._started, perf_counter(), self.overload)
        finally:
            self._limit.release(self.weight, self.flow)
