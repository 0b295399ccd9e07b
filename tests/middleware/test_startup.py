"""Start-up checks that tell the truth: class endpoints, routes added in the app's own lifespan,
and invalid settings from the environment under every uvicorn lifespan mode (issue 10, items
5, 9 and 10)."""

from __future__ import annotations

from typing import Any

import pytest
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from starlette.applications import Starlette
from starlette.endpoints import HTTPEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from tests.registry import limits_of


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
