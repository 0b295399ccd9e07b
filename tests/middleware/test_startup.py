"""Start-up checks that tell the truth: class endpoints, routes added in the app's own lifespan,
and invalid settings from the environment under every uvicorn lifespan mode (issue 10, items
5, 9 and 10)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from starlette.applications import Starlette
from starlette.endpoints import HTTPEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from tests.registry import limits_of
from tests.uvicorn_process import clean_env, uvicorn


def limit(path: str, methods: list[str] | None, name: str) -> RouteLimit:
    return RouteLimit(path=path, methods=methods, limit_name=name, max_concurrent=1)


def test_a_class_endpoint_route_can_be_limited_by_method(component: str):
    # Before: refused as "accepts no HTTP methods (a websocket route ...)".
    class Work(HTTPEndpoint):
        async def post(self, request: Request) -> JSONResponse:
            return JSONResponse({name: s.active for name, s in limits_of(component).items()})

    app = Starlette(routes=[Route("/work", Work), Route("/posted", Work, methods=["POST"])])
    settings = ConcurrencySettings(
        component=component,
        routes=[limit("/work", ["POST"], "work"), limit("/posted", ["POST"], "posted")],
    )
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    with TestClient(app) as client:
        assert client.post("/work").json() == {"work": 1, "posted": 0}
        assert client.post("/posted").json() == {"work": 0, "posted": 1}
        assert client.get("/work").status_code == 405  # the endpoint's own answer, unlimited


def test_a_class_endpoint_is_checked_against_the_methods_it_defines(component: str):
    class Work(HTTPEndpoint):
        async def post(self, request: Request) -> JSONResponse:
            return JSONResponse({})

    app: Any = Starlette(routes=[Route("/work", Work)])
    settings = ConcurrencySettings(component=component, routes=[limit("/work", ["PUT"], "w")])
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    with (
        pytest.raises(
            RuntimeError, match=r"routes\.0\.methods \['PUT'\]: /work accepts \['POST'\]"
        ),
        TestClient(app),
    ):
        pass


# --- Invalid settings from the environment under real uvicorn, every lifespan mode (items 5, 9)

APP = """
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware

app = FastAPI()


@app.post("/run")
async def run() -> dict[str, bool]:
    return {"ok": True}


@app.get("/health")
async def health() -> dict[str, bool]:
    return {"ok": True}


@app.get("/internal/secret-route", include_in_schema=False)
async def hidden() -> dict[str, bool]:
    return {"ok": True}


