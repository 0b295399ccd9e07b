"""Adaptive route limits and Retry-After auto through the middleware: the app's overload answers
and exceptions move the limit down on the direct and the queued path, latency moves it, the
limit stays in its bounds and gym.concurrency.limit shows it; Retry-After from the hand-over
rate."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit

from gym_concurrency import (
    COMPONENT_ATTRIBUTE,
    CONCURRENCY_LIMIT_INSTRUMENT,
    LIMIT_NAME_ATTRIBUTE,
)
from tests.metrics_capture import MetricsCapture
from tests.registry import limits_of


class Upstream:
    """What the app does per request: sleep `latency` s, then answer `status` (or raise)."""

    def __init__(self) -> None:
        self.latency = 0.0
        self.latency_of: Any = None  # a function of nothing, instead of a fixed latency
        self.status = 200
        self.raise_error = False

    def delay(self) -> float:
        return self.latency if self.latency_of is None else float(self.latency_of())


def adaptive_app(
    component: str, meter_provider: Any = None, **route: Any
) -> tuple[FastAPI, Upstream]:
    upstream = Upstream()
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> JSONResponse:
        await request.body()
        await asyncio.sleep(upstream.delay())
        if upstream.raise_error:
            raise RuntimeError("the upstream connection broke")
        return JSONResponse({"ok": upstream.status == 200}, upstream.status)

    config = {"path": "/v1/chat/completions", "limit_name": "upstream", "failure": "openai"}
    config.update(route)
    settings = ConcurrencySettings(component=component, routes=[RouteLimit(**config)])
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings, meter_provider=meter_provider)
    return app, upstream


def client_for(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30)


async def flood(client: httpx.AsyncClient, requests: int, concurrency: int) -> list[int]:
    statuses: list[int] = []
    remaining = requests

    async def one_client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            response = await client.post("/v1/chat/completions", content=b"{}")
            statuses.append(response.status_code)

    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return statuses


ADAPTIVE = {"min_concurrent": 2, "max_concurrent": 32}


@pytest.mark.parametrize("answer", ["503", "429", "exception"])
async def test_overload_answers_and_exceptions_lower_the_limit_to_its_floor(
    component: str, answer: str
):
    app, upstream = adaptive_app(component, max_concurrent=16, adaptive=ADAPTIVE)
    upstream.latency = 0.002
    if answer == "exception":
        upstream.raise_error = True
    else:
        upstream.status = int(answer)
    async with client_for(app) as client:
        # 40 clients against 16 slots: admitted at once and after queueing, both measured.
        await flood(client, 600, 40)
    assert limits_of(component)["upstream"].limit == 2  # the floor, never below


async def test_healthy_answers_grow_a_used_limit_up_to_its_ceiling(component: str):
    bounds = {"min_concurrent": 2, "max_concurrent": 12}
    app, upstream = adaptive_app(component, max_concurrent=4, adaptive=bounds)
    upstream.latency = 0.05  # well above what the event loop itself adds at 24 in flight
    async with client_for(app) as client:
        statuses = await flood(client, 800, 24)
    assert set(statuses) == {200}
    assert limits_of(component)["upstream"].limit == 12  # the ceiling, never above


async def test_latency_rising_with_concurrency_holds_the_limit_near_the_knee(component: str):
    app, upstream = adaptive_app(component, max_concurrent=4, adaptive=ADAPTIVE)
    async with client_for(app) as client:
        await client.post("/v1/chat/completions", content=b"{}")
        semaphore = limits_of(component)["upstream"]
        # Flat to 8 in flight, then (c / 8) ** 2 as slow: the knee is at 8.
        upstream.latency_of = lambda: 0.02 * max(1.0, semaphore.active / 8) ** 2
        seen: list[int] = []

        async def watch() -> None:
            while True:
                seen.append(semaphore.limit)
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        try:
            await flood(client, 1500, 48)
        finally:
            watcher.cancel()
    late = seen[len(seen) // 2 :]
    assert 5 <= sum(late) / len(late) <= 13  # near 8, the knee, far from the ceiling of 32
    assert max(seen) <= 16


async def test_the_moving_limit_shows_in_gym_concurrency_limit(
    component: str, metrics: MetricsCapture
):
    app, upstream = adaptive_app(component, metrics.provider, max_concurrent=16, adaptive=ADAPTIVE)
    upstream.latency = 0.002

    def reported() -> int:
        values = metrics.values(CONCURRENCY_LIMIT_INSTRUMENT)
        mine = {(COMPONENT_ATTRIBUTE, component), (LIMIT_NAME_ATTRIBUTE, "upstream")}
        return next(v for k, v in values.items() if mine <= k)

    async with client_for(app) as client:
        await client.post("/v1/chat/completions", content=b"{}")
        assert reported() == 16
        upstream.status = 503
        await flood(client, 300, 24)
        assert reported() == limits_of(component)["upstream"].limit == 2


async def test_an_adaptive_refusal_names_its_bounds_not_a_fixed_size(component: str):
    bounds = {"min_concurrent": 1, "max_concurrent": 8}
    app, upstream = adaptive_app(component, max_concurrent=2, max_queue=0, adaptive=bounds)
    upstream.latency = 0.2
    async with client_for(app) as client:
        responses = await asyncio.gather(
            *(client.post("/v1/chat/completions", content=b"{}") for _ in range(4))
        )
    refused = [r for r in responses if r.status_code == 503]
    assert refused
    message = refused[0].json()["error"]["message"]
    assert message == "Limit 'upstream' (adaptive, 1..8) already has 0 requests queued."


# --- Retry-After: auto ---------------------------------------------------------------------


async def test_retry_after_auto_is_the_queue_ahead_at_the_drain_rate(component: str):
    """One slot, each request 0.2 s: releases at 5 a second. Eleven clients in a closed loop
    keep 10 queued; the request refused then waits behind 10 (and needs 1 more): about 2 s."""
    app, upstream = adaptive_app(
        component, max_concurrent=1, max_queue=10, retry_after_seconds="auto"
    )
    upstream.latency = 0.2
    stop = False

    async with client_for(app) as client:

        async def loop_client() -> None:
            while not stop:
                await client.post("/v1/chat/completions", content=b"{}")

        clients = [asyncio.create_task(loop_client()) for _ in range(11)]
        await asyncio.sleep(2.2)
        semaphore = limits_of(component)["upstream"]
        assert semaphore.queue_depth == 10
        refused = await client.post("/v1/chat/completions", content=b"{}")
        stop = True
        await asyncio.gather(*clients)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "queue_full"
    assert refused.headers["retry-after"] in ("2", "3")  # 11 / 5 s = 2.2 s, give or take
    # the openai profile says the same in milliseconds, for clients that read that first
    assert refused.headers["retry-after-ms"] == refused.headers["retry-after"] + "000"


async def test_retry_after_auto_with_nothing_released_yet_is_the_upper_clamp(component: str):
    app, upstream = adaptive_app(
        component, max_concurrent=1, max_queue=0, retry_after_seconds="auto"
    )
    upstream.latency = 0.3
    async with client_for(app) as client:
        held = asyncio.create_task(client.post("/v1/chat/completions", content=b"{}"))
        await asyncio.sleep(0.05)
        refused = await client.post("/v1/chat/completions", content=b"{}")
        await held
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "60"  # the queue does not move: try much later
    assert refused.headers.get_list("retry-after") == ["60"]  # one header, not two
    assert refused.headers.get_list("retry-after-ms") == ["60000"]
