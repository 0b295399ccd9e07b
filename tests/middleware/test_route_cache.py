"""The route table's cache holds only what the app declares: traffic that no static route can
match (404s, templated paths, odd methods) leaves no lasting memory (issue 10, item 2)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from gym_concurrency.middleware.routing import RouteTable
from starlette.types import Message, Receive, Scope, Send

PATHS = 100_000
LONG = "x" * 1000  # long paths, as a client may send (h11 takes request lines of ~64 kB)
# Growth allowed after 100,000 distinct paths: allocator noise, not one kilobyte per path.
FLAT_BYTES = 64 * 1024


def app_with_routes() -> FastAPI:
    app = FastAPI()

    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    app.add_api_route("/run", endpoint, methods=["POST"])
    app.add_api_route("/health", endpoint, methods=["GET"])
    app.add_api_route("/episodes/{episode_id}", endpoint, methods=["POST"])
    app.add_route("/anything", AnyMethod())  # an ASGI app as endpoint: every method
    return app


class AnyMethod:
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


LIMITS = [
    RouteLimit(path="/run", limit_name="episodes", max_concurrent=4),
    RouteLimit(path="/episodes/{episode_id}", limit_name="episode", max_concurrent=4),
    RouteLimit(path="/anything", limit_name="anything", max_concurrent=4),
]


def table() -> RouteTable[str]:
    return RouteTable.compile(app_with_routes(), [(limit, limit.limit_name) for limit in LIMITS])


def http(path: str, method: str = "GET") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}


def growth(run: Callable[[int], None]) -> int:
    """Bytes still allocated after `run(i)` for i in range(PATHS), traced by tracemalloc."""
    run(-1)  # warm up: first-call allocations are not growth
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(PATHS):
            run(i)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("kind", "scope_of", "expected"),
    [
        ("404 paths", lambda i: http(f"/missing/{i}/{LONG}"), None),
        ("templated limited paths", lambda i: http(f"/episodes/{i}-{LONG}", "POST"), "episode"),
        (
            "odd methods on a limited route",
            lambda i: http("/anything", f"M{i}{LONG[:50]}"),
            "anything",
        ),
        ("near misses of a limited route", lambda i: http(f"/run/{i}{LONG}", "POST"), None),
    ],
)
def test_memory_is_flat_over_100000_distinct_paths(
    kind: str, scope_of: Callable[[int], dict[str, Any]], expected: str | None
):
    routes = table()

    def run(i: int) -> None:
        assert routes.resolve(scope_of(i)) == expected

    grown = growth(run)
    print(f"{kind}: +{grown / 1024:.1f} KiB after {PATHS} distinct paths")
    assert grown < FLAT_BYTES, f"{kind}: +{grown / 1024:.0f} KiB after {PATHS} paths"


def test_declared_static_routes_are_still_cached():
    routes = table()
    for _ in range(3):
        assert routes.resolve(http("/run", "POST")) == "episodes"
        assert routes.resolve(http("/health")) is None
        assert routes.resolve(http("/run", "GET")) is None  # a 405: not limited
    assert len(routes._cache) == 3


def test_the_middleware_keeps_no_memory_for_unconfigured_traffic(component: str):
    app = app_with_routes()
    settings = ConcurrencySettings(component=component, routes=list(LIMITS))

    async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = ConcurrencyLimitMiddleware(not_found, settings=settings)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        return None

    async def requests(first: int, count: int) -> None:
        for i in range(first, first + count):
            scope = {**http(f"/missing/{i}/{LONG}"), "app": app}
            await middleware(scope, receive, send)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(requests(-10, 10))  # builds the table
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        loop.run_until_complete(requests(0, PATHS))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    finally:
        loop.close()
    print(f"middleware, 404 paths: +{grown / 1024:.1f} KiB after {PATHS} distinct paths")
    assert grown < FLAT_BYTES, f"+{grown / 1024:.0f} KiB after {PATHS} paths"


def test_uncached_paths_resolve_in_router_order():
    app = FastAPI()

    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    app.add_api_route("/items/special", endpoint, methods=["POST"])  # shadows the template
    app.add_api_route("/items/{item_id}", endpoint, methods=["GET"])  # 405 for POST: look on
    app.add_api_route("/items/{item_id}", endpoint, methods=["POST", "PUT"])
    limits = [RouteLimit(path="/items/{item_id}", limit_name="items", max_concurrent=1)]
    routes = RouteTable.compile(app, [(limit, limit.limit_name) for limit in limits])
    for _ in range(2):
        assert routes.resolve(http("/items/special", "POST")) is None
        assert routes.resolve(http("/items/special", "GET")) == "items"
        assert routes.resolve(http("/items/7", "POST")) == "items"
        assert routes.resolve(http("/items/7", "PUT")) == "items"
        assert routes.resolve(http("/items/7", "DELETE")) is None  # a 405: not limited
        assert routes.resolve(http("/items/7/more", "POST")) is None