app.add_middleware(ConcurrencyLimitMiddleware)  # settings from the environment
"""
ROUTE_ENV = {
    "GYM_CONCURRENCY_ROUTES__0__PATH": "/run",
    "GYM_CONCURRENCY_ROUTES__0__LIMIT_NAME": "episodes",
}
BAD_ENVIRONMENTS = {
    "max_concurrent=0": (
        {**ROUTE_ENV, "GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT": "0"},
        "routes.0.max_concurrent",
    ),
    "invalid JSON": ({"GYM_CONCURRENCY_ROUTES": '[{"path": "/run",'}, "GYM_CONCURRENCY_ROUTES"),
    "unknown variable": ({"GYM_CONCURRENCY_ROUTE": "[]"}, "GYM_CONCURRENCY_ROUTES"),
    "unknown path": (
        {
            **ROUTE_ENV,
            "GYM_CONCURRENCY_ROUTES__0__PATH": "/runs",
            "GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT": "1",
        },
        "routes.0.path '/runs' matches no route",
    ),
}


def app_folder(tmp_path: Path) -> Path:
    (tmp_path / "badapp.py").write_text(APP)
    return tmp_path


@pytest.mark.parametrize("lifespan", ["auto", "on"])
@pytest.mark.parametrize("case", sorted(BAD_ENVIRONMENTS))
def test_invalid_environment_settings_fail_the_start(tmp_path: Path, lifespan: str, case: str):
    # Before (auto): "ASGI 'lifespan' protocol appears unsupported", then startup complete and
    # a 500 on every route.
    variables, named = BAD_ENVIRONMENTS[case]
    folder = app_folder(tmp_path)
    with uvicorn(folder, "badapp:app", clean_env(**variables), "--lifespan", lifespan) as server:
        status = server.exit_status()
        log = server.log
    assert status == 3, log
    assert named in log
    assert "Application startup failed" in log
    assert "appears unsupported" not in log
    assert "Application startup complete" not in log


@pytest.mark.parametrize("case", sorted(BAD_ENVIRONMENTS))
def test_without_lifespan_invalid_settings_answer_500_misconfigured(tmp_path: Path, case: str):
    variables, named = BAD_ENVIRONMENTS[case]
    folder = app_folder(tmp_path)
    with uvicorn(folder, "badapp:app", clean_env(**variables), "--lifespan", "off") as server:
        server.wait_serving("/health")
        answers = [httpx.get(server.url + path, timeout=5) for path in ("/health", "/docs")]
        answers.append(httpx.post(server.url + "/run", timeout=5))
        log = server.log
    for answer in answers:
        assert answer.status_code == 500
        assert "misconfigured" in answer.text
        # The details, and the app's routes, are for the log only (item 9).
        assert "/internal/secret-route" not in answer.text
        assert "/health" not in answer.text
        assert named not in answer.text
    assert log.count(named) == 1  # logged once, not per request


# --- Routes the app adds in its own lifespan startup are the app's routes (item 10)


def late_app(component: str, path: str, events: list[str]) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def late() -> dict[str, int]:
            return {name: s.active for name, s in limits_of(component).items()}

        app.add_api_route("/late", late, methods=["POST"])  # e.g. a plugin's routes
        events.append("started")
        try:
            yield
        finally:  # also when the start fails after this startup: cleanup runs
            events.append("stopped")

    app = FastAPI(lifespan=lifespan)
    settings = ConcurrencySettings(component=component, routes=[limit(path, ["POST"], "late")])
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    return app


def test_a_route_added_in_the_apps_lifespan_startup_can_be_limited(component: str):
    # Before: the start failed with "routes.0.path '/late' matches no route of the app".
    events: list[str] = []
    with TestClient(late_app(component, "/late", events)) as client:
        assert client.post("/late").json() == {"late": 1}
    assert events == ["started", "stopped"]


def test_a_path_missing_after_the_apps_own_startup_still_fails_the_start(component: str):
    events: list[str] = []
    with (
        pytest.raises(RuntimeError, match=r"routes\.0\.path '/later' matches no route"),
        TestClient(late_app(component, "/later", events)),
    ):
        pass
    assert events == ["started", "stopped"]  # the app's own cleanup ran


def test_a_path_missing_after_startup_fails_uvicorn_with_status_3(tmp_path: Path):
    (tmp_path / "lateapp.py").write_text(
        "from contextlib import asynccontextmanager\n"
        "from fastapi import FastAPI\n"
        "from gym_concurrency.middleware import ConcurrencyLimitMiddleware\n\n"
        "@asynccontextmanager\n"
        "async def lifespan(app):\n"
        "    app.add_api_route('/late', lambda: {}, methods=['POST'])\n"
        "    yield\n\n"
        "app = FastAPI(lifespan=lifespan)\n"
        "app.add_middleware(ConcurrencyLimitMiddleware)\n"
    )
    for path, status in (("/late", None), ("/later", 3)):
        variables = {**ROUTE_ENV, "GYM_CONCURRENCY_ROUTES__0__PATH": path}
        env = clean_env(**variables, GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT="1")
        with uvicorn(tmp_path, "lateapp:app", env) as server:
            if status is None:
                server.wait_serving("/docs")
                assert httpx.post(server.url + "/late", timeout=5).status_code == 200
            else:
                assert server.exit_status() == status, server.log
                assert "routes.0.path '/later' matches no route" in server.log
                assert "Application startup complete" not in server.log
