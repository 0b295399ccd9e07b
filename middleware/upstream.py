"""A configured limit's upstream: the RateBudget and EngineSignal its settings describe, what a
reload may change of them (a budget's size, not whether it exists nor how it is metered; an
engine signal not at all), and the Retry-After of a refusal for the budget.
"""

from __future__ import annotations

import math
from typing import Any

from gym_concurrency.limits import Limit, MeteredSemaphore
from gym_concurrency.upstream_view import budget_wait

from .settings import ClientLimit, OperationLimit, RouteLimit
from .settings.upstream import BUDGET_FIELDS, UpstreamFields

_Config = RouteLimit | OperationLimit | ClientLimit

__all__ = ["budget_retry_after", "check_upstream_reload", "resize_budgets", "upstream_keywords"]


def upstream_keywords(config: UpstreamFields) -> dict[str, Any]:
    """The `budget=` / `engine=` keywords of the limit `config` describes (none without)."""
    keywords: dict[str, Any] = {}
    budget = config.budget()
    if budget is not None:
        keywords["budget"] = budget
    if config.engine is not None:
        keywords["engine"] = config.engine.signal()
    return keywords


def check_upstream_reload(where: str, old: _Config, new: _Config) -> None:
    """ValueError naming the field if a reload would switch a budget on or off, change how
    budgets are metered, resize a global limit's budget (kept in Redis with the sizes every
    process made it with), or change the engine signal of a running limit."""
    before, after = old.budget_sizes(), new.budget_sizes()
    if old.scope == "global" and before != after:
        raise ValueError(
            f"{where}: limit {old.limit_name!r} is global: its budgets are shared in Redis at "
            f"the sizes every process made it with ({before}); restart to change them"
        )
    for name, field in BUDGET_FIELDS.items():
        if (name in before) != (name in after):
            raise ValueError(
                f"{where}.{field}: a reload can resize a running limit's budget, not switch "
                f"one on or off ({before.get(name)} -> {after.get(name)}; restart the server, "
                "or give the limit a new limit_name)"
            )
    if before and old.budget_shape != new.budget_shape:
        raise ValueError(
            f"{where}.budget_shape: a running budget keeps how it meters its minute "
            f"({old.budget_shape!r}); restart the server to change it"
        )
    if old.engine != new.engine:
        raise ValueError(
            f"{where}.engine: a running limit follows the engine signal it was made with; a "
            "reload cannot add, remove or change it (restart the server)"
        )


def resize_budgets(limit: Limit, old: UpstreamFields, new: UpstreamFields) -> None:
    """Give the running budget of a process limit the sizes `new` says (a reload)."""
    budget = limit.budget if isinstance(limit, MeteredSemaphore) else None
    if budget is None:
        return
    before = old.budget_sizes()
    for name, size in new.budget_sizes().items():
        if before.get(name) != size:
            budget.resize(name, size)
    limit.resize(limit.limit)  # admission runs again: waiters a grown budget holds now go


def budget_retry_after(limit: Limit, tokens: int) -> int | None:
    """Whole seconds (at least 1) until `limit`'s budget would hold an estimate of `tokens`
    again (capped as admission caps it), rounded up: the Retry-After of a refusal for the
    budget. None without a budget."""
    seconds = budget_wait(limit, tokens)
    return None if seconds is None else max(1, math.ceil(seconds))
