"""A request refused for its own deadline (`RouteLimit.deadline`) is its own outcome, over a
real uvicorn: its own body in every failure profile (as docs/failure-responses.md shows), its
own queue-wait outcome `deadline`, counted once as a timeout, and a Retry-After that is not
the queue timeout (docs/deadlines.md)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from apps import make_app
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from servers import UvicornServer, eventually
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.metrics_capture import MetricsCapture
from tests.registry import limits_of

FAILURE_DOC = Path(__file__).parents[2] / "docs" / "failure-responses.md"
DEADLINE = "header:x-envoy-expected-rq-timeout-ms"
LIMIT = "'work' (max_concurrent=1)"
DETAIL = (
    f"The request's deadline passed, or could not be met, before a slot of limit {LIMIT} "
    "became free."
)
EPISODE = {"episode_id": "ep-1", "task": {"task_id": "t-1"}}
EXPECTED: dict[str, tuple[int, dict[str, Any]]] = {
    "problem": (
        503,
        {
            "type": "urn:gym-concurrency:deadline-exceeded",
            "title": "Admission deadline exceeded",
            "status": 503,
            "detail": DETAIL,
            "limit_name": "work",
        },
    ),
    "openai": (
        503,
        {
            "error": {
                "message": DETAIL,
                "type": "server_error",
                "param": None,
                "code": "deadline_exceeded",
            }
        },
    ),
    "episode": (
        200,
        {
            "episode_id": "ep-1",
            "task_id": "t-1",
            "result": None,
            "failure": {
                "failure_reason": "Episode admission deadline exceeded",
                "terminal": False,
                "stage": "admission",
            },
        },
    ),
}


def documented(body: dict[str, Any]) -> bool:
    """Whether `body` is one of the failure bodies docs/failure-responses.md shows (its ids,
    detail and limit name aside: they come from the request and the route)."""
    varying = {"episode_id", "task_id", "detail", "message", "limit_name"}

    def same(doc: Any, actual: Any) -> bool:
        if isinstance(doc, dict):
            return (
                isinstance(actual, dict)
                and doc.keys() == actual.keys()
                and all(k in varying or same(doc[k], actual[k]) for k in doc)
            )
        return bool(doc == actual)

    text = FAILURE_DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```json\s*\n(.*?)```", text, flags=re.DOTALL)
    return any(same(json.loads(block), body) for block in blocks)


def held_app(component: str, held: asyncio.Event, meter_provider: Any = None, **route: Any):  # type: ignore[no-untyped-def]
    """One route, /work, of one slot, whose requests wait until `held` is set."""
    route = {"path": "/work", "limit_name": "work", "max_concurrent": 1, **route}
    settings = ConcurrencySettings(
        component=component, server_name="env_1", routes=[RouteLimit(**route)]
    )
    app = FastAPI()

    @app.post("/work")
    async def work() -> dict[str, bool]:
        while not held.is_set():  # noqa: ASYNC110 - set from the test's loop
            await asyncio.sleep(0.002)
        return {"ok": True}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings, meter_provider=meter_provider)
    return app


@pytest.mark.parametrize("profile", ["problem", "openai", "episode"])
async def test_a_deadline_refusal_has_its_own_body_outcome_and_retry_after(
    component: str, metrics: MetricsCapture, profile: str
) -> None:
    released = asyncio.Event()
    app = held_app(
        component,
        released,
        metrics.provider,
        failure=profile,
        deadline=DEADLINE,
        queue_timeout_seconds=30,
    )
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            holder = asyncio.create_task(client.post("/work", json=EPISODE))
            await eventually(lambda: limit.active == 1, "the first request to get in")
            started = time.monotonic()
            queued = await client.post(
                "/work", json=EPISODE, headers={"x-envoy-expected-rq-timeout-ms": "200"}
            )
            waited = time.monotonic() - started
            past = await client.post(
                "/work", json=EPISODE, headers={"x-envoy-expected-rq-timeout-ms": "0"}
            )
            released.set()
            assert (await holder).status_code == 200
    status, body = EXPECTED[profile]
    for refused in (queued, past):
        assert refused.status_code == status
        assert refused.json() == body
        assert documented(refused.json()), f"not in docs/failure-responses.md: {refused.json()}"
        if profile == "episode":
            assert "retry-after" not in refused.headers
        else:  # never the queue timeout (30 s): it says nothing of when the queue frees
            assert refused.headers["retry-after"] == "1"
    if profile == "openai":
        assert queued.headers["retry-after-ms"] == "1000"
    assert 0.18 <= waited < 1.5
    # Counted once each, as a timeout; recorded under their own outcome.
    assert (limit.admission_timeouts, limit.queue_depth, limit.active) == (2, 0, 0)
    waits = metrics.values("gym.concurrency.queue_wait_duration_ms")
    counts = {dict(k)["nemo.gym.concurrency.admission_outcome"]: p.count for k, p in waits.items()}
    assert counts == {"admitted": 1, "deadline": 2}
    timeouts = metrics.values("gym.concurrency.admission_timeouts_total")
    ours = [v for k, v in timeouts.items() if ("nemo.gym.concurrency.component", component) in k]
    assert ours == [2]


async def test_a_configured_retry_after_is_what_a_deadline_refusal_says(component: str) -> None:
    released = asyncio.Event()
    app = held_app(
        component, released, deadline=DEADLINE, queue_timeout_seconds=30, retry_after_seconds=7
    )
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            holder = asyncio.create_task(client.post("/work"))
            await eventually(lambda: limit.active == 1, "the first request to get in")
            refused = await client.post("/work", headers={"x-envoy-expected-rq-timeout-ms": "50"})
            released.set()
            await holder
    assert refused.json()["type"] == "urn:gym-concurrency:deadline-exceeded"
    assert refused.headers["retry-after"] == "7"


async def test_a_hopeless_request_is_told_when_the_queue_will_have_cleared(
    component: str, metrics: MetricsCapture
) -> None:
    # Two slots held 0.2 s each: 10 hand-overs a second; ~28 queued ahead is ~3 s.
    settings = ConcurrencySettings(
        component=component,
        routes=[RouteLimit(path="/work", limit_name="work", max_concurrent=2, deadline=DEADLINE)],
    )
    app = FastAPI()

    @app.post("/work")
    async def work() -> dict[str, bool]:
        await asyncio.sleep(0.2)
        return {"ok": True}

    app.add_middleware(
        ConcurrencyLimitMiddleware, settings=settings, meter_provider=metrics.provider
    )
    header = "x-envoy-expected-rq-timeout-ms"
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            stop = False

            async def flood() -> None:
                while not stop:
                    await client.post("/work", headers={header: "60000"})

            flooders = [asyncio.create_task(flood()) for _ in range(30)]
            await asyncio.sleep(2.6)  # the hand-over rate is measured, and trusted
            started = time.monotonic()
            hopeless = await client.post("/work", headers={header: "100"})
            refused_after = time.monotonic() - started
            ahead = limit.queue_depth
            stop = True
            await asyncio.gather(*flooders)
    assert hopeless.json()["type"] == "urn:gym-concurrency:deadline-exceeded"
    assert refused_after < 0.08  # refused as it arrived
    assert ahead >= 20
    assert 2 <= int(hopeless.headers["retry-after"]) <= 6  # not 1: the queue's measured drain
    # No queue timeout, yet its refusal is counted and exported as a timeout.
    timeouts = metrics.values("gym.concurrency.admission_timeouts_total")
    ours = [v for k, v in timeouts.items() if ("nemo.gym.concurrency.component", component) in k]
    assert ours == [limit.admission_timeouts]
    assert limit.admission_timeouts >= 1


def test_a_websocket_refused_for_its_deadline_closes_with_1013(component: str) -> None:
    settings = ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path="/ws",
                limit_name="sockets",
                max_concurrent=1,
                queue_timeout_seconds=30,
                deadline=DEADLINE,
            )
        ],
    )
    app, _ = make_app(settings)
    with TestClient(app) as client, client.websocket_connect("/ws") as first:
        assert first.receive_text() == "admitted"
        headers = {"x-envoy-expected-rq-timeout-ms": "50"}
        with (
            client.websocket_connect("/ws", headers=headers) as second,
            pytest.raises(WebSocketDisconnect) as closed,
        ):
            second.receive_text()
        assert (closed.value.code, closed.value.reason) == (1013, "admission deadline exceeded")
        assert limits_of(component)["sockets"].admission_timeouts == 1
        first.send_text("bye")
