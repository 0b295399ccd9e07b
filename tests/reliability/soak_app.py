"""The soak server: a small FastAPI app with one limit per kind of traffic, served by uvicorn.

Run as `python -m tests.reliability.soak_app PORT`. Its own SDK MeterProvider (global in this
process) feeds a PrometheusMetricReader that `/metrics` serves. An outermost ASGI counter
(`soak.requests`, by path) counts the requests that reached ConcurrencyLimitMiddleware, and
each handler counts its calls (`soak.handler_calls`, by path), so a scrape can check that every
request got exactly one admission outcome.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

COMPONENT = "soak"
STREAM_CHUNKS = 5

# path -> the route limit guarding it. Each limit exercises one admission behaviour.
ROUTE_LIMITS = {
    "/plain": RouteLimit(path="/plain", limit_name="plain", max_concurrent=16),
    "/stream": RouteLimit(
        path="/stream", limit_name="stream", max_concurrent=4, queue_timeout_seconds=2
    ),
    "/crash": RouteLimit(path="/crash", limit_name="crash", max_concurrent=4),
    "/slow": RouteLimit(
        path="/slow", limit_name="slow", max_concurrent=2, queue_timeout_seconds=0.02
    ),
    "/shed": RouteLimit(
        path="/shed", limit_name="shed", max_concurrent=2, max_queue=2, failure="openai"
    ),
    "/episode": RouteLimit(
        path="/episode",
        limit_name="episode",
        max_concurrent=2,
        queue_timeout_seconds=0.02,
        max_queue=3,
        failure="episode",
    ),
    "/hold": RouteLimit(path="/hold", limit_name="hold", max_concurrent=1),
}


class RequestCounter:
    """Outermost ASGI layer: counts each HTTP request by path before anything else sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests = metrics.get_meter("soak").create_counter("soak.requests")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in ROUTE_LIMITS:
            self.requests.add(1, {"path": scope["path"]})
        await self.app(scope, receive, send)


def create_app() -> FastAPI:
    """The soak app; sets this process's global MeterProvider (call once per process)."""
    registry = CollectorRegistry(auto_describe=True)
    metrics.set_meter_provider(
        MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    )
    calls = metrics.get_meter("soak").create_counter("soak.handler_calls")
    app = FastAPI()

    def called(path: str) -> None:
        calls.add(1, {"path": path})

    @app.get("/plain")
    async def plain() -> dict[str, bool]:
        called("/plain")
        await asyncio.sleep(0)
        return {"ok": True}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        called("/stream")

        async def chunks() -> AsyncIterator[bytes]:
            for index in range(STREAM_CHUNKS):
                yield f"chunk{index}\n".encode()
                await asyncio.sleep(0.002)

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.post("/crash")
    async def crash() -> None:
        called("/crash")
        raise RuntimeError("soak: this route always crashes")

    @app.post("/slow")
    async def slow() -> dict[str, bool]:
        called("/slow")
        await asyncio.sleep(0.01)
        return {"ok": True}

    @app.post("/shed")
    async def shed() -> dict[str, bool]:
        called("/shed")
        await asyncio.sleep(0.005)
        return {"ok": True}

    @app.post("/episode")
    async def episode(request: Request) -> dict[str, Any]:
        called("/episode")
        body = json.loads(await request.body())
        await asyncio.sleep(0.005)
        return {
            "episode_id": body["episode_id"],
            "task_id": body["task"]["task_id"],
            "result": {"reward": 1.0},
            "failure": None,
        }

    @app.post("/hold")
    async def hold() -> dict[str, bool]:
        called("/hold")
        await asyncio.sleep(0.02)
        return {"ok": True}

    @app.get("/metrics")
    async def scrape() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    settings = ConcurrencySettings(component=COMPONENT, routes=list(ROUTE_LIMITS.values()))
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    app.add_middleware(RequestCounter)  # added last: outermost, sees every request first
    return app


def main() -> None:
    """Serve the soak app on 127.0.0.1:PORT until terminated."""
    port = int(sys.argv[1])
    uvicorn.run(
        create_app(),
        host="127.0.0.1",
        port=port,
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
