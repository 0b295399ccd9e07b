"""What one admission of a global limit costs Redis, counted by Redis itself (`INFO
commandstats`, whose counts include the commands a script runs): at most 2 script calls and
12 commands an admission uncontended, 15 contended (the contract's cost list). Counts, not
times: they hold on any machine. The time figures are benchmarks/shared_cost.py's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis

from gym_concurrency import SharedLimit
from tests.shared.redis_server import RedisServer

ADMISSIONS = 400
# A heartbeat every 2 s at most: a script call or two in the counts, not more.
LEASE = {"lease_seconds": 6.0, "redis_timeout": 2.0}


@pytest.fixture
async def counted(
    redis_server: RedisServer, key: str
) -> AsyncIterator[tuple[SharedLimit, redis.Redis]]:
    """A limit of 8 on the session's Redis, once it has been up for longer than the grace a
    young Redis gives (2.5 s for this lease: it may have lost slots still held)."""
    while int(redis_server.client().info("server")["uptime_in_seconds"]) < 3:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    limit = SharedLimit(8, redis_url=redis_server.url, key=key, **LEASE)
    try:
        assert await limit.connect()
        yield limit, redis_server.client()
    finally:
        await limit.close()


def calls(client: redis.Redis) -> tuple[int, int]:
    """(script calls, commands the scripts ran) so far."""
    stats = client.info("commandstats")
    scripts = sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_eval"))
    outside = ("cmdstat_eval", "cmdstat_info", "cmdstat_blpop", "cmdstat_hello", "cmdstat_client")
    inner = sum(v["calls"] for k, v in stats.items() if not k.startswith(outside))
    return scripts, inner


async def per_admission(
    client: redis.Redis, admissions: int, run: Callable[[], Awaitable[object]]
) -> tuple[float, float]:
    """(script calls, commands) per admission while `run()` makes `admissions` of them."""
    before = calls(client)
    await run()
    await asyncio.sleep(0.2)  # the last release's script
    after = calls(client)
    return (after[0] - before[0]) / admissions, (after[1] - before[1]) / admissions


async def test_an_uncontended_admission_costs_two_scripts_and_at_most_12_commands(
    counted: tuple[SharedLimit, redis.Redis],
) -> None:
    limit, client = counted

    async def admissions() -> None:
        for _ in range(ADMISSIONS):
            async with limit:
                pass

    scripts, commands = await per_admission(client, ADMISSIONS, admissions)
    assert scripts <= 2.05
    assert commands <= 12, commands


async def test_a_contended_admission_costs_at_most_15_commands(
    counted: tuple[SharedLimit, redis.Redis],
) -> None:
    limit, client = counted
    tasks, each = 64, ADMISSIONS // 64  # 64 tasks over a limit of 8: most of them queue

    async def task() -> None:
        for _ in range(each):
            async with limit:
                await asyncio.sleep(0)

    def run() -> Awaitable[object]:
        return asyncio.gather(*(task() for _ in range(tasks)))

    scripts, commands = await per_admission(client, tasks * each, run)
    assert limit.admission_timeouts == 0
    assert scripts <= 2.05
    assert commands <= 15, commands


async def test_a_contended_admission_in_several_flows_costs_at_most_26_commands(
    counted: tuple[SharedLimit, redis.Redis],
) -> None:
    """Fair queuing across processes reads and writes the flows' order on each hand-off: a
    bounded number of commands more (docs/performance.md gives the figure)."""
    limit, client = counted
    flows, tasks = 4, 64
    each = ADMISSIONS // tasks

    async def task(flow: str) -> None:
        for _ in range(each):
            async with limit.hold(1, flow):
                await asyncio.sleep(0)

    def run() -> Awaitable[object]:
        return asyncio.gather(*(task(f"flow-{n % flows}") for n in range(tasks)))

    scripts, commands = await per_admission(client, tasks * each, run)
    print(f"flows: {scripts:.2f} script calls, {commands:.1f} commands per admission")
    assert limit.admission_timeouts == 0
    assert scripts <= 2.05
    assert commands <= 26, commands
