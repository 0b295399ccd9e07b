"""Backfill on a global limit's rate budgets (SharedLimit(backfill_seconds=...)), on a real
redis-server: while only the budgets hold the oldest waiter back, a lighter waiter that they
take now is admitted past it, as long as it leaves the oldest one room at its target (the
moment the budgets alone would have taken it, plus the backfill); without backfill nobody
passes; a limit without a budget cannot backfill."""

from __future__ import annotations

import asyncio

import pytest

from gym_concurrency import SharedLimit
from gym_concurrency.limits.rate_budget import RateBudget
from tests.shared.helpers import Limits, kept, settle, until_aged
from tests.shared.redis_server import RedisServer


@pytest.fixture(autouse=True)
async def aged(redis_server: RedisServer) -> None:
    """A Redis up for longer than the grace a young one gives."""
    await until_aged(redis_server)


def tpm(n: int) -> RateBudget:
    return RateBudget(tokens_per_minute=n, requests_per_minute=100)


async def still_waiting(*waiters: asyncio.Future[str]) -> None:
    await asyncio.sleep(0.3)  # (a grant would have reached its mailbox by now)
    assert not any(w.done() for w in waiters)


@pytest.mark.parametrize("backfill", [0.0, 5.0])
async def test_a_lighter_waiter_passes_one_the_budget_holds_back_only_with_backfill(
    limits: Limits, redis_server: RedisServer, backfill: float
) -> None:
    holder, head = limits(4, budget=tpm(1000)), limits(4, budget=tpm(1000))
    behind = limits(4, budget=tpm(1000), backfill_seconds=backfill)
    assert await holder.enqueue(tokens=900) == "admitted"
    first = head.enqueue(tokens=500)  # waits ~60 s for the budget, the slots kept for it
    await settle(holder, head)
    light = behind.enqueue(tokens=50)  # fits the 100 left now
    heavy = behind.enqueue(tokens=200)  # does not
    if backfill:
        assert await asyncio.wait_for(light, 3) == "admitted"
        assert kept(redis_server.client(), holder)["u"]["t"] == 950
    await still_waiting(first, heavy, *([] if backfill else [light]))
    for limit, waiter in ((head, first), (behind, heavy), (behind, light)):
        if not waiter.done():
            limit.leave(waiter)
    if backfill:
        behind.settle(light)
        behind.release()
    holder.release()
    await settle(holder, head, behind)


async def test_a_waiter_passes_only_within_the_room_the_oldest_has_at_its_target(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    holder, head = limits(4, budget=tpm(1000)), limits(4, budget=tpm(1000))
    behind = limits(4, budget=tpm(1000), backfill_seconds=1.0)
    assert await holder.enqueue(tokens=300) == "admitted"  # in second s0
    s0 = kept(client, holder)["n"]
    while int(client.time()[0]) < s0 + 2:  # noqa: ASYNC110 (Redis's clock, not ours)
        await asyncio.sleep(0.05)
    assert await holder.enqueue(tokens=400) == "admitted"  # in s0 + 2 or later
    # 500 fits once s0's 300 leave (s0 + 61 s): its target is s0 + 62 s, when the 400 are
    # still counted. So 1000 - 500 - 400 = 100 may pass it in all, of the 300 free now.
    first = head.enqueue(tokens=500)
    await settle(holder, head)
    too_much = behind.enqueue(tokens=150)  # fits now, but would leave the head short
    fits = behind.enqueue(tokens=80)
    assert await asyncio.wait_for(fits, 3) == "admitted"
    last = behind.enqueue(tokens=30)  # 20 left of the 100: no more
    await still_waiting(first, too_much, last)
    assert kept(client, holder)["u"]["t"] == 780
    for limit, waiter in ((head, first), (behind, too_much), (behind, last)):
        limit.leave(waiter)
    behind.settle(fits)
    behind.release()
    holder.release()
    holder.release()
    await settle(holder, head, behind)


def test_backfill_needs_a_budget_and_a_number_of_seconds(redis_server: RedisServer) -> None:
    with pytest.raises(ValueError, match=r"backfill_seconds=2\.0 needs a budget"):
        SharedLimit(2, redis_url=redis_server.url, key="k", backfill_seconds=2.0)
    with pytest.raises(TypeError, match="backfill_seconds must be a number"):
        SharedLimit(2, redis_url=redis_server.url, key="k", budget=tpm(10), backfill_seconds="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backfill_seconds must be >= 0"):
        SharedLimit(2, redis_url=redis_server.url, key="k", budget=tpm(10), backfill_seconds=-1)
    limit = SharedLimit(2, redis_url=redis_server.url, key="k", budget=tpm(10), backfill_seconds=3)
    assert limit.backfill_seconds == 3.0
