"""A weighed call in a flow gives back exactly the weight and flow it took, whatever path gives
it back: a retry's discarded response, a connection error, the body's deadline, a limit's own
timeout, a streamed response dropped and collected, its client closed, a limit resized under
it. Through real httpx, aiohttp and the openai client against a real uvicorn upstream; the
limit fixture checks after each test that nothing is held or queued, in any flow."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import aiohttp
import httpx
import openai
import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import (
    DeadlineExceeded,
    LimitedTransport,
    RetryPolicy,
    leaks,
    limited_middleware,
    openai_tokens,
)
from gym_concurrency.limits import FlowStatistics
from tests.clients.callers import KINDS, Caller
from tests.clients.test_dropped_responses import sse
from tests.clients.upstream import Reply, Upstream
from tests.servers import eventually, free_port

QUICK = RetryPolicy(backoff_seconds=0.01, backoff_max_seconds=0.05)
HEADERS = {"x-env": "env-a"}


def by_env(request: Any) -> Any:
    return request.headers.get("x-env")


WEIGHED: dict[str, Any] = {"weight": 3, "flow": by_env}
HOLDING = [FlowStatistics("env-a", held=3, queue_depth=0, queued_weight=0)]


@pytest.fixture(autouse=True)
def said_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leaks, "_said", False)


@pytest.mark.parametrize("kind", KINDS)
async def test_retries_give_back_each_attempts_weight_before_backing_off(
    kind: str, upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/judge", Reply(429, {"retry-after-ms": "300"}), Reply(503, delay=0.2))
    async with Caller(kind, upstream.url, limit, QUICK, **WEIGHED) as caller:
        call = asyncio.create_task(caller.get("/judge", HEADERS))
        await eventually(lambda: len(upstream.attempts()) == 1, "the first attempt")
        await eventually(lambda: limit.active == 0, "the backoff, holding nothing")
        assert limit.flow_statistics() == []
        await eventually(lambda: upstream.answering(2), "the second attempt")
        assert limit.flow_statistics() == HOLDING
        assert await call == (200, b'{"attempt": 3}')


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retry_denied_returns_the_last_response_holding_nothing(
    kind: str, upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/judge", Reply(503), Reply(503))
    policy = RetryPolicy(max_attempts=2, backoff_seconds=0.01)
    async with Caller(kind, upstream.url, limit, policy, **WEIGHED) as caller:
        assert (await caller.get("/judge", HEADERS))[0] == 503


@pytest.mark.parametrize("kind", KINDS)
async def test_connection_errors_retried_then_raised_give_every_attempts_weight_back(
    kind: str, limit: MeteredSemaphore
):
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused at once
    async with Caller(kind, nobody, limit, QUICK, **WEIGHED) as caller:
        with pytest.raises((httpx.ConnectError, aiohttp.ClientConnectionError)):
            await caller.get("/judge", HEADERS)


@pytest.mark.parametrize("kind", KINDS)
async def test_the_bodys_deadline_gives_the_weight_back(
    kind: str, upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/judge", Reply(body=b"x" * 100, chunks=10, chunk_delay=0.2))
    policy = RetryPolicy(deadline_seconds=0.5)
    async with Caller(kind, upstream.url, limit, policy, **WEIGHED) as caller:
        with pytest.raises(DeadlineExceeded):
            await caller.get("/judge", HEADERS)
        await eventually(lambda: limit.active == 0, "the weight to come back")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_limits_own_timeout_holds_nothing(kind: str, upstream: Upstream, name: str):
    limit = MeteredSemaphore(4, component=name, limit_name="judge", timeout=0.1)
    await limit.acquire(2, "env-b")  # 2 of 4 held elsewhere: weight 3 must wait
    async with Caller(kind, upstream.url, limit, QUICK, **WEIGHED) as caller:
        with pytest.raises(TimeoutError):
            await caller.get("/judge", HEADERS)
    limit.release(2, "env-b")
    assert (limit.active, limit.admission_timeouts, limit.flow_statistics()) == (0, 1, [])
    assert upstream.attempts() == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_dropped_streamed_response_gives_its_weight_back_when_collected(
    kind: str, upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/stream", Reply(chunks=4, chunk_delay=0.05))
    if kind == "httpx":
        transport = LimitedTransport(limit, **WEIGHED)
        async with httpx.AsyncClient(base_url=upstream.url, transport=transport) as client:
            request = client.build_request("GET", "/stream", headers=HEADERS)
            response: Any = await client.send(request, stream=True)
            assert limit.flow_statistics() == HOLDING
            del response
            gc.collect()
            await eventually(lambda: limit.active == 0, "the weight to come back", seconds=5)
    else:
        middleware = limited_middleware(limit, **WEIGHED)
        async with aiohttp.ClientSession(base_url=upstream.url, middlewares=(middleware,)) as s:
            response = await s.get("/stream", headers=HEADERS)
            assert limit.flow_statistics() == HOLDING
            del response
            gc.collect()
            await eventually(lambda: limit.active == 0, "the weight to come back", seconds=5)


async def test_closing_the_client_gives_back_each_open_responses_weight_and_flow(
    upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/stream", *[Reply(chunks=4, chunk_delay=0.05)] * 2)
    transport = LimitedTransport(limit, weight=lambda r: len(r.headers["x-env"]), flow=by_env)
    client = httpx.AsyncClient(base_url=upstream.url, transport=transport)
    kept = [
        await client.send(
            client.build_request("GET", "/stream", headers={"x-env": env}), stream=True
        )
        for env in ("a", "bbb")
    ]
    assert sorted(limit.flow_statistics(), key=lambda f: f.held) == [
        FlowStatistics("a", 1, 0, 0),
        FlowStatistics("bbb", 3, 0, 0),
    ]
    await client.aclose()
    assert (limit.active, limit.flow_statistics()) == (0, [])
    assert len(kept) == 2


async def test_a_weight_taken_before_the_limit_shrank_is_given_back_whole(
    upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/judge", Reply(delay=0.3))
    async with Caller("httpx", upstream.url, limit, None, weight=10, flow=by_env) as caller:
        call = asyncio.create_task(caller.get("/judge", HEADERS))
        await eventually(lambda: upstream.answering(1), "the call to reach the upstream")
        assert limit.flow_statistics() == [FlowStatistics("env-a", 4, 0, 0)]  # capped at 4
        limit.resize(2)  # the limit shrinks under it: what it holds is never revoked
        assert (await call)[0] == 200
        assert (limit.active, limit.limit) == (0, 2)
    limit.resize(4)


async def test_openai_streams_dropped_unread_give_back_their_tokens(upstream: Upstream, name: str):
    limit = MeteredSemaphore(300, component=name, limit_name="model")
    path = "/v1/chat/completions"
    upstream.script(path, *[Reply(body=sse(4), chunks=4, chunk_delay=0.01)] * 30)
    transport = LimitedTransport(limit, weight=openai_tokens, flow=lambda r: r.headers["x-env"])
    client = openai.AsyncOpenAI(
        base_url=upstream.url + "/v1",
        api_key="none",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=transport, timeout=20),
    )
    messages: Any = [{"role": "user", "content": "x" * 396}]

    async def call(number: int) -> None:
        env = f"env-{number % 3}"
        stream = await client.chat.completions.create(
            model="m", messages=messages, max_tokens=10, stream=True, extra_headers={"x-env": env}
        )
        if number % 2:
            async for _ in stream:
                break  # abandoned, never closed: collected later

    for first in range(0, 30, 2):  # at most 2 x 110 tokens at once: never over 300
        await asyncio.gather(call(first), call(first + 1))
        gc.collect()
    await eventually(lambda: limit.active == 0, "every stream's tokens to come back", seconds=5)
    assert limit.flow_statistics() == []
    await client.close()
