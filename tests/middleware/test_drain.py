"""Draining on shutdown: a real SIGTERM to a real uvicorn under a flood answers every queued
request at once with the documented 503 (never uvicorn's 500), lets admitted ones finish, and
refuses what arrives meanwhile; `drain()` called by hand does the same."""

from __future__ import annotations

import asyncio
import re
import signal
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    RouteLimit,
    concurrency_middleware,
)
from gym_concurrency.middleware.failures import DRAINING_DETAIL, RouteFailures
from servers import UvicornServer, eventually

from tests.registry import limits_of
from tests.uvicorn_process import clean_env, uvicorn

DOC = (Path(__file__).resolve().parents[2] / "docs" / "shutdown.md").read_text()
APP = textwrap.dedent(
    """
    import asyncio
    from fastapi import FastAPI
    from gym_concurrency.middleware import ConcurrencyLimitMiddleware
    from gym_concurrency.limits import registered_limits

    app = FastAPI()

    @app.post("/run")
    async def run() -> dict:
        await asyncio.sleep(0.5)
        return {"ok": True}

    @app.get("/queued")
    async def queued() -> dict:
        return {"queued": sum(l.queue_depth for l in registered_limits())}

    app.add_middleware(ConcurrencyLimitMiddleware)
    """
)


@pytest.mark.parametrize("failure", ["problem", "episode"])
async def test_sigterm_under_a_flood_answers_every_queued_request(
    tmp_path: Path, failure: str
) -> None:
    (tmp_path / "drainapp.py").write_text(APP)
    env = clean_env(
        GYM_CONCURRENCY_ROUTES__0__PATH="/run",
        GYM_CONCURRENCY_ROUTES__0__LIMIT_NAME="episodes",
        GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT="4",
        GYM_CONCURRENCY_ROUTES__0__FAILURE=failure,
    )
    with uvicorn(tmp_path, "drainapp:app", env, "--timeout-graceful-shutdown", "3") as server:
        server.wait_serving("/queued")
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(base_url=server.url, timeout=20, limits=limits) as client:

            async def call() -> tuple[int, str, float]:
                response = await client.post("/run", json={"episode_id": "e"})
                return response.status_code, response.text, time.monotonic()

            calls = [asyncio.create_task(call()) for _ in range(200)]
            queued = 0
            while queued < 150:
                await asyncio.sleep(0.05)
                queued = (await client.get("/queued")).json()["queued"]
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            results = await asyncio.gather(*calls, return_exceptions=True)
        status = server.exit_status()
        log = server.log
    # uvicorn (>= 0.29) re-raises the signal it caught once it has shut down cleanly.
    assert status in (0, -signal.SIGTERM), log
    assert "Application shutdown complete" in log
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []  # no hung or dropped connection
    answered = [r for r in results if not isinstance(r, BaseException)]
    assert 500 not in {code for code, _, _ in answered}, log
    served = [r for r in answered if '"ok"' in r[1]]
    refused = [r for r in answered if "draining" in r[1]]
    assert len(served) + len(refused) == 200
    assert 4 <= len(served) <= 12  # those admitted before the signal finished
    assert {code for code, _, _ in refused} == ({503} if failure == "problem" else {200})
    assert max(at for _, _, at in refused) - signalled < 1.0
    assert "draining (shutting down): " in log


async def test_drain_by_hand_refuses_queued_and_new_requests_and_waits(component: str) -> None:
    settings = ConcurrencySettings(
        component=component,
        routes=[RouteLimit(path="/run", limit_name="episodes", max_concurrent=1)],
    )
    app = FastAPI()
    release = asyncio.Event()

    @app.post("/run")
    async def run() -> dict[str, bool]:
        await release.wait()
        return {"ok": True}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        first = asyncio.create_task(client.post("/run"))
        await eventually(lambda: component in str(limits_of(component)), "the limit")
        limit = limits_of(component)["episodes"]
        await eventually(lambda: limit.active == 1, "the first request to run")
        second = asyncio.create_task(client.post("/run"))
        await eventually(lambda: limit.queue_depth == 1, "the second to queue")
        middleware = app.state.gym_concurrency
        drained = asyncio.create_task(middleware.drain(5))
        refused = await second
        late = await client.post("/run")
        assert not drained.done()  # the admitted request is still running
        release.set()
        assert (await first).status_code == 200
        assert await drained is True
    for response in (refused, late):
        assert response.status_code == 503
        assert response.json()["detail"] == DRAINING_DETAIL
        assert response.headers["retry-after"] == "1"
    assert (limit.active, limit.queue_depth, limit.admission_cancelled) == (0, 0, 0)


