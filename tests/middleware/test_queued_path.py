"""The queued path, driven message by message through ASGI: a read in flight at admission is
handed to the app, bodies are held as bytes within their bounds, refusals that need a body wait
for it only so long, and a read that fails is not counted as a client leaving."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import tracemalloc
import weakref
from typing import Any

import pytest
from apps import make_app
from asgi_connection import Connection, http_scope, loop_steps, websocket_scope
from fastapi import FastAPI, Request
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    RouteLimit,
)
from servers import eventually

from tests.registry import limits_of


def settings_for(component: str, **route: Any) -> ConcurrencySettings:
    fields = {k: route.pop(k) for k in list(route) if k.startswith(("max_queued", "refusal"))}
    route = {"path": "/run", "limit_name": "episodes", "max_concurrent": 1, **route}
    return ConcurrencySettings(component=component, routes=[RouteLimit(**route)], **fields)


async def built(app: Any) -> None:
    """Serve one request so the middleware has compiled its route table (no lifespan here)."""
    warm = Connection(http_scope("/health", "GET"))
    await app(warm.scope, warm.receive, warm.send)
    assert warm.status == 200


def request_body(connection: Connection, body: bytes, chunk: int | None = None) -> None:
    chunk = chunk or max(1, len(body))
    for start in range(0, len(body), chunk):
        more = start + chunk < len(body)
        connection.put(
            {"type": "http.request", "body": body[start : start + chunk], "more_body": more}
        )


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 5])
async def test_a_read_in_flight_at_admission_reaches_the_app(component: str, steps: int):
    # The body arrives `steps` loop passes before the slot frees; a receive that had taken it
    # (behind an outer BaseHTTPMiddleware) must not be cancelled: the app gets the whole body.
    app, gate = make_app(settings_for(component, queue_timeout_seconds=10))
    gate.open = True
    await built(app)
    semaphore = limits_of(component)["episodes"]
    assert semaphore.try_acquire()
    queued = Connection(http_scope(), checkpoint=True)
    served = asyncio.create_task(app(queued.scope, queued.receive, queued.send))
    await eventually(lambda: semaphore.queue_depth == 1, "the request to queue")
    request_body(queued, b'{"episode_id": "e1"}')
    await loop_steps(steps)
    semaphore.release()
    await asyncio.wait_for(served, 5)
    assert queued.status == 200
    assert json.loads(queued.body)["body"] == '{"episode_id": "e1"}'
    assert queued.lost == 0
    assert (semaphore.active, semaphore.queue_depth, semaphore.admission_cancelled) == (0, 0, 0)


@pytest.mark.parametrize("steps", [0, 1, 3])
async def test_a_websocket_read_in_flight_at_admission_reaches_the_app(component: str, steps: int):
    app, _ = make_app(settings_for(component, path="/ws", queue_timeout_seconds=10))
    await built(app)
    semaphore = limits_of(component)["episodes"]
    assert semaphore.try_acquire()
    queued = Connection(websocket_scope(), checkpoint=True)
    queued.put({"type": "websocket.connect"})
    served = asyncio.create_task(app(queued.scope, queued.receive, queued.send))
    await eventually(lambda: semaphore.queue_depth == 1, "the websocket to queue")
    queued.put({"type": "websocket.receive", "text": "hello"})
    await loop_steps(steps)
    semaphore.release()
    await asyncio.wait_for(served, 5)
    texts = [m.get("text") for m in queued.sent if m["type"] == "websocket.send"]
    assert texts == ["admitted", "echo hello"]
    assert queued.lost == 0
    assert (semaphore.active, semaphore.queue_depth) == (0, 0)


async def test_a_trickled_body_is_held_as_bytes_not_messages(component: str):
    # 10 queued requests, each 10 kB sent one byte per message: memory held while they wait
    # stays within a small constant of the bytes (before: ~180x, one message dict per byte).
    size, requests = 10_000, 10
    app, gate = make_app(settings_for(component, queue_timeout_seconds=30))
    gate.open = True
    await built(app)
    semaphore = limits_of(component)["episodes"]
    assert semaphore.try_acquire()
    body = b"x" * size
    connections = [Connection(http_scope()) for _ in range(requests)]
    for connection in connections:
        request_body(connection, body, chunk=1)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        served = [asyncio.create_task(app(c.scope, c.receive, c.send)) for c in connections]
        await eventually(lambda: all(c.inbox.empty() for c in connections), "bodies read", 30)
        # What the inboxes held is gone now; what the queue holds is the bodies and its state.
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert semaphore.queue_depth == requests
    assert held < 2 * size * requests + 8_000 * requests, f"{held} bytes for {size * requests}"
    semaphore.release()
    await asyncio.wait_for(asyncio.gather(*served), 10)
    assert all(json.loads(c.body)["body"] == body.decode() for c in connections)


async def test_queued_bodies_stop_being_read_past_the_total_bound(component: str):
    # Past max_queued_body_bytes_total a queued request reads no more (its client is held
    # back); admitted in turn, each app still gets its whole body.
    chunk, chunks, requests, total = 1_000, 60, 5, 100_000
    app, gate = make_app(
        settings_for(component, queue_timeout_seconds=30, max_queued_body_bytes_total=total)
    )
    gate.open = True
    await built(app)
    semaphore = limits_of(component)["episodes"]
    assert semaphore.try_acquire()
    body = b"0123456789" * (chunk * chunks // 10)
    connections = [Connection(http_scope()) for _ in range(requests)]
    for connection in connections:
        request_body(connection, body, chunk=chunk)
    served = [asyncio.create_task(app(c.scope, c.receive, c.send)) for c in connections]
    await eventually(lambda: semaphore.queue_depth == requests, "every request to queue")
    await loop_steps(50)
    read = sum(c.receives for c in connections) * chunk
    assert total <= read <= total + requests * chunk
    assert sum(c.inbox.qsize() for c in connections) > 0  # the rest waits with the client
    semaphore.release()
    await asyncio.wait_for(asyncio.gather(*served), 10)
    assert [json.loads(c.body)["body"] for c in connections] == [body.decode()] * requests
    assert (semaphore.active, semaphore.queue_depth, semaphore.admission_cancelled) == (0, 0, 0)


@pytest.mark.parametrize("route", [{"max_queue": 0}, {"queue_timeout_seconds": 0.05}])
async def test_an_episode_refusal_waits_for_an_unfinished_body_only_so_long(
    component: str, route: dict[str, Any]
):
    app, _ = make_app(
        settings_for(component, failure="episode", refusal_body_timeout_seconds=0.3, **route)
    )
    await built(app)
    semaphore = limits_of(component)["episodes"]
    assert semaphore.try_acquire()
    slow = Connection(http_scope())
    slow.put({"type": "http.request", "body": b'{"episode_id": "e1", ', "more_body": True})
    started = time.monotonic()
    await asyncio.wait_for(app(slow.scope, slow.receive, slow.send), 5)
    took = time.monotonic() - started
    assert 0.25 <= took < 3, took
    answer = json.loads(slow.body)
    assert slow.status == 200
    assert (answer["episode_id"], answer["task_id"]) == (None, None)
    assert answer["failure"]["stage"] == "admission"
    assert (semaphore.active, semaphore.queue_depth) == (1, 0)
    semaphore.release()


async def test_an_episode_refusal_echoes_a_body_that_arrives_in_pieces(component: str):
    app, _ = make_app(settings_for(component, failure="episode", max_queue=0))
    await built(app)
    semaphore = limits_of(component)["episodes"]
    assert semaphore.try_acquire()
    refused = Connection(http_scope())
    served = asyncio.create_task(app(refused.scope, refused.receive, refused.send))
    ids = b'{"episode_id": {"rollout_id": "r", "attempt": 3}, "task_id": {"taskset": "t"}}'
    for byte in range(len(ids)):
        refused.put(
            {"type": "http.request", "body": ids[byte : byte + 1], "more_body": byte + 1 < len(ids)}
        )
        await loop_steps(1)
    await asyncio.wait_for(served, 5)
    answer = json.loads(refused.body)
    assert answer["episode_id"] == {"rollout_id": "r", "attempt": 3}
    assert answer["task_id"] == {"taskset": "t"}
    semaphore.release()


async def test_a_body_the_app_refuses_as_too_large_is_not_counted_as_a_client_leaving(
    component: str,
):
    # FastAPI's own max_body_size (outside our middleware) raises from receive() while the
    # request is queued: the client gets FastAPI's 413 at once, and nobody "cancelled".
    app = FastAPI(max_body_size=100)

    @app.post("/run")
    async def run(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    app.add_middleware(
        ConcurrencyLimitMiddleware, settings=settings_for(component, queue_timeout_seconds=10)
    )
    await built(app)
    semaphore = limits_of(component)["episodes"]
    assert semaphore.try_acquire()
    large = Connection(http_scope())
    request_body(large, b"z" * 1_000, chunk=50)
    await asyncio.wait_for(app(large.scope, large.receive, large.send), 5)
    assert large.status == 413
    assert (semaphore.queue_depth, semaphore.admission_cancelled) == (0, 0)
    semaphore.release()
    small = Connection(http_scope())
    request_body(small, b"{}")
    await asyncio.wait_for(app(small.scope, small.receive, small.send), 5)
    assert (small.status, json.loads(small.body)) == (200, {"size": 2})
    assert semaphore.active == 0


async def test_a_client_that_leaves_while_queued_leaves_at_once_and_is_counted_once(
    component: str,
):
    app, _ = make_app(settings_for(component, queue_timeout_seconds=10))
    await built(app)
    semaphore = limits_of(component)["episodes"]
    assert semaphore.try_acquire()
    leaving = Connection(http_scope())
    request_body(leaving, b"{}")
    served = asyncio.create_task(app(leaving.scope, leaving.receive, leaving.send))
    await eventually(lambda: semaphore.queue_depth == 1, "the request to queue")
    leaving.put({"type": "http.disconnect"})
    await asyncio.wait_for(served, 5)
    assert leaving.sent == []
    assert (semaphore.queue_depth, semaphore.admission_cancelled, semaphore.active) == (0, 1, 1)
    semaphore.release()
    assert semaphore.active == 0


@pytest.mark.parametrize(
    ("close", "header"), [(None, b"close"), (True, b"close"), (False, None)], ids=str
)
async def test_refusals_close_the_connection_unless_told_not_to(
    component: str, close: bool | None, header: bytes | None
):
    # By default: a client that sends again at once must reconnect first (goodput under a
    # flood, docs/performance.md); False keeps the connection for clients that back off.
    options = {} if close is None else {"close_connection_on_refusal": close}
    settings = ConcurrencySettings(
        component=component,
        routes=[RouteLimit(path="/run", limit_name="episodes", max_concurrent=1, max_queue=0)],
        **options,
    )
    app, _ = make_app(settings)
    await built(app)
    semaphore = limits_of(component)["episodes"]
    assert semaphore.try_acquire()
    refused = Connection(http_scope())
    request_body(refused, b"{}")
    await app(refused.scope, refused.receive, refused.send)
    assert refused.status == 503
    assert refused.headers().get(b"connection") == header
    semaphore.release()


async def test_a_queued_request_is_freed_without_the_cycle_collector(component: str):
    # The read left watching for a disconnect is cancelled once the response is out (a
    # server that never answers it); nothing of the request may then be kept in a reference
    # cycle that only the collector frees: the connection goes as its last reference does.
    app, gate = make_app(settings_for(component, queue_timeout_seconds=10))
    gate.open = True
    await built(app)
    semaphore = limits_of(component)["episodes"]
    gc.disable()
    try:
        assert semaphore.try_acquire()
        queued = Connection(http_scope())
        request_body(queued, b'{"n": 1}')
        served = asyncio.create_task(app(queued.scope, queued.receive, queued.send))
        await loop_steps(5)
        semaphore.release()
        await served
        await loop_steps(3)
        assert queued.status == 200
        gone = weakref.ref(queued)
        del queued, served
        assert gone() is None
    finally:
        gc.enable()
