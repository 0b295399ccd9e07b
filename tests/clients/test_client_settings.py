"""Client limits in the settings (`ConcurrencySettings.clients`): from code, environment and
file, errors that name the field, the configured client an app gets by name (a real uvicorn
server whose route calls a real upstream through it), the status view, reload and resize, and
`scope: global` on a real redis-server."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from gym_concurrency.middleware import (
    AdaptiveLimit,
    ClientLimit,
    ClientRetry,
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    RouteLimit,
    limited_client,
    reload_settings,
    status_snapshot,
)

from gym_concurrency import SharedLimit
from gym_concurrency.clients import RetryPolicy
from tests.clients.upstream import Reply, Upstream
from tests.servers import UvicornServer
from tests.shared.redis_server import RedisServer


def test_from_the_environment_and_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__0__LIMIT_NAME", "judge")
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__0__MAX_CONCURRENT", "16")
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__0__RETRY__MAX_ATTEMPTS", "2")
    (client,) = ConcurrencySettings().clients
    assert (client.limit_name, client.max_concurrent) == ("judge", 16)
    assert client.retry is not None
    assert client.retry.policy() == RetryPolicy(max_attempts=2)
    monkeypatch.delenv("GYM_CONCURRENCY_CLIENTS__0__RETRY__MAX_ATTEMPTS")
    path = tmp_path / "limits.yaml"
    path.write_text(
        "clients:\n"
        "  - {limit_name: judge, max_concurrent: 4, timeout_seconds: 30, retry: null}\n"
        "  - limit_name: policy_model\n"
        "    max_concurrent: 64\n"
        "    adaptive: {min_concurrent: 8, max_concurrent: 256}\n"
        "    retry: {budget_ratio: 0.1, deadline_seconds: 600}\n"
    )
    judge, model = ConcurrencySettings.from_file(path).clients
    assert (judge.max_concurrent, judge.retry) == (16, None)  # the variable wins over the file
    assert model.retry == ClientRetry(budget_ratio=0.1, deadline_seconds=600)
    assert model.adaptive == AdaptiveLimit(min_concurrent=8, max_concurrent=256)


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"clients": [{"limit_name": "j", "max_concurrent": 0}]}, "clients.0.max_concurrent"),
        (
            {"clients": [{"limit_name": "j", "max_concurrent": 1, "retry": {"max_attempts": 0}}]},
            "clients.0.retry.max_attempts",
        ),
        (
            {"clients": [{"limit_name": "j", "max_concurrent": 1}] * 2},
            "clients.1.limit_name: 'j' is configured twice",
        ),
        (
            {
                "routes": [{"path": "/run", "limit_name": "j", "max_concurrent": 1}],
                "clients": [{"limit_name": "j", "max_concurrent": 1}],
            },
            "clients.0.limit_name: 'j' is also a route or operation limit_name",
        ),
        (
            {"clients": [{"limit_name": "j", "max_concurrent": 1, "scope": "global"}]},
            "clients.0.scope: limit 'j' is global, which needs redis_url",
        ),
        (
            {
                "clients": [
                    {
                        "limit_name": "j",
                        "max_concurrent": 100,
                        "adaptive": {"min_concurrent": 1, "max_concurrent": 10},
                    }
                ]
            },
            "max_concurrent: an adaptive limit starts at max_concurrent",
        ),
    ],
)
def test_a_bad_client_limit_fails_naming_the_field(settings: dict[str, Any], names: str):
    with pytest.raises(ValueError, match=re.escape(names)):
        ConcurrencySettings(**settings)


def judge_app(settings: ConcurrencySettings, upstream_url: str) -> FastAPI:
    """A resources server whose /verify calls the judge through the configured client."""
    app = FastAPI()
    clients: dict[str, httpx.AsyncClient] = {}
    app.state.clients = clients  # dropped by the test (they live on uvicorn's loop)

    @app.post("/verify")
    async def verify(request: Request) -> dict[str, Any]:
        client = clients.get("judge")
        if client is None:  # made once, on first use (the middleware has started by then)
            judge = limited_client(request.app, "judge")
            client = clients["judge"] = httpx.AsyncClient(
                base_url=upstream_url, transport=judge.transport()
            )
        response = await client.post("/judge", content=await request.body())
        return {"status": response.status_code, "attempt": response.json()["attempt"]}

    @app.post("/reload")  # a test's own route: reload runs on the server's loop
    async def reload(request: Request) -> dict[str, Any]:
        try:
            return {"changes": reload_settings(request.app, request.app.state.next_settings)}
        except ValueError as error:
            return {"error": str(error)}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    return app


def with_judge(name: str, **judge: Any) -> ConcurrencySettings:
    config = {"limit_name": "judge", "max_concurrent": 2, **judge}
    return ConcurrencySettings(
        component=name,
        routes=[RouteLimit(path="/verify", limit_name="verify", max_concurrent=64)],
        clients=[ClientLimit(**config)],
    )


@pytest.fixture
async def served_app(upstream: Upstream, name: str) -> AsyncIterator[tuple[FastAPI, str]]:
    app = judge_app(with_judge(name, retry={"backoff_seconds": 0.01}), upstream.url)
    with UvicornServer(app) as server:
        yield app, server.url


async def test_an_app_calls_through_its_configured_client_limit(
    upstream: Upstream, served_app: tuple[FastAPI, str], name: str
):
    _, url = served_app
    upstream.script("/judge", Reply(503, {"retry-after-ms": "50"}), *[Reply(delay=0.2)] * 6)
    async with httpx.AsyncClient(base_url=url, timeout=10) as caller:
        answers = await asyncio.gather(*(caller.post("/verify", content=b"x") for _ in range(6)))
    assert [a.json()["status"] for a in answers] == [200] * 6
    assert upstream.max_active == 2  # the client limit, not the route's 64
    assert len(upstream.attempts("/judge")) == 7  # one 503, retried
    rows = status_snapshot()["limits"]
    (row,) = [r for r in rows if (r["component"], r["limit_name"]) == (name, "judge")]
    assert (row["limit"], row["active"]) == (2, 0)  # shown like any limit


async def test_reload_resizes_the_limit_and_retries_by_the_new_policy(
    upstream: Upstream, served_app: tuple[FastAPI, str], name: str
):
    app, url = served_app
    async with httpx.AsyncClient(base_url=url, timeout=10) as caller:
        assert (await caller.post("/verify", content=b"x")).json()["status"] == 200
        judge = limited_client(app, "judge")
        app.state.next_settings = with_judge(name, max_concurrent=3, retry=None)
        changes = (await caller.post("/reload")).json()["changes"]
        assert changes[0] == "client limit 'judge': 2 -> 3"
        assert re.fullmatch(r"client limit 'judge': retry \{.*\} -> None", changes[1])
        assert judge.limit.limit == 3
        upstream.script("/judge", Reply(503, {"retry-after-ms": "1"}))
        answer = (await caller.post("/verify", content=b"x")).json()
        assert answer["status"] == 503  # not retried now: the transport made earlier follows
        assert limited_client(app, "judge") is judge  # the same client, kept by the reload
        app.state.next_settings = with_judge(name, max_concurrent=3, timeout_seconds=5)
        error = (await caller.post("/reload")).json()["error"]
        assert error.startswith("clients.0.timeout_seconds: limit 'judge' is running with")
        # Its fallback size is fixed too: a reload that changed it would be logged, not made.
        app.state.next_settings = with_judge(name, max_concurrent=3, local_max_concurrent=2)
        error = (await caller.post("/reload")).json()["error"]
        assert error.startswith("clients.0.local_max_concurrent: limit 'judge' is running with")
        assert judge.limit.limit == 3


async def test_a_global_client_limit_spans_two_servers(
    upstream: Upstream, redis_server: RedisServer, name: str
):
    settings = ConcurrencySettings(
        component=name,
        redis_url=redis_server.url,
        routes=[RouteLimit(path="/verify", limit_name="verify", max_concurrent=64)],
        clients=[ClientLimit(limit_name="judge", max_concurrent=2, scope="global")],
    )
    upstream.script("/judge", *[Reply(delay=0.2)] * 8)
    first, second = judge_app(settings, upstream.url), judge_app(settings, upstream.url)
    with UvicornServer(first) as a, UvicornServer(second) as b:
        async with httpx.AsyncClient(timeout=10) as caller:
            answers = await asyncio.gather(
                *(caller.post(f"{s.url}/verify", content=b"x") for s in (a, b) for _ in range(4))
            )
        assert [r.json()["status"] for r in answers] == [200] * 8
        assert upstream.max_active == 2
        assert isinstance(limited_client(first, "judge").limit, SharedLimit)
    for app in (first, second):
        app.state.clients.clear()


async def test_a_configured_client_limit_makes_transports_with_a_weight_and_flow(
    upstream: Upstream, served_app: tuple[FastAPI, str]
):
    app, _ = served_app
    judge = limited_client(app, "judge")  # the app has started: served_app built it
    upstream.script("/judge", Reply(delay=0.3))
    transport = judge.transport(weight=2, flow=lambda request: request.headers["x-env"])
    async with httpx.AsyncClient(base_url=upstream.url, transport=transport) as client:
        call = asyncio.create_task(client.post("/judge", headers={"x-env": "math"}))
        while upstream.active == 0:  # noqa: ASYNC110 - the upstream runs in uvicorn's thread
            await asyncio.sleep(0.005)
        held = {(s.flow, s.held) for s in judge.limit.flow_statistics()}
        assert (await call).status_code == 200
    assert held == {("math", 2)}
    assert judge.limit.flow_statistics() == []
