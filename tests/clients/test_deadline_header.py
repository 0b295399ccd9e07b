"""`deadline_header=`: an outbound call with a deadline tells the server it calls what is left
of it, in milliseconds, on every attempt (a retry says what is left then), with httpx and
aiohttp and from a configured ClientLimit; off by default. Two gym-concurrency servers chain:
the header is what `RouteLimit.deadline` reads (docs/clients.md, docs/deadlines.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import httpx
import pytest
from fastapi import FastAPI, Request
from gym_concurrency.middleware import (
    ClientLimit,
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    RouteLimit,
    limited_client,
    reload_settings,
)
from pydantic import ValidationError
from upstream import Reply, Upstream

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import LimitedTransport, RetryPolicy, limited_middleware
from gym_concurrency.deadline import within_deadline
from tests.servers import UvicornServer

HEADER = "x-envoy-expected-rq-timeout-ms"
RETRY = RetryPolicy(max_attempts=3, backoff_seconds=0.01)
Call = Callable[..., Awaitable[int]]


def caller(kind: str, limit: MeteredSemaphore, url: str, **options: Any) -> Call:
    """`call(path)`: one call through `limit` with httpx or aiohttp; its final status."""

    async def with_httpx(path: str) -> int:
        transport = LimitedTransport(limit, **options)
        async with httpx.AsyncClient(transport=transport, base_url=url) as client:
            return (await client.get(path)).status_code

    async def with_aiohttp(path: str) -> int:
        middleware = limited_middleware(limit, **options)
        async with (
            aiohttp.ClientSession(middlewares=(middleware,)) as session,
            session.get(url + path) as response,
        ):
            await response.read()
            return response.status

    return with_httpx if kind == "httpx" else with_aiohttp


def sent(upstream: Upstream, path: str) -> list[str | None]:
    return [attempt.headers.get(HEADER) for attempt in upstream.attempts(path)]


@pytest.mark.parametrize("kind", ["httpx", "aiohttp"])
async def test_each_attempt_sends_what_is_left_of_the_requests_deadline(
    upstream: Upstream, limit: MeteredSemaphore, kind: str
) -> None:
    upstream.script("/flaky", *[Reply(503, {"retry-after-ms": "200"})] * 2)
    call = caller(kind, limit, upstream.url, retry=RETRY, deadline_header=HEADER)
    with within_deadline(asyncio.get_running_loop().time() + 5.0):  # as the middleware does
        assert await call("/flaky") == 200
    first, second, third = (int(value or -1) for value in sent(upstream, "/flaky"))
    assert 4000 < first <= 5000
    assert 150 <= first - second < 1500  # each retry, after its Retry-After, says less
    assert 150 <= second - third < 1500


@pytest.mark.parametrize("kind", ["httpx", "aiohttp"])
async def test_a_calls_own_deadline_is_sent_too_and_nothing_without_one(
    upstream: Upstream, limit: MeteredSemaphore, kind: str
) -> None:
    own = RetryPolicy(deadline_seconds=2.0)
    assert await caller(kind, limit, upstream.url, retry=own, deadline_header=HEADER)("/own") == 200
    assert await caller(kind, limit, upstream.url, deadline_header=HEADER)("/none") == 200
    with within_deadline(asyncio.get_running_loop().time() + 5.0):
        assert await caller(kind, limit, upstream.url)("/off") == 200  # off by default
    (own_left,) = sent(upstream, "/own")
    assert own_left is not None
    assert 1500 < int(own_left) <= 2000
    assert sent(upstream, "/none") == [None]
    assert sent(upstream, "/off") == [None]


async def test_the_time_spent_waiting_for_a_slot_is_not_sent(
    upstream: Upstream, limit: MeteredSemaphore
) -> None:
    await limit.acquire(limit.limit)  # every slot held for 0.5 s
    asyncio.get_running_loop().call_later(0.5, limit.release, limit.limit)
    with within_deadline(asyncio.get_running_loop().time() + 5.0):
        assert await caller("httpx", limit, upstream.url, deadline_header=HEADER)("/w") == 200
    (left,) = sent(upstream, "/w")
    assert left is not None
    assert 3000 < int(left) <= 4550


@pytest.mark.parametrize("name", ["bad name", "", "x-ms\r\n"])
def test_a_deadline_header_that_is_not_a_header_name_is_an_error(
    limit: MeteredSemaphore, name: str
) -> None:
    with pytest.raises(ValueError, match="is not an HTTP header name"):
        LimitedTransport(limit, deadline_header=name)
    with pytest.raises(ValueError, match="is not an HTTP header name"):
        limited_middleware(limit, deadline_header=name)
    with pytest.raises(ValidationError, match=r"clients\.0\.deadline_header"):
        ConcurrencySettings(
            clients=[{"limit_name": "judge", "max_concurrent": 1, "deadline_header": name}]
        )


def chained_settings(component: str, header: str | None) -> ConcurrencySettings:
    return ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path="/verify", limit_name="verify", max_concurrent=8, deadline=f"header:{HEADER}"
            )
        ],
        clients=[ClientLimit(limit_name="judge", max_concurrent=2, deadline_header=header)],
    )


async def test_a_configured_client_forwards_the_deadline_its_server_was_given(
    upstream: Upstream, name: str
) -> None:
    # A caller gives this server 3 s (the header RouteLimit.deadline reads); the judge it
    # calls through its configured client hears what is left, in the same header.
    app = FastAPI()
    clients: list[httpx.AsyncClient] = []  # one, made on first use: a reload reaches it

    @app.post("/verify")
    async def verify(request: Request) -> dict[str, int]:
        if not clients:
            transport = limited_client(request.app, "judge").transport()
            clients.append(httpx.AsyncClient(base_url=upstream.url, transport=transport))
        return {"status": (await clients[0].get("/judge")).status_code}

    @app.post("/reload")  # a test's own route: reload runs on the server's loop
    async def reload(request: Request) -> dict[str, list[str]]:
        return {"changes": reload_settings(request.app, chained_settings(name, "x-left-ms"))}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=chained_settings(name, HEADER))
    with UvicornServer(app) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            answer = await client.post("/verify", headers={HEADER: "3000"})
            assert answer.json() == {"status": 200}
            changes = (await client.post("/reload")).json()["changes"]
            assert changes == [f"client limit 'judge': deadline_header {HEADER!r} -> 'x-left-ms'"]
            await client.post("/verify", headers={HEADER: "3000"})
    first, second = upstream.attempts("/judge")
    assert 2000 < int(first.headers[HEADER]) <= 3000
    assert HEADER not in second.headers
    assert 2000 < int(second.headers["x-left-ms"]) <= 3000
