"""ConcurrencyLimitMiddleware in process (httpx ASGITransport): admission, holding the slot,
the failure profiles, and which route a request is limited under."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from apps import Gate, make_app
from gym_concurrency.middleware import ConcurrencySettings, RouteLimit
from servers import eventually

from tests.registry import limits_of


def settings_for(component: str, *routes: dict[str, Any], **fields: Any) -> ConcurrencySettings:
    return ConcurrencySettings(
        component=component, routes=[RouteLimit(**r) for r in routes], **fields
    )


def limit(path: str = "/run", name: str = "episodes", **fields: Any) -> dict[str, Any]:
    return {"path": path, "limit_name": name, "max_concurrent": 1, **fields}


@pytest.fixture
async def serve(component: str) -> AsyncIterator[Any]:
    """serve(*route limits) -> (client, gate); the client is closed and the gate opened after."""
    opened: list[tuple[httpx.AsyncClient, Gate]] = []

    async def start(*routes: dict[str, Any], **fields: Any) -> tuple[httpx.AsyncClient, Gate]:
        app, gate = make_app(settings_for(component, *routes, **fields))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        opened.append((client, gate))
        return client, gate

    yield start
    for client, gate in opened:
        gate.open = True
        await client.aclose()


async def hold(client: httpx.AsyncClient, gate: Gate, path: str = "/run") -> asyncio.Task[Any]:
    """Start a request that the app holds until the gate opens; returns once it is inside."""
    inside = gate.inside
    task = asyncio.create_task(client.post(path, content=b"{}"))
    await eventually(lambda: gate.inside > inside, f"{path} to be inside the app")
    return task


PROBLEM_TIMEOUT = {
    "type": "urn:gym-concurrency:admission-timeout",
    "title": "Admission timed out",
    "status": 503,
    "detail": "No slot of limit 'episodes' (max_concurrent=1) became free within 0.05 s.",
    "limit_name": "episodes",
}
PROBLEM_SHED = {
    "type": "urn:gym-concurrency:queue-full",
    "title": "Admission queue full",
    "status": 503,
    "detail": "Limit 'episodes' (max_concurrent=1) already has 0 requests queued.",
    "limit_name": "episodes",
}


async def test_problem_profile_on_timeout(serve: Any, component: str):
    client, gate = await serve(limit(queue_timeout_seconds=0.05))
    first = await hold(client, gate)
    refused = await client.post("/run", content=b"{}")
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["retry-after"] == "1"
    assert "retry-after-ms" not in refused.headers  # only the openai profile sends it
    assert refused.json() == PROBLEM_TIMEOUT
    semaphore = limits_of(component)["episodes"]
    assert (semaphore.active, semaphore.admission_timeouts, semaphore.queue_depth) == (1, 1, 0)
    gate.open = True
    assert (await first).status_code == 200
    assert semaphore.active == 0
    assert gate.calls == {"/run": 1}


async def test_problem_profile_on_full_queue(serve: Any, component: str):
    client, gate = await serve(limit(max_queue=0, retry_after_seconds=7))
    first = await hold(client, gate)
    refused = await client.post("/run", content=b"{}")
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["retry-after"] == "7"
    assert refused.json() == PROBLEM_SHED
    assert limits_of(component)["episodes"].admission_shed == 1
    gate.open = True
    await first


async def test_full_queue_sheds_only_past_max_queue(serve: Any, component: str):
    client, gate = await serve(limit(max_queue=1))
    first = await hold(client, gate)
    queued = asyncio.create_task(client.post("/run", content=b"queued"))
    semaphore = limits_of(component)["episodes"]
    await eventually(lambda: semaphore.queue_depth == 1, "one request to queue")
    assert (await client.post("/run", content=b"{}")).status_code == 503
    gate.open = True
    assert (await first).status_code == 200
    assert (await queued).json() == {"path": "/run", "body": "queued"}
    assert (semaphore.admission_shed, semaphore.active, gate.calls["/run"]) == (1, 0, 2)


@pytest.mark.parametrize(
    ("fields", "reason", "code"),
    [
        ({"queue_timeout_seconds": 0.05}, "timeout", "admission_timeout"),
        ({"max_queue": 0}, "shed", "queue_full"),
    ],
)
async def test_openai_profile(serve: Any, fields: dict[str, Any], reason: str, code: str):
    client, gate = await serve(
        limit("/v1/chat/completions", "upstream", failure="openai", **fields)
    )
    first = await hold(client, gate, "/v1/chat/completions")
    refused = await client.post("/v1/chat/completions", json={"model": "m"})
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/json"
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["retry-after-ms"] == "1000"  # read first by the openai client
    detail = (
        "No slot of limit 'upstream' (max_concurrent=1) became free within 0.05 s."
        if reason == "timeout"
        else "Limit 'upstream' (max_concurrent=1) already has 0 requests queued."
    )
    assert refused.json() == {
        "error": {"message": detail, "type": "server_error", "param": None, "code": code}
    }
    gate.open = True
    await first


@pytest.mark.parametrize(
    ("request_body", "episode_id", "task_id"),
    [
        (b'{"episode_id": "ep-1", "task": {"task_id": "t-1"}, "task_id": "top"}', "ep-1", "t-1"),
        (b'{"episode_id": "ep-2", "task_id": 7}', "ep-2", 7),
        (b'{"episode_id": "ep-3", "task": {"prompt": "p"}}', "ep-3", None),
        (b'{"task": {"task_id": "t-4"}}', None, "t-4"),
        # Copied verbatim, whatever JSON value they are (NeMo Gym 0.7.0 sends objects).
        (b'{"episode_id": {"nested": 1}, "task_id": true}', {"nested": 1}, True),
        (
            b'{"episode_id": {"rollout_id": "r-1", "attempt": 2},'
            b' "task": {"task_id": {"taskset": "math:train", "task_id": "42"}}}',
            {"rollout_id": "r-1", "attempt": 2},
            {"taskset": "math:train", "task_id": "42"},
        ),
        (b'{"episode_id": 1e999, "task_id": ["a", 1.5]}', None, ["a", 1.5]),
        (b'{"episode_id": NaN, "task_id": "t"}', None, None),  # NaN is not JSON
        (b"[1, 2]", None, None),
        (b"not json", None, None),
        (b"", None, None),
        (b"\xff\xfe", None, None),
        (b"[" * 100_000, None, None),  # deeper than the JSON parser recurses
    ],
)
@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"queue_timeout_seconds": 0.05}, "Episode admission timed out"),
        ({"max_queue": 0}, "Episode admission queue full"),
    ],
)
async def test_episode_profile(
    serve: Any,
    request_body: bytes,
    episode_id: Any,
    task_id: Any,
    fields: dict[str, Any],
    reason: str,
):
    client, gate = await serve(limit(failure="episode", **fields))
    first = await hold(client, gate)
    refused = await client.post("/run", content=request_body)
    assert refused.status_code == 200
    assert refused.headers["content-type"] == "application/json"
    assert "retry-after" not in refused.headers
    assert refused.json() == {
        "episode_id": episode_id,
        "task_id": task_id,
        "result": None,
        "failure": {"failure_reason": reason, "terminal": False, "stage": "admission"},
    }
    gate.open = True
    await first


@pytest.mark.parametrize(
    ("fields", "retry_after"),
    [
        ({"queue_timeout_seconds": 2.5, "max_queue": 0}, "3"),
        ({"queue_timeout_seconds": 0.01, "max_queue": 0}, "1"),
        ({"queue_timeout_seconds": 4, "max_queue": 0, "retry_after_seconds": 0}, "0"),
        ({"max_queue": 0}, "1"),
    ],
)
async def test_retry_after(serve: Any, fields: dict[str, Any], retry_after: str):
    client, gate = await serve(limit(**fields))
    first = await hold(client, gate)
    refused = await client.post("/run", content=b"{}")
    assert (refused.status_code, refused.headers["retry-after"]) == (503, retry_after)
    gate.open = True
    await first


async def test_streaming_body_keeps_the_slot(serve: Any, component: str):
    client, gate = await serve(limit("/stream", queue_timeout_seconds=0.05))
    streaming = asyncio.create_task(client.get("/stream"))
    await eventually(lambda: gate.inside == 1, "the stream to send its first chunk")
    semaphore = limits_of(component)["episodes"]
    assert semaphore.active == 1
    assert (await client.get("/stream")).status_code == 503
    gate.open = True
    assert (await streaming).text == "first\nlast\n"
    assert semaphore.active == 0


async def test_app_exception_frees_the_slot(serve: Any, component: str):
    client, _ = await serve(limit("/fail", queue_timeout_seconds=0.05))
    for _ in range(3):
        with pytest.raises(RuntimeError, match="the app failed"):
            await client.post("/fail")
        assert limits_of(component)["episodes"].active == 0
    assert limits_of(component)["episodes"].admission_timeouts == 0


async def test_queued_body_is_replayed_to_the_app(serve: Any, component: str):
    # The body is larger than the buffer bound: the rest is read by the app itself.
    client, gate = await serve(limit(), max_queued_body_bytes=10)
    first = await hold(client, gate)
    body = b"x" * 100_000

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 7_000):
            yield body[start : start + 7_000]

    queued = asyncio.create_task(client.post("/run", content=chunks()))
    semaphore = limits_of(component)["episodes"]
    await eventually(lambda: semaphore.queue_depth == 1, "the request to queue")
    gate.open = True
    await first
    assert (await queued).json() == {"path": "/run", "body": body.decode()}
    assert semaphore.active == 0


async def test_cancelled_while_queued_leaves_the_queue(serve: Any, component: str):
    client, gate = await serve(limit())
    first = await hold(client, gate)
    queued = asyncio.create_task(client.post("/run", content=b"{}"))
    semaphore = limits_of(component)["episodes"]
    await eventually(lambda: semaphore.queue_depth == 1, "the request to queue")
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert (semaphore.queue_depth, semaphore.admission_cancelled, semaphore.active) == (0, 1, 1)
    gate.open = True
    await first
    assert semaphore.active == 0
    assert gate.calls == {"/run": 1}


@pytest.mark.parametrize("steps", range(8))
async def test_cancelled_just_after_admission_frees_the_slot(
    serve: Any, component: str, steps: int
):
    # The slot is handed to the queued request, which is cancelled `steps` event-loop steps
    # later: before it notices, while it stops watching the client, or once in the app.
    client, gate = await serve(limit())
    gate.open = True
    assert (await client.post("/run", content=b"{}")).status_code == 200  # builds the table
    semaphore = limits_of(component)["episodes"]
    await semaphore.acquire()  # the test holds the only slot
    queued = asyncio.create_task(client.post("/run", content=b"{}"))
    await eventually(lambda: semaphore.queue_depth == 1, "the request to queue")
    semaphore.release()
    for _ in range(steps):
        await asyncio.sleep(0)
    queued.cancel()
    await asyncio.gather(queued, return_exceptions=True)
    await eventually(lambda: semaphore.active == 0, "the slot to be freed")
    assert semaphore.queue_depth == 0
    assert (await client.post("/run", content=b"{}")).status_code == 200


async def test_cancelled_while_running_frees_the_slot(serve: Any, component: str):
    client, gate = await serve(limit())
    running = await hold(client, gate)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    semaphore = limits_of(component)["episodes"]
    assert (semaphore.active, semaphore.admission_cancelled) == (0, 0)
    gate.open = True
    assert (await client.post("/run", content=b"{}")).status_code == 200


async def test_only_configured_methods_are_limited(serve: Any, component: str):
    client, gate = await serve(limit(methods=["POST"], queue_timeout_seconds=0.05))
    first = await hold(client, gate)
    # PUT /run is a 405 from the router, not a request under the POST limit.
    assert (await client.put("/run")).status_code == 405
    assert (await client.post("/run", content=b"{}")).status_code == 503
    gate.open = True
    assert (await client.get("/run")).status_code == 200
    await first
    assert limits_of(component)["episodes"].admission_timeouts == 1


async def test_templated_path_limits_every_value(serve: Any, component: str):
    client, gate = await serve(limit("/episodes/{episode_id}", queue_timeout_seconds=0.05))
    first = await hold(client, gate, "/episodes/a")
    assert (await client.post("/episodes/b", content=b"{}")).status_code == 503
    # Not the template: a 404 from the router, never limited.
    assert (await client.post("/episodes/b/c", content=b"{}")).status_code == 404
    gate.open = True
    await first
    assert limits_of(component)["episodes"].admission_timeouts == 1


async def test_routes_sharing_a_limit_name_share_the_slots(serve: Any, component: str):
    client, gate = await serve(
        limit(queue_timeout_seconds=0.05), limit("/other", queue_timeout_seconds=0.05)
    )
    first = await hold(client, gate, "/other")
    assert (await client.post("/run", content=b"{}")).status_code == 503
    assert (await client.get("/health")).json() == {"ok": True}  # unlimited: passes
    gate.open = True
    await first
    assert list(limits_of(component)) == ["episodes"]


@pytest.mark.parametrize("path", ["/api/v2/run", "/sub/work"])
async def test_included_router_and_mounted_app_routes(serve: Any, component: str, path: str):
    client, gate = await serve(limit(path, queue_timeout_seconds=0.05))
    first = await hold(client, gate, path)
    assert limits_of(component)["episodes"].active == 1
    assert (await client.post(path, content=b"{}")).status_code == 503
    gate.open = True
    await first
    assert limits_of(component)["episodes"].active == 0


async def test_unlimited_routes_and_paths_under_a_mount_pass(serve: Any, component: str):
    client, gate = await serve(limit("/sub/work", queue_timeout_seconds=0.05))
    first = await hold(client, gate, "/sub/work")
    assert (await client.post("/sub/other", content=b"{}")).status_code == 404
    assert (await client.get("/health")).status_code == 200
    gate.open = True
    await first
    assert limits_of(component)["episodes"].admission_timeouts == 0


async def test_head_served_by_a_get_route_shares_its_limit(component: str):
    # Starlette serves HEAD with a GET route's endpoint: the same work, so the same limit.
    from fastapi import FastAPI, Request
    from gym_concurrency.middleware import ConcurrencyLimitMiddleware
    from starlette.responses import PlainTextResponse

    app = FastAPI()
    gate = asyncio.Event()

    async def page(request: Request) -> PlainTextResponse:
        await gate.wait()
        return PlainTextResponse("page")

    app.add_route("/page", page, methods=["GET"])
    settings = settings_for(component, limit("/page", methods=["GET"], max_queue=0))
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        held = asyncio.create_task(client.get("/page"))
        await eventually(lambda: gate_holders(component) == 1, "the GET to hold the slot")
        semaphore = limits_of(component)["episodes"]
        head = await client.head("/page")
        gate.set()
        assert (await held).status_code == 200
    assert head.status_code == 503
    assert semaphore.admission_shed == 1


def gate_holders(component: str) -> int:
    limits = limits_of(component)
    return limits["episodes"].active if "episodes" in limits else 0
