"""What the observer, the status view, the middleware and the outbound clients read of a limit's
upstream (its rate budget, its engine signal), written once for every kind of limit: a
process's MeteredSemaphore holds a RateBudget, a SharedLimit a budget kept in Redis
(`SharedLimit.budget`, read as last seen by `budget_statistics()`: no Redis call).

`UpstreamBudget` is what the edges do with either: close a reservation, tell it what a
provider said remains, read it.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from .engines.signal import EngineStatistics
from .limits import Limit, MeteredSemaphore, SharedLimit
from .limits.rate_budget import BudgetName, RateBudgetStatistics
from .usage import Usage

__all__ = ["UpstreamBudget", "budget_of", "budget_wait", "has_upstream", "upstream_statistics"]


class UpstreamBudget(Protocol):
    """A limit's rate budget as the edges use it (RateBudget, a shared limit's budget)."""

    def settle(self, reservation: Any, usage: Usage | int) -> None: ...
    def charge_in_full(self, reservation: Any) -> None: ...
    def cancel(self, reservation: Any) -> None: ...
    def report(
        self,
        budget: BudgetName,
        *,
        remaining: int,
        reset_at: float,
        observed_at: float | None = None,
    ) -> None: ...
    def statistics(self) -> RateBudgetStatistics: ...


def budget_of(limit: Limit) -> UpstreamBudget | None:
    """The rate budget `limit` reserves from with its slots, or None."""
    if isinstance(limit, SharedLimit):
        return limit.shared_budget  # its state is in Redis; `limit.budget` only sizes it
    if isinstance(limit, MeteredSemaphore):
        return limit.budget
    return None


def has_upstream(limit: Limit) -> bool:
    """Whether admission to `limit` also asks a rate budget or an engine signal (then a call
    asks with a token estimate, and its reservation is settled)."""
    if isinstance(limit, MeteredSemaphore):
        return limit.upstream is not None
    return budget_of(limit) is not None


def budget_wait(limit: Limit, tokens: int) -> float | None:
    """Seconds until `limit`'s budget would hold an estimate of `tokens` (capped as admission
    caps it), charging nothing: a Retry-After. A budget shared across processes answers as
    last seen (what Redis last said; no Redis call). None if not known (no budget)."""
    if isinstance(limit, SharedLimit):
        shared = limit.shared_budget
        return None if shared is None else shared.wait(tokens)
    if not isinstance(limit, MeteredSemaphore) or limit.upstream is None:
        return None
    if limit.upstream.budget is None:
        return None
    seconds = limit.upstream.wait(tokens)
    return seconds if math.isfinite(seconds) else None


def upstream_statistics(
    limit: Limit,
) -> tuple[RateBudgetStatistics | None, EngineStatistics | None]:
    """`limit`'s budget and engine signal now, in plain numbers (None for a part it has not):
    safe from an exporter's thread, no Redis call."""
    if isinstance(limit, SharedLimit):
        return limit.budget_statistics(), limit.engine_statistics()
    if isinstance(limit, MeteredSemaphore) and limit.upstream is not None:
        return limit.upstream.statistics()
    return None, None
