"""An operation handle used while a request is handled takes its slot in the request's flow
(`RouteLimit.flow`), as the request's outbound calls do, unless the block says otherwise; the
request's handler can read that flow (`request_flow()`). Over a real uvicorn."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
from fastapi import Depends, FastAPI
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    OperationHandle,
    OperationLimit,
    RouteLimit,
    operation_limit,
)
from servers import UvicornServer

from gym_concurrency.flow import request_flow

Judge = Annotated[OperationHandle, Depends(operation_limit("judge"))]


def held(handle: OperationHandle) -> list[list[Any]]:
    return [[f.flow, f.held] for f in handle.limit.limit.flow_statistics()]


def judged_app(component: str) -> FastAPI:
    app = FastAPI()

    @app.post("/run")
    async def run(judge: Judge) -> dict[str, Any]:
        async with judge:
            inherited = held(judge)
        async with judge(flow=None):
            default = held(judge)
        async with judge(weight=2, flow="batch"):
            given = held(judge)
        return {"flow": request_flow(), "inherited": inherited, "default": default, "given": given}

    settings = ConcurrencySettings(
        component=component,
        routes=[RouteLimit(path="/run", limit_name="run", max_concurrent=4, flow="header:x-env")],
        operations=[
            OperationLimit(
                limit_name="judge", operation="judge", executor="inline", max_concurrent=4
            )
        ],
    )
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    return app


async def test_an_operation_takes_its_slot_in_the_requests_flow(component: str) -> None:
    with UvicornServer(judged_app(component)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            answer = (await client.post("/run", headers={"x-env": "env-a"})).json()
            unflowed = (await client.post("/run")).json()
    assert answer == {
        "flow": "env-a",
        "inherited": [["env-a", 1]],
        "default": [[None, 1]],
        "given": [["batch", 2]],
    }
    assert unflowed["flow"] is None  # no x-env: the default flow, for its operations too
    assert unflowed["inherited"] == [[None, 1]]
