"""The openai client over LimitedTransport (max_retries=0: the transport retries, once): a 429
with retry-after-ms is waited for and retried, the deadline is the client's APITimeoutError,
a limit's own refusal reaches the caller (as the cause of openai 2.x's connection error); the
project's own limited route (the openai failure profile), the 503 is retried."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import LimitedTransport, RetryPolicy
from tests.clients.upstream import CHAT_COMPLETION, Reply, Upstream
from tests.servers import UvicornServer

MESSAGES: Any = [{"role": "user", "content": "hi"}]


def openai_client(url: str, limit: Any, retry: RetryPolicy | None) -> openai.AsyncOpenAI:
    transport = LimitedTransport(limit, retry=retry)
    return openai.AsyncOpenAI(
        base_url=url + "/v1",
        api_key="none",
        max_retries=0,  # the transport retries; two layers would multiply the attempts
        http_client=httpx.AsyncClient(transport=transport),
    )


async def test_a_429_is_retried_once_by_the_transport(upstream: Upstream, limit: MeteredSemaphore):
    upstream.script("/v1/chat/completions", Reply(429, {"retry-after-ms": "300"}))
    async with openai_client(upstream.url, limit, RetryPolicy()) as client:
        completion = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert completion.choices[0].message.content == "ok"
    assert len(upstream.attempts("/v1/chat/completions")) == 2
    (gap,) = upstream.gaps("/v1/chat/completions")
    assert gap >= 0.3


async def test_the_deadline_is_the_clients_timeout_error(
    upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/v1/chat/completions", Reply(delay=3))
    async with openai_client(upstream.url, limit, RetryPolicy(deadline_seconds=0.3)) as client:
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="m", messages=MESSAGES)
    assert limit.active == 0


async def test_a_limits_refusal_is_the_cause_of_the_clients_error(upstream: Upstream, name: str):
    limit = MeteredSemaphore(1, component=name, limit_name="judge", timeout=0.05)
    await limit.acquire()
    async with openai_client(upstream.url, limit, RetryPolicy()) as client:
        with pytest.raises((openai.APIConnectionError, TimeoutError)) as raised:
            await client.chat.completions.create(model="m", messages=MESSAGES)
    # openai 2.x wraps it in its connection error; 3.x lets it through as the limit raised it
    refusal = raised.value
    if isinstance(refusal, openai.APIConnectionError):
        refusal = refusal.__cause__
    assert type(refusal) is TimeoutError
    limit.release()
    assert upstream.attempts() == []


async def test_a_limited_route_answering_503_is_retried_after_its_retry_after(
    limit: MeteredSemaphore, name: str
):
    """The project's openai failure profile answers 503 with retry-after-ms: the transport
    waits it out and the call succeeds once the route's only slot is free."""
    app = FastAPI()
    gate = threading.Event()  # the app runs on uvicorn's loop, in another thread

    @app.post("/v1/chat/completions")
    async def completions() -> dict[str, Any]:
        while not gate.is_set():  # noqa: ASYNC110 - set from the test's thread, not this loop
            await asyncio.sleep(0.01)
        return CHAT_COMPLETION

    route = RouteLimit(
        path="/v1/chat/completions",
        limit_name="model",
        max_concurrent=1,
        max_queue=0,
        failure="openai",
    )
    settings = ConcurrencySettings(component=name + "_server", routes=[route])
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    loop = asyncio.get_running_loop()
    with UvicornServer(app) as server:
        async with openai_client(server.url, limit, RetryPolicy()) as client:
            create = client.chat.completions.create
            first = asyncio.create_task(create(model="m", messages=MESSAGES))
            await asyncio.sleep(0.3)  # the first holds the route's only slot
            started = loop.time()
            second = asyncio.create_task(create(model="m", messages=MESSAGES))
            await asyncio.sleep(0.3)  # refused (503, retry-after-ms: 1000), backing off
            gate.set()
            assert (await first).choices[0].message.content == "ok"
            assert (await second).choices[0].message.content == "ok"
            assert loop.time() - started >= 1.0
