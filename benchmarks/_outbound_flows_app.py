"""The scenario of issue 33's "a route's flow goes with its outbound calls", for
benchmarks/outbound_flows.py and tests/clients/test_route_flow_outbound.py: two apps.

- `upstream_app(service_s)`: a slow upstream; every request sleeps `service_s`, then 200.
- `resources_app(upstream_url, client_flow)`: a resources server whose `POST /run` (route
  limit `run`, never binding, `flow: header:x-tenant`) calls the upstream once through the
  configured client limit `upstream` of `slots` slots, the bottleneck. Its `flow` is
  `client_flow`: `route` (the request's flow, the default) or `none` (every call in the
  default flow, as before issue 33).

    python -m benchmarks._outbound_flows_app upstream --port P [--service-ms 100]
    python -m benchmarks._outbound_flows_app resources --port P --upstream URL
        --client-flow route|none [--slots 4] [--redis-url URL (the client limit global)]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["TENANT_HEADER", "resources_app", "upstream_app"]

TENANT_HEADER = "x-tenant"
SLOTS = 4
SERVICE_S = 0.1


def upstream_app(service_s: float = SERVICE_S) -> Any:
    """A pure ASGI app: each request sleeps `service_s`, then answers 200 `ok`."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await asyncio.sleep(service_s)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def resources_app(
    upstream_url: str,
    client_flow: str = "route",
    *,
    slots: int = SLOTS,
    component: str = "tenants_bench",
    redis_url: str | None = None,
) -> Any:
    """The resources server; with `redis_url`, its client limit is global (scope: global)."""
    import httpx
    from fastapi import FastAPI
    from gym_concurrency.middleware import (
        ClientLimit,
        ConcurrencyLimitMiddleware,
        ConcurrencySettings,
        RouteLimit,
        limited_client,
    )

    client_limit: dict[str, Any] = {"limit_name": "upstream", "max_concurrent": slots}
    client_limit.update(retry=None, flow=client_flow)
    if redis_url is not None:
        client_limit["scope"] = "global"
    settings = ConcurrencySettings(
        component=component,
        redis_url=redis_url,
        routes=[
            RouteLimit(
                path="/run",
                limit_name="run",
                max_concurrent=1024,
                flow=f"header:{TENANT_HEADER}",
            )
        ],
        clients=[ClientLimit(**client_limit)],
    )
    clients: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        for client in clients.values():
            await client.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/run")
    async def run() -> dict[str, int]:
        client = clients.get("upstream")
        if client is None:  # made on first use: the middleware has started by then
            transport = limited_client(app, "upstream").transport()
            client = clients["upstream"] = httpx.AsyncClient(
                base_url=upstream_url, transport=transport, timeout=120
            )
        response = await client.get("/work")
        return {"upstream": response.status_code}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=("upstream", "resources"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--service-ms", type=float, default=SERVICE_S * 1000)
    parser.add_argument("--upstream", default=None)
    parser.add_argument("--client-flow", choices=("route", "none"), default="route")
    parser.add_argument("--slots", type=int, default=SLOTS)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    import uvicorn

    if args.role == "upstream":
        app = upstream_app(args.service_ms / 1000)
    else:
        if args.upstream is None:
            parser.error("resources needs --upstream URL")
        app = resources_app(
            args.upstream, args.client_flow, slots=args.slots, redis_url=args.redis_url
        )
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="auto",
        http="auto",
        log_level="error",
        access_log=False,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
