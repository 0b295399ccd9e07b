"""Startup validation (lifespan), building without lifespan, and websockets on limited routes."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import httpx
import pytest
from apps import make_app
from fastapi import Depends
from gym_concurrency.middleware import (
    ConcurrencySettings,
    OperationHandle,
    RouteLimit,
    operation_limit,
)
from servers import eventually
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.registry import limits_of

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
# Module level: FastAPI resolves string annotations in the module's namespace.
Judge = Annotated[OperationHandle, Depends(operation_limit("judge"))]


def settings_for(component: str, *routes: dict[str, Any], **fields: Any) -> ConcurrencySettings:
    return ConcurrencySettings(
        component=component, routes=[RouteLimit(**r) for r in routes], **fields
    )


def test_unknown_path_fails_startup_naming_it_and_listing_routes(component: str):
    app, _ = make_app(
        settings_for(component, {"path": "/runs", "limit_name": "e", "max_concurrent": 1})
    )
    with pytest.raises(RuntimeError) as raised, TestClient(app):
        pass
    message = str(raised.value)
    assert "routes.0.path '/runs' matches no route of the app" in message
    for route in (
        "POST /run",
        "GET /run",
        "POST /episodes/{episode_id}",
        "POST /api/v2/run",
        "POST /sub/work",
        "WEBSOCKET /ws",
        "MOUNT /sub",
    ):
        assert f"\n  {route}\n" in message + "\n"


def test_method_the_route_lacks_fails_startup(component: str):
    app, _ = make_app(
        settings_for(
            component,
            {"path": "/health", "methods": ["POST"], "limit_name": "e", "max_concurrent": 1},
        )
    )
    with (
        pytest.raises(
            RuntimeError,
            match=r"routes\.0\.methods \['POST'\]: /health accepts "
            r"\['GET'\]",
        ),
        TestClient(app),
    ):
        pass


def test_unknown_operation_limit_name_fails_startup(component: str):
    app, _ = make_app(settings_for(component))

    @app.post("/verify")
    async def verify(judge: Judge) -> None:
        return None

    with pytest.raises(RuntimeError) as raised, TestClient(app):
        pass
    assert (
        "operation_limit('judge') is used by /verify but no OperationLimit has "
        "limit_name 'judge' (configured: none)"
    ) in str(raised.value)


def test_valid_settings_start_and_limit(component: str):
    app, gate = make_app(
        settings_for(component, {"path": "/run", "limit_name": "e", "max_concurrent": 2})
    )
    gate.open = True
    with TestClient(app) as client:
        assert client.post("/run", content=b"hi").json() == {"path": "/run", "body": "hi"}
    assert limits_of(component)["e"].limit == 2


async def test_without_lifespan_the_table_is_built_on_the_first_request(component: str):
    app, gate = make_app(
        settings_for(
            component, {"path": "/run", "limit_name": "e", "max_concurrent": 1, "max_queue": 0}
        )
    )
    transport = httpx.ASGITransport(app=app)  # sends no lifespan events
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        held = asyncio.create_task(client.post("/run", content=b"{}"))
        await eventually(lambda: gate.inside == 1, "the first request inside the app")
        # Bounded: without the limit this request would wait on the closed gate.
        refused = await asyncio.wait_for(client.post("/run", content=b"{}"), 10)
        gate.open = True
        assert (await held).status_code == 200
    assert (refused.status_code, refused.json()["type"]) == (503, "urn:gym-concurrency:queue-full")
    semaphore = limits_of(component)["e"]
    assert (semaphore.active, semaphore.admission_shed) == (0, 1)


async def test_without_lifespan_bad_settings_answer_500_naming_the_problem(
    component: str, caplog: pytest.LogCaptureFixture
):
    app, _ = make_app(
        settings_for(component, {"path": "/nope", "limit_name": "e", "max_concurrent": 1})
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for path in ("/health", "/run"):
            response = await client.get(path)
            assert response.status_code == 500
            assert "misconfigured" in response.text
            assert "/nope" not in response.text  # the details are for the log (issue 10.9)
    errors = [r for r in caplog.records if r.name == "gym_concurrency.middleware"]
    assert len(errors) == 1  # logged once, not per request
    assert "routes.0.path '/nope' matches no route of the app" in errors[0].getMessage()


def test_websocket_holds_a_slot_for_the_connection(component: str):
    app, _ = make_app(
        settings_for(
            component,
            {
                "path": "/ws",
                "limit_name": "sockets",
                "max_concurrent": 1,
                "queue_timeout_seconds": 0.05,
            },
        )
    )
    with TestClient(app) as client, client.websocket_connect("/ws") as first:
        assert first.receive_text() == "admitted"
        semaphore = limits_of(component)["sockets"]
        assert semaphore.active == 1
        with (
            client.websocket_connect("/ws") as second,
            pytest.raises(WebSocketDisconnect) as closed,
        ):
            second.receive_text()
        assert (closed.value.code, closed.value.reason) == (1013, "admission timed out")
        assert semaphore.admission_timeouts == 1
        first.send_text("bye")
    assert semaphore.active == 0


def test_websocket_full_queue_closes_with_1013(component: str):
    app, _ = make_app(
        settings_for(
            component, {"path": "/ws", "limit_name": "sockets", "max_concurrent": 1, "max_queue": 0}
        )
    )
    with TestClient(app) as client, client.websocket_connect("/ws") as first:
        assert first.receive_text() == "admitted"
        with (
            client.websocket_connect("/ws") as second,
            pytest.raises(WebSocketDisconnect) as closed,
        ):
            second.receive_text()
        assert (closed.value.code, closed.value.reason) == (1013, "admission queue full")
        assert limits_of(component)["sockets"].admission_shed == 1
        first.send_text("bye")
