"""Issue 33's scenario: a resources server (real uvicorn) whose route reads each request's flow
from `x-tenant` calls a slow upstream (real uvicorn, 100 ms a call) through a configured client
limit of 4 slots, the bottleneck. A noisy tenant floods it (48 requests at once, each sent
again when answered) while a quiet tenant sends one request at a time. Its calls go in its own
flow on the client limit, so its median stays within a few times its unloaded latency, with a
process limit and with a global one (a real redis-server). Calls all in the default flow (as
before, `flow: none`) queue it behind the flood: ~1.3 s, over 10x (benchmarks/outbound_flows.py
measures both)."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx
import pytest
from gym_concurrency.middleware import limited_client

from benchmarks._outbound_flows_app import SLOTS, TENANT_HEADER, resources_app, upstream_app
from tests.servers import UvicornServer, eventually
from tests.shared.redis_server import RedisServer

NOISY = 48
QUIET_CALLS = 8
BOUND = 4  # the quiet tenant's median under the flood, at most this many times its own alone


async def quiet_latencies(url: str, calls: int) -> list[float]:
    """Seconds each of `calls` requests of the quiet tenant took, sent one at a time."""
    seconds = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for _ in range(calls):
            started = time.perf_counter()
            response = await client.post("/run", headers={TENANT_HEADER: "quiet"})
            seconds.append(time.perf_counter() - started)
            assert response.json() == {"upstream": 200}
    return seconds


async def under_flood(url: str, app: Any) -> list[float]:
    """The quiet tenant's latencies while the noisy one keeps NOISY requests in flight."""
    stop = asyncio.Event()
    async with httpx.AsyncClient(
        base_url=url, timeout=120, limits=httpx.Limits(max_connections=NOISY)
    ) as noisy:

        async def flood() -> None:
            while not stop.is_set():
                response = await noisy.post("/run", headers={TENANT_HEADER: "noisy"})
                assert response.json() == {"upstream": 200}

        floods = [asyncio.create_task(flood()) for _ in range(NOISY)]
        try:
            limit = limited_client(app, "upstream").limit
            await eventually(
                lambda: limit.queue_depth >= NOISY - 2 * SLOTS, "the flood to queue", 15
            )
            return await quiet_latencies(url, QUIET_CALLS)
        finally:
            stop.set()
            await asyncio.gather(*floods)


async def quiet_tenant_under_flood(app: Any) -> tuple[float, float]:
    """(the quiet tenant's median alone, its median under the flood), in seconds."""
    with UvicornServer(app) as server:
        alone = statistics.median(await quiet_latencies(server.url, 5))
        flooded = statistics.median(await under_flood(server.url, app))
    return alone, flooded


@pytest.fixture(scope="module")
def slow_upstream() -> Any:
    with UvicornServer(upstream_app(0.1)) as server:
        yield server.url


async def test_a_quiet_tenant_is_not_queued_behind_a_noisy_ones_calls(
    slow_upstream: str, name: str
) -> None:
    app = resources_app(slow_upstream, component=name)
    alone, flooded = await quiet_tenant_under_flood(app)
    assert 0.1 <= alone < 0.5, alone
    assert flooded <= BOUND * alone, (alone, flooded)


async def test_the_flow_reaches_a_global_client_limit(
    slow_upstream: str, name: str, redis_server: RedisServer
) -> None:
    app = resources_app(slow_upstream, component=name, redis_url=redis_server.url)
    alone, flooded = await quiet_tenant_under_flood(app)
    assert 0.1 <= alone < 0.5, alone
    assert flooded <= BOUND * alone, (alone, flooded)
