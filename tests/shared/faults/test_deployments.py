"""Two deployments on one Redis db that happen to use the same `limit_name` never share a
limit: the keys are namespaced by the settings' `component` (and `server_name`), and
`redis_key_prefix` separates deployments that share those too. Over real uvicorn processes
configured only from GYM_CONCURRENCY_* variables, a witness counter in each deployment's
handler."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.shared.redis_server import RedisServer
from tests.shared.test_middleware_global import Servers, peak, route

HOLD = 1.0


# A short lease: the Redis of each test has just started, so that its first admissions wait
# out a grace period of one lease (it may have lost slots still held).
LEASE = {"GYM_CONCURRENCY_REDIS_LEASE_SECONDS": "1.5"}


async def run_both(a: Servers, b: Servers, count_a: int, count_b: int) -> list[float]:
    """`count_a` requests to deployment a and `count_b` to b at once, each holding its slot
    HOLD s, after one request to each (the grace period); how long each took."""
    async with httpx.AsyncClient(timeout=30) as client:
        for server in (a, b):
            warm = await client.post(f"{server.servers[0].url}/run", params={"hold": 0})
            assert warm.status_code == 200, warm.text

        async def one(server: Servers) -> float:
            started = time.monotonic()
            answer = await client.post(f"{server.servers[0].url}/run", params={"hold": HOLD})
            assert answer.status_code == 200, answer.text
            return time.monotonic() - started

        return await asyncio.gather(
            *(one(a) for _ in range(count_a)), *(one(b) for _ in range(count_b))
        )


async def test_two_components_with_the_same_limit_name_have_a_limit_each(
    tmp_path: Path, store: RedisServer, redis_server: RedisServer, key: str
) -> None:
    team_a = Servers(
        tmp_path,
        store.url,
        f"{key}a",
        1,
        witness_url=redis_server.url,
        GYM_CONCURRENCY_ROUTES=route(6),
        **LEASE,
    )
    team_b = Servers(
        tmp_path,
        store.url,
        f"{key}b",
        1,
        witness_url=redis_server.url,
        GYM_CONCURRENCY_ROUTES=route(2),
        **LEASE,
    )  # started last
    try:
        took = await run_both(team_a, team_b, 6, 2)
    finally:
        team_a.close()
        team_b.close()
    assert (peak(redis_server, f"{key}a"), peak(redis_server, f"{key}b")) == (6, 2)
    assert max(took) < HOLD + 0.8, took  # nobody waited for the other team's holders


async def test_a_key_prefix_separates_deployments_of_one_component(
    tmp_path: Path, store: RedisServer, redis_server: RedisServer, key: str
) -> None:
    common = {"GYM_CONCURRENCY_COMPONENT": "same_component"}
    blue = Servers(
        tmp_path,
        store.url,
        f"{key}blue",
        1,
        witness_url=redis_server.url,
        GYM_CONCURRENCY_ROUTES=route(3),
        GYM_CONCURRENCY_REDIS_KEY_PREFIX="blue",
        **common,
        **LEASE,
    )
    green = Servers(
        tmp_path,
        store.url,
        f"{key}green",
        1,
        witness_url=redis_server.url,
        GYM_CONCURRENCY_ROUTES=route(3),
        GYM_CONCURRENCY_REDIS_KEY_PREFIX="green",
        **common,
        **LEASE,
    )
    try:
        took = await run_both(blue, green, 3, 3)
    finally:
        blue.close()
        green.close()
    assert (peak(redis_server, f"{key}blue"), peak(redis_server, f"{key}green")) == (3, 3)
    assert max(took) < HOLD + 0.8, took
    names = store.client().keys("*")
    assert names
    assert all(k.startswith(("blue:", "green:")) for k in names), names
