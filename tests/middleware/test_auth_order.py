"""A request the app rejects before any work (auth) is kept out of the limit's queue (issue 19,
item 2): by the order of the middlewares (ConcurrencyLimitMiddleware inside the auth one), or,
where the order cannot be chosen, by `bypass=`. A real auth BaseHTTPMiddleware, over uvicorn.

Before: with the auth middleware inside, unauthenticated requests queued for a slot and were
answered the route's timeout ("Episode admission timed out"), counted as timeouts, not 401."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from starlette.datastructures import Headers
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.types import Scope

from tests.middleware.apps import Gate
from tests.registry import limits_of
from tests.servers import UvicornServer, wait_until

TOKEN = "Bearer good"
UNAUTHENTICATED = 20


async def require_token(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    """The auth middleware: 401 before any work unless the request carries the token."""
    if request.headers.get("authorization") != TOKEN:
        return JSONResponse({"detail": "not authenticated"}, status_code=401)
    return await call_next(request)


def no_token(scope: Scope) -> bool:
    """The bypass: requests the auth middleware inside will reject pass straight through."""
    return Headers(scope=scope).get("authorization") != TOKEN


def auth_app(component: str, *, auth_outside: bool, bypass: bool = False) -> tuple[FastAPI, Gate]:
    """/run limited to 1 slot (queue timeout 1 s); auth added outside or inside the limit."""
    gate = Gate()
    app = FastAPI()

    @app.post("/run")
    async def run() -> dict[str, bool]:
        await gate.wait()
        return {"ok": True}

    settings = ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path="/run",
                limit_name="runs",
                max_concurrent=1,
                queue_timeout_seconds=1,
                failure="episode",
            )
        ],
    )
    options = {"bypass": no_token} if bypass else {}
    if not auth_outside:  # added first: innermost, it runs after the limit
        app.add_middleware(BaseHTTPMiddleware, dispatch=require_token)
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings, **options)
    if auth_outside:  # added last: outermost, it runs first (the documented order)
        app.add_middleware(BaseHTTPMiddleware, dispatch=require_token)
    return app, gate


async def flood_while_full(server: UvicornServer, gate: Gate, component: str) -> list[int]:
    """Statuses of UNAUTHENTICATED requests sent while an authenticated one holds the slot."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        holder = asyncio.create_task(client.post("/run", headers={"authorization": TOKEN}))
        await asyncio.to_thread(wait_until, lambda: limits_of(component)["runs"].active == 1)
        answers = await asyncio.gather(*(client.post("/run") for _ in range(UNAUTHENTICATED)))
        gate.open = True
        assert (await holder).status_code == 200
    return [answer.status_code for answer in answers]


@pytest.mark.parametrize(
    ("auth_outside", "bypass"),
    [(True, False), (False, True)],
    ids=["the limit inside the auth", "the auth inside, bypass="],
)
async def test_an_unauthenticated_request_gets_401_and_never_queues(
    component: str, auth_outside: bool, bypass: bool
):
    app, gate = auth_app(component, auth_outside=auth_outside, bypass=bypass)
    with UvicornServer(app) as server:
        # (The authenticated holder is limited either way: flood_while_full waits for it to
        # hold the slot.)
        statuses = await flood_while_full(server, gate, component)
    runs = limits_of(component)["runs"]
    assert statuses == [401] * UNAUTHENTICATED
    assert (runs.admission_timeouts, runs.admission_cancelled, runs.admission_shed) == (0, 0, 0)
    assert (runs.active, runs.queue_depth) == (0, 0)


async def test_outside_the_auth_middleware_unauthenticated_requests_wait_for_a_slot(
    component: str,
):
    # The trap the order (or bypass=) avoids, and that makes the test above able to fail.
    app, gate = auth_app(component, auth_outside=False)
    with UvicornServer(app) as server:
        statuses = await flood_while_full(server, gate, component)
    assert statuses == [200] * UNAUTHENTICATED  # the episode profile's timeout row, not 401
    assert limits_of(component)["runs"].admission_timeouts == UNAUTHENTICATED


def test_a_bypass_that_is_not_callable_is_a_clear_error():
    with pytest.raises(TypeError, match="bypass must be a callable taking the ASGI scope"):
        ConcurrencyLimitMiddleware(FastAPI(), settings=ConcurrencySettings(), bypass=True)  # type: ignore[arg-type]
