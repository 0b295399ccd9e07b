"""An operation limit with a rate budget: each block of its handle reserves `tokens` (the
handle's, else `OperationLimit.tokens`, else its weight) with its slot, charged in full (a
block reports no usage), and a block the budget cannot hold within `timeout_seconds` raises
UpstreamCapacityError, a TimeoutError."""

from __future__ import annotations

import pytest
from gym_concurrency.middleware import ConcurrencySettings, OperationLimit
from gym_concurrency.middleware.dependencies import OperationHandle
from gym_concurrency.middleware.limits import ConcurrencyLimits


def handle(component: str) -> OperationHandle:
    judge = OperationLimit(
        limit_name="judge",
        operation="judge",
        executor="inline",
        max_concurrent=2,
        timeout_seconds=0.1,
        tokens_per_minute=1000,
        tokens=100,
    )
    limits = ConcurrencyLimits(ConcurrencySettings(component=component, operations=[judge]))
    return OperationHandle(limits.operation("judge"))


def remaining(judge: OperationHandle) -> int:
    budget = judge.limit.limit.budget
    assert budget is not None
    tokens = budget.statistics().tokens
    assert tokens is not None
    return tokens.remaining


async def test_each_block_reserves_its_tokens_and_is_charged_in_full() -> None:
    judge = handle("operation budget")
    async with judge:  # OperationLimit.tokens
        pass
    async with judge(tokens=300):
        pass
    async with judge(weight=2, tokens=500):
        pass
    assert remaining(judge) == 100
    with pytest.raises(TimeoutError) as raised:
        async with judge(tokens=200):  # 100 left: the budget holds it only in a minute
            pass
    assert getattr(raised.value, "reason", None) == "budget"
    assert judge.limit.limit.active == 0
