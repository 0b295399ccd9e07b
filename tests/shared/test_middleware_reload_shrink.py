"""The reload-shrink scenario (tests/middleware/reload_flood.py) on a global limit: two real
uvicorn servers share the route's limit through a real redis-server, the head waiter (weight
8, all of the limit) queued from one, the flood from both; each is reloaded to 2. The head is
granted the whole shrunk limit, the global queue drains, every request answers 200 well within
the bound, and Redis ends with nothing held or queued."""

from __future__ import annotations

from contextlib import ExitStack

from gym_concurrency.middleware import ConcurrencySettings

from gym_concurrency import SharedLimit
from tests.middleware.reload_flood import (
    COSTS,
    Served,
    flood_and_shrink,
    reloadable_app,
    route_limit,
    weighted,
)
from tests.servers import UvicornServer
from tests.shared.redis_server import RedisServer


async def test_a_reload_below_the_head_waiters_weight_drains_the_global_queue(
    redis_server: RedisServer, key: str
) -> None:
    def settings(size: int) -> ConcurrencySettings:
        return weighted(key, size, scope="global", redis_url=redis_server.url)

    servers: list[Served] = []
    with ExitStack() as stack:
        for _ in range(2):  # two servers, each its own middleware and SharedLimit: processes
            app, gate = reloadable_app(settings)
            server = stack.enter_context(UvicornServer(app))
            servers.append(Served(server.url, gate, route_limit(app)))
        outcome = await flood_and_shrink(servers, flood=40)
        print(f"reload-shrink, global limit over two servers: {outcome}")
        limits = [s.limit for s in servers]
        assert all(isinstance(limit, SharedLimit) for limit in limits)
        assert outcome.unfinished == 0, outcome
        assert outcome.statuses == [200] * 42
        assert outcome.drain_seconds < 10.0
        assert [(limit.limit, limit.active, limit.queue_depth) for limit in limits] == [
            (2, 0, 0)
        ] * 2
        assert sum(limit.admission_capped for limit in limits) == 1 + sum(
            c > 2 for c in (COSTS * 4)[:40]
        )
        client = redis_server.client()
        keys = limits[0].redis_keys  # type: ignore[attr-defined]  # (a SharedLimit: above)
        assert client.zcard(keys["leases"]) == 0
        assert client.zcard(keys["queue"]) == 0
        assert client.hgetall(keys["capped"]) == {}
        assert client.hget(keys["state"], "n") == "0"
