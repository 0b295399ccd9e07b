"""An operation limit with a rate budget: each block of its handle reserves `tokens` (the
handle's, else `OperationLimit.tokens`, else its weight) with its slot; `handle.settle(...)`
in the block charges what the work used (the rest refunded, the innermost block's), else the
exit charges it in full; a block the budget cannot hold within `timeout_seconds` raises
UpstreamCapacityError, a TimeoutError."""

from __future__ import annotations

import asyncio

import pytest
from gym_concurrency.middleware import ConcurrencySettings, OperationLimit
from gym_concurrency.middleware.dependencies import OperationHandle
from gym_concurrency.middleware.limits import ConcurrencyLimits

from gym_concurrency.usage import Usage


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


async def test_a_block_settled_with_its_usage_is_charged_that_and_refunded_the_rest() -> None:
    judge = handle("operation settle")
    async with judge:  # OperationLimit.tokens (100), the plain form too
        judge.settle(30)
    async with judge(tokens=500):
        async with judge(tokens=200):
            judge.settle(Usage(input_tokens=40, output_tokens=10))  # the innermost block's
        judge.settle(120)
        with pytest.raises(ValueError, match="closed"):
            judge.settle(1)
    assert remaining(judge) == 1000 - 30 - 50 - 120
    async with judge(tokens=300):  # not settled: charged in full
        pass
    assert remaining(judge) == 1000 - 30 - 50 - 120 - 300
    assert judge.limit.limit.active == 0


async def test_settle_outside_a_block_or_in_another_task_names_the_limit() -> None:
    judge = handle("operation settle outside")
    with pytest.raises(RuntimeError, match="'judge': settle\\(\\) is called inside"):
        judge.settle(10)
    async with judge(tokens=200):
        with pytest.raises(RuntimeError, match="settle"):
            await asyncio.create_task(_settle(judge))  # its own task opened no block
    assert remaining(judge) == 800


async def _settle(judge: OperationHandle) -> None:
    judge.settle(10)
