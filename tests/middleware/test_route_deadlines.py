"""Deadlines through the middleware, over a real uvicorn: `RouteLimit.deadline` reads the
milliseconds a caller has left from a header; a request waits no longer than that, one whose
deadline is past is refused at once, and the app (and what it calls) sees what is left."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from pydantic import ValidationError
from servers import UvicornServer, eventually

from gym_concurrency.deadline import deadline_remaining
from tests.registry import limits_of


def deadline_app(component: str, release: list[bool], **route: Any) -> FastAPI:
    route = {"path": "/work", "limit_name": "work", "max_concurrent": 1, **route}
    settings = ConcurrencySettings(component=component, routes=[RouteLimit(**route)])
    app = FastAPI()

    @app.post("/work")
    async def work(request: Request) -> dict[str, Any]:
        while not release:  # noqa: ASYNC110 - released from the test's loop
            await asyncio.sleep(0.002)
        state = getattr(request.state, "gym_concurrency.deadline", None)
        loop_now = asyncio.get_running_loop().time()
        return {
            "state_left": None if state is None else state - loop_now,
            "remaining": deadline_remaining(),
            "own": deadline_remaining(60.0),
        }

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    return app


async def test_a_queued_request_waits_no_longer_than_its_deadline(component: str) -> None:
    release: list[bool] = []
    app = deadline_app(component, release, deadline="header:x-deadline-ms")
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            holder = asyncio.create_task(client.post("/work"))
            await eventually(lambda: limit.active == 1, "the first request to get in")
            started = time.monotonic()
            refused = await client.post("/work", headers={"x-deadline-ms": "200"})
            waited = time.monotonic() - started
            release.append(True)
            await holder
    assert refused.status_code == 503
    assert refused.json()["type"] == "urn:gym-concurrency:deadline-exceeded"
    assert 0.18 <= waited < 1.5
    assert (limit.admission_timeouts, limit.queue_depth, limit.active) == (1, 0, 0)


async def test_a_past_deadline_is_refused_even_with_a_free_slot(component: str) -> None:
    release = [True]
    app = deadline_app(component, release, deadline="header:x-deadline-ms")
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            refused = await client.post("/work", headers={"x-deadline-ms": "0"})
    assert refused.status_code == 503
    assert refused.json()["type"] == "urn:gym-concurrency:deadline-exceeded"
    assert (limit.admission_timeouts, limit.active) == (1, 0)


@pytest.mark.parametrize("value", ["-5", "1e3", "soon", "٣٠٠", "12345678901234"])
async def test_a_deadline_that_is_not_milliseconds_is_no_deadline(component: str, value: str):
    release = [True]
    app = deadline_app(component, release, deadline="header:x-deadline-ms")
    with UvicornServer(app) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            response = await client.post("/work", headers={"x-deadline-ms": value.encode()})
    assert response.status_code == 200
    assert response.json() == {"state_left": None, "remaining": None, "own": 60.0}


async def test_the_app_sees_what_is_left_of_the_deadline(component: str) -> None:
    release = [True]
    app = deadline_app(component, release, deadline="header:x-deadline-ms")
    with UvicornServer(app) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            answer = (await client.post("/work", headers={"x-deadline-ms": "5000"})).json()
    assert 3.0 < answer["state_left"] <= 5.0
    assert 3.0 < answer["remaining"] <= 5.0
    assert answer["own"] == answer["remaining"] or abs(answer["own"] - answer["remaining"]) < 0.1


async def test_hopeless_requests_are_refused_as_they_arrive(component: str) -> None:
    settings = ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path="/work", limit_name="work", max_concurrent=2, deadline="header:x-deadline-ms"
            )
        ],
    )
    app = FastAPI()

    @app.post("/work")
    async def work() -> dict[str, bool]:
        await asyncio.sleep(0.05)
        return {"ok": True}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:
            stop = False

            async def flood() -> None:
                while not stop:
                    await client.post("/work", headers={"x-deadline-ms": "60000"})

            flooders = [asyncio.create_task(flood()) for _ in range(30)]
            await asyncio.sleep(2.5)  # the hand-over rate is measured (~40 / s)
            started = time.monotonic()
            hopeless = await client.post("/work", headers={"x-deadline-ms": "100"})
            refused_after = time.monotonic() - started
            stop = True
            await asyncio.gather(*flooders)
    assert hopeless.status_code == 503
    assert hopeless.json()["type"] == "urn:gym-concurrency:deadline-exceeded"
    assert refused_after < 0.08  # ~28 ahead at ~40 / s: refused as it arrived, not at 0.1 s
    assert limit.admission_timeouts >= 1


def test_a_deadline_source_other_than_a_header_is_an_error() -> None:
    for value in ("query:deadline", "header:", "header:bad name"):
        with pytest.raises(ValidationError, match="must be 'header:<name>'"):
            RouteLimit(path="/w", limit_name="w", max_concurrent=1, deadline=value)