async def test_drain_gives_up_after_its_timeout(component: str) -> None:
    settings = ConcurrencySettings(
        component=component,
        routes=[RouteLimit(path="/run", limit_name="episodes", max_concurrent=1)],
    )
    app = FastAPI()
    forever = asyncio.Event()

    @app.post("/run")
    async def run() -> None:
        await forever.wait()

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        stuck = asyncio.create_task(client.post("/run"))
        await eventually(lambda: "episodes" in limits_of(component), "the limit")
        await eventually(lambda: limits_of(component)["episodes"].active == 1, "the request")
        started = time.monotonic()
        assert await app.state.gym_concurrency.drain(0.2) is False
        assert 0.15 < time.monotonic() - started < 2
        stuck.cancel()


async def test_the_docs_drain_route_works() -> None:
    [block] = re.findall(r"```python\n(.*?)```", DOC, re.DOTALL)
    namespace: dict[str, object] = {}
    exec(compile(block, "docs/shutdown.md", "exec"), namespace)
    app = namespace["app"]
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.post("/admin/drain")).json() == {"finished": True}


def test_the_docs_transcript_is_the_draining_body() -> None:
    [transcript] = re.findall(r"```text\n(.*?)```", DOC, re.DOTALL)
    route = RouteLimit(path="/run", limit_name="episodes", max_concurrent=1)
    body = RouteFailures(route).body("unavailable", draining=True).decode()
    assert transcript.rstrip().endswith(body)


def drain_app(component: str, release: list[bool], **route: object) -> FastAPI:
    """A route whose weight (and flow) come from the request, held until `release`."""
    settings = ConcurrencySettings(
        component=component,
        routes=[RouteLimit(path="/work", limit_name="work", **route)],  # type: ignore[arg-type]
    )
    app = FastAPI()

    @app.post("/work")
    async def work(request: Request) -> dict[str, bool]:
        await request.body()
        while not release:  # noqa: ASYNC110 - released from the test's loop
            await asyncio.sleep(0.005)
        return {"ran": True}

    @app.post("/drain")
    async def drain(request: Request) -> dict[str, bool]:
        asyncio.get_running_loop().create_task(concurrency_middleware(request.app).drain(5))
        return {"draining": True}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    return app


async def test_a_request_reading_its_body_ahead_when_draining_starts_is_refused(
    component: str,
) -> None:
    release: list[bool] = []
    app = drain_app(component, release, max_concurrent=1, weight="json:n")
    gate = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield b'{"n": '
        await gate.wait()
        yield b"1}"

    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            holder = asyncio.create_task(client.post("/work", json={"n": 1}))
            await eventually(lambda: limit.active == 1, "the holder to get in")
            reading = asyncio.create_task(client.post("/work", content=slow_body()))
            await asyncio.sleep(0.3)  # its body is being read ahead: not queued yet
            await client.post("/drain")
            gate.set()
            refused = await reading
            release.append(True)
            assert (await holder).status_code == 200
    assert refused.status_code == 503
    assert refused.json()["detail"] == DRAINING_DETAIL
    assert (limit.active, limit.queue_depth) == (0, 0)


async def test_draining_hands_nothing_over_to_a_waiter_behind_one_refused(component: str):
    release: list[bool] = []
    app = drain_app(component, release, max_concurrent=4, weight="json:n", flow="header:x-t")
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:

            def post(n: int, tenant: str) -> asyncio.Task[httpx.Response]:
                request = client.post("/work", json={"n": n}, headers={"x-t": tenant})
                return asyncio.create_task(request)

            holder = post(2, "a")
            await eventually(lambda: limit.active == 2, "the holder to get in")
            heavy = post(3, "b")  # chosen next: the free capacity is held for it
            await eventually(lambda: limit.queue_depth == 1, "the heavy one to queue")
            light = post(1, "c")
            await eventually(lambda: limit.queue_depth == 2, "the light one to queue")
            await client.post("/drain")
            answers = await asyncio.gather(heavy, light)
            active_while_draining = limit.active
            release.append(True)
            await holder
    assert [a.status_code for a in answers] == [503, 503]
    assert active_while_draining == 2  # nothing admitted once draining began
