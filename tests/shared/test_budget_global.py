"""Rate budgets shared across processes through Redis (SharedLimit(budget=...)), on a real
redis-server: processes that share a budget never reserve more than it within the window;
a waiter that the budget cannot hold in time is refused "budget" at once with how long it
would wait; a refund goes back to the second charged and admits a waiter held up by the
budget; provider readings are shared, the freshest winning; a lost budget key never admits
more; and a budgeted admission still costs one script call (plus its release's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from gym_concurrency import SharedLimit
from gym_concurrency.limits.limit import UpstreamCapacityError
from gym_concurrency.limits.rate_budget import RateBudget
from gym_concurrency.usage import Usage
from tests.shared.helpers import Limits, kept, settle, until_aged, wait_for
from tests.shared.redis_server import RedisServer
from tests.shared.test_cost import calls
from tests.shared.test_processes import FAST, Workers


@pytest.fixture(autouse=True)
async def aged(redis_server: RedisServer) -> None:
    """A Redis up for longer than the grace a young one gives."""
    await until_aged(redis_server)


def rpm(n: int) -> RateBudget:
    return RateBudget(requests_per_minute=n)


def tpm(n: int) -> RateBudget:
    return RateBudget(tokens_per_minute=n, requests_per_minute=100)


async def test_two_processes_never_reserve_more_than_the_budget(
    limits: Limits, redis_server: RedisServer
) -> None:
    a, b = limits(8, budget=rpm(5), timeout=2), limits(8, budget=rpm(5), timeout=2)
    started = time.monotonic()
    outcomes = [await (a if n % 2 else b).enqueue() for n in range(10)]
    assert outcomes == ["admitted"] * 5 + ["budget"] * 5
    assert time.monotonic() - started < 1.5  # refused at once: ~60 s is past their timeout
    assert kept(redis_server.client(), a)["u"] == {"r": 5}
    assert a.admission_budget + b.admission_budget == 5
    assert a.admission_timeouts + b.admission_timeouts == 5  # counted as timeouts too
    stats = a.budget_statistics()
    assert stats is not None
    assert stats.requests is not None
    assert (stats.requests.limit, stats.requests.remaining) == (5, 0)
    assert a.active + b.active == 5  # the slots were free: the budget held them up
    for limit in (a, b):
        while limit.active:
            limit.release()
    await settle(a, b)


async def test_acquire_raises_upstream_capacity_with_a_retry_after(limits: Limits) -> None:
    limit = limits(4, budget=rpm(1), timeout=1)
    await limit.acquire()
    with pytest.raises(UpstreamCapacityError) as raised:
        await limit.acquire()
    assert raised.value.reason == "budget"
    assert raised.value.retry_after is not None
    assert 55 < raised.value.retry_after <= 61
    limit.release()
    await settle(limit)


async def test_a_refund_goes_back_and_an_overrun_is_charged(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    a, b = limits(4, budget=tpm(1000), timeout=1), limits(4, budget=tpm(1000), timeout=1)
    first = a.enqueue(tokens=600)
    assert await first == "admitted"
    reservation = a.settle(first)
    assert reservation is not None
    assert reservation.estimate("tokens") == 600
    assert await b.enqueue(tokens=600) == "budget"
    reservation.settle(Usage(input_tokens=50, output_tokens=50))  # 500 back
    a.release()
    await wait_for(lambda: kept(client, a)["u"]["t"] == 100, 2.0, "refunded")
    second = b.enqueue(tokens=600)
    assert await second == "admitted"
    taken = b.settle(second)
    assert taken is not None
    taken.settle(900)  # 300 more than estimated: charged now
    b.release()
    await wait_for(lambda: kept(client, a)["u"]["t"] == 1000, 2.0, "overrun charged")
    assert await a.enqueue(tokens=1) == "budget"
    stats = a.budget_statistics()
    assert stats is not None
    assert stats.tokens is not None
    assert (stats.tokens.reserved, stats.tokens.refunded_total) == (0, 500)
    await settle(a, b)


async def test_a_waiter_held_up_by_the_budget_is_admitted_once_a_refund_makes_room(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    holder, waiting = limits(4, budget=tpm(1000)), limits(4, budget=tpm(1000))
    first = holder.enqueue(tokens=900)
    assert await first == "admitted"
    reservation = holder.settle(first)
    queued = waiting.enqueue(tokens=500)  # no timeout: it waits, the slots kept for it
    await settle(holder, waiting)
    assert not queued.done()
    assert waiting.shared_budget is not None
    held_up = waiting.shared_budget.blocking()
    assert held_up is not None
    assert 55 < held_up <= 61
    assert reservation is not None
    reservation.settle(200)  # 700 back: 500 fits now
    holder.release()
    assert await asyncio.wait_for(queued, 3) == "admitted"
    granted = waiting.settle(queued)
    assert granted is not None
    assert granted.ref.startswith("g")
    assert kept(client, holder)["u"]["t"] == 700
    granted.settle(100)  # back to the second its grant charged
    waiting.release()
    await wait_for(lambda: kept(client, holder)["u"]["t"] == 300, 2.0, "refunded")
    kept_grants = client.zrange(holder.redis_keys["bgrant"], 0, -1)
    assert [m for m in kept_grants if not m.startswith("o")] == []  # (`o`: batches applied)
    await settle(holder, waiting)


async def test_a_timeout_behind_a_waiter_held_up_by_the_budget_ends_budget(
    limits: Limits, redis_server: RedisServer
) -> None:
    holder, head = limits(4, budget=tpm(1000)), limits(4, budget=tpm(1000))
    behind = limits(4, budget=tpm(1000), timeout=1.0)
    assert await holder.enqueue(tokens=900) == "admitted"
    first = head.enqueue(tokens=1000)  # waits ~60 s for the budget, the slots kept for it
    await settle(holder, head)
    late = behind.enqueue(tokens=50)  # fits now, but the head needs the whole minute: it waits
    # Not "timeout": slots were free (a deadline stays "deadline": test_budget_faults.py).
    assert await asyncio.wait_for(late, 3) == "budget"
    assert (behind.admission_budget, behind.admission_timeouts) == (1, 1)
    assert not first.done()
    head.leave(first)
    holder.release()
    await settle(holder, head, behind)


async def test_hold_and_async_with_charge_the_estimate_in_full(
    limits: Limits, redis_server: RedisServer
) -> None:
    limit = limits(4, budget=tpm(1000))
    async with limit.hold(2):  # the weight is the estimate: 2 tokens
        pass
    async with limit:
        pass
    await limit.acquire(tokens=300)
    limit.release()
    await settle(limit)
    assert kept(redis_server.client(), limit)["u"] == {"t": 303, "r": 3}
    stats = limit.budget_statistics()
    assert stats is not None
    assert stats.tokens is not None
    assert (stats.tokens.reserved, stats.tokens.remaining) == (0, 697)


async def test_a_hold_settles_its_shared_reservation_as_a_process_budget_does(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    limit = limits(4, budget=tpm(1000), timeout=1)
    async with limit.hold(tokens=600) as held:  # 600 reserved with the slot, in Redis
        assert held.reservation is not None
        assert held.reservation.estimate("tokens") == 600
        held.settle(Usage(input_tokens=100, output_tokens=100))  # 400 of it refunded
        assert not held.reservation.open
    async with limit.hold(tokens=50) as held:
        held.cancel()  # never sent: all of it back, its request too
    async with limit.hold(tokens=100):
        pass  # left open: charged in full at the exit
    await settle(limit)
    await wait_for(lambda: kept(client, limit)["u"] == {"t": 300, "r": 2}, 2.0, "settled")
    with pytest.raises(UpstreamCapacityError, match="could not hold 800 tokens") as raised:
        await limit.acquire(tokens=800)
    assert raised.value.retry_after is not None
    assert 55 < raised.value.retry_after <= 61
    stats = limit.statistics()
    assert (stats.admission_budget, stats.admission_timeouts) == (1, 1)
    assert stats.admission_saturated == 0
    assert limit.active == 0
    await settle(limit)


async def test_a_waiter_that_leaves_as_it_is_admitted_gives_its_estimate_back(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    limit = limits(4, budget=rpm(2))
    waiter = limit.enqueue()
    await asyncio.sleep(0.2)  # admitted, its task not resumed
    assert waiter.done()
    limit.leave(waiter)  # never sent: slot and request back
    await wait_for(lambda: kept(client, limit)["u"]["r"] == 0, 2.0, "request returned")
    assert limit.active == 0
    await settle(limit)


async def test_the_freshest_provider_reading_wins_across_processes(limits: Limits) -> None:
    a, b = limits(4, budget=tpm(10_000), timeout=1), limits(4, budget=tpm(10_000), timeout=1)
    assert a.shared_budget is not None
    assert b.shared_budget is not None
    assert await a.connect()
    assert await b.connect()
    now = time.monotonic()
    a.shared_budget.report("tokens", remaining=100, reset_at=now + 30)
    await settle(a)
    b.shared_budget.report(
        "tokens", remaining=9000, reset_at=now + 30, observed_at=now - 5
    )  # older
    assert await b.enqueue(tokens=200) == "budget"  # the provider's 100 hold until its reset
    stats = b.budget_statistics()
    assert stats is not None
    assert stats.tokens is not None
    assert (stats.tokens.reported_remaining, stats.tokens.remaining) == (100, 100)
    assert await b.enqueue(tokens=100) == "admitted"
    b.release()
    await settle(a, b)


@pytest.mark.parametrize("lost", ["budget", "budget bgrant", "state", "budget state"])
async def test_a_lost_budget_key_admits_no_more(
    limits: Limits, redis_server: RedisServer, lost: str
) -> None:
    client = redis_server.client()
    a, b = limits(8, budget=rpm(5), timeout=1), limits(8, budget=rpm(5), timeout=1)
    assert [await a.enqueue(), await a.enqueue()] == ["admitted"] * 2
    await settle(a)
    client.delete(*(a.redis_keys[name] for name in lost.split()))
    # The window moves on (a lost `budget` is found then), and a grace period a lost state
    # starts (a lease) ends.
    await asyncio.sleep(2.2)
    admitted = 0
    for _ in range(6):
        admitted += await b.enqueue() == "admitted"
    # Losing `budget` alone keeps the counts (state): 3 more. Losing the state starts a
    # grace period; with `budget` lost too, the whole minute counts as spent.
    assert admitted == {"budget": 3, "budget bgrant": 3, "state": 3, "budget state": 0}[lost]
    assert kept(client, a)["u"]["r"] == 5
    for limit in (a, b):
        while limit.active:
            limit.release()
    await settle(a, b)


def test_a_bucket_budget_is_refused_for_a_global_limit(redis_server: RedisServer) -> None:
    with pytest.raises(ValueError, match="shape='sliding'"):
        SharedLimit(
            2,
            redis_url=redis_server.url,
            key="bucket",
            budget=RateBudget(tokens_per_minute=10, shape="bucket"),
        )


@pytest.fixture
async def counted(
    redis_server: RedisServer, key: str
) -> AsyncIterator[tuple[SharedLimit, SharedLimit, redis.Redis]]:
    """A limit of 8 with a large budget and one without, on the same Redis."""
    options: dict[str, Any] = {"lease_seconds": 6.0, "redis_timeout": 2.0}
    budget = RateBudget(tokens_per_minute=10**9, requests_per_minute=10**8)
    budgeted = SharedLimit(8, redis_url=redis_server.url, key=key, budget=budget, **options)
    plain = SharedLimit(8, redis_url=redis_server.url, key=key + "-plain", **options)
    try:
        assert await budgeted.connect()
        assert await plain.connect()
        yield budgeted, plain, redis_server.client()
    finally:
        await budgeted.close()
        await plain.close()


async def test_a_settled_budgeted_admission_still_costs_two_script_calls(
    counted: tuple[SharedLimit, SharedLimit, redis.Redis],
) -> None:
    limit, _, client = counted
    admissions = 300
    before = calls(client)
    for _ in range(admissions):
        waiter = limit.enqueue(tokens=500)
        assert await waiter == "admitted"
        reservation = limit.settle(waiter)
        assert reservation is not None
        reservation.settle(120)  # rides on the release's call
        limit.release()
        await asyncio.sleep(0)
    await asyncio.sleep(0.2)
    after = calls(client)
    scripts = (after[0] - before[0]) / admissions
    commands = (after[1] - before[1]) / admissions
    print(f"budgeted: {scripts:.2f} script calls, {commands:.1f} commands per admission")
    assert scripts <= 2.05  # the acquire and the release (with the settlement)
    assert commands <= 12, commands


def test_two_os_processes_share_one_budget(redis_server: RedisServer, key: str) -> None:
    workers = Workers(redis_server, key)
    try:
        config = {"budget": {"requests_per_minute": 5}, "tokens": 10, "used": 5}
        options = {**FAST, "timeout": 2.0}
        procs = [
            workers.start("budget", f"p{n}", 8, requests=5, options=options, **config)
            for n in range(2)
        ]
        workers.go(2)
        reports = [workers.report(p) for p in procs]
    finally:
        workers.stop()
    outcomes = [o for r in reports for o in r["outcomes"]]
    assert outcomes.count("admitted") == 5
    assert outcomes.count("budget") == 5
    assert sum(r["budget_refused"] for r in reports) == 5
