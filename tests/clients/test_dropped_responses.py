"""A response dropped without being closed gives its slot back: when it is garbage-collected
(a stream never iterated, or abandoned mid-way), or when its client is closed; the first leak
in a process is logged with where the response was made. Over a real uvicorn upstream, with
httpx, aiohttp and the openai client."""

from __future__ import annotations

import asyncio
import gc
import json
import logging

import aiohttp
import httpx
import openai
import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import LimitedTransport, leaks, limited_middleware
from tests.clients.upstream import Reply, Upstream
from tests.servers import eventually

STREAMED = Reply(chunks=4, chunk_delay=0.01)


def sse(pieces: int) -> bytes:
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}],
    }
    events = [b"data: " + json.dumps(chunk).encode() + b"\n\n" for _ in range(pieces)]
    return b"".join(events) + b"data: [DONE]\n\n"


@pytest.fixture
def said_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leaks, "_said", False)  # the first leak of this test is logged


async def test_a_stream_never_read_gives_its_slot_back_when_collected(
    upstream: Upstream, limit: MeteredSemaphore, said_again: None, caplog: pytest.LogCaptureFixture
):
    upstream.script("/stream", STREAMED)
    async with httpx.AsyncClient(base_url=upstream.url, transport=LimitedTransport(limit)) as c:
        response = await c.send(c.build_request("GET", "/stream"), stream=True)
        assert limit.active == 1
        with caplog.at_level(logging.WARNING, logger="gym_concurrency.clients"):
            del response
            gc.collect()
            await eventually(lambda: limit.active == 0, "the slot to come back", seconds=5)
    leaked = [r.getMessage() for r in caplog.records if "garbage-collected" in r.getMessage()]
    assert len(leaked) == 1
    assert __file__ in leaked[0]  # where the response was made: this test, not httpx


async def test_closing_the_client_gives_back_the_slots_of_open_responses(
    upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/stream", STREAMED, STREAMED)
    client = httpx.AsyncClient(base_url=upstream.url, transport=LimitedTransport(limit))
    kept = [await client.send(client.build_request("GET", "/stream"), stream=True) for _ in "ab"]
    assert limit.active == 2
    await client.aclose()
    assert limit.active == 0  # at once, while the responses are still referenced
    assert len(kept) == 2


ENDLESS = Reply(endless=True, chunk_delay=0.01)


async def test_an_aiohttp_response_dropped_unread_gives_its_slot_back_when_collected(
    upstream: Upstream, limit: MeteredSemaphore, said_again: None, caplog: pytest.LogCaptureFixture
):
    # A body that never ends: without the net, its slot would never come back.
    upstream.script("/endless", ENDLESS)
    middleware = limited_middleware(limit)
    async with aiohttp.ClientSession(base_url=upstream.url, middlewares=(middleware,)) as s:
        response = await s.get("/endless")
        await response.content.readany()  # the body is coming
        assert limit.active == 1
        with caplog.at_level(logging.WARNING, logger="gym_concurrency.clients"):
            del response
            gc.collect()
            await eventually(lambda: limit.active == 0, "the slot to come back", seconds=5)
        await eventually(lambda: upstream.active == 0, "the upstream to see the caller go")
        assert (await (await s.get("/after")).json())["attempt"] == 1  # the limit serves on
    leaked = [r.getMessage() for r in caplog.records if "garbage-collected" in r.getMessage()]
    assert len(leaked) == 1
    assert __file__ in leaked[0]  # where the response was made: this test, not aiohttp


async def test_a_released_aiohttp_response_is_no_leak(
    upstream: Upstream, limit: MeteredSemaphore, said_again: None, caplog: pytest.LogCaptureFixture
):
    upstream.script("/endless", ENDLESS)
    async with aiohttp.ClientSession(
        base_url=upstream.url, middlewares=(limited_middleware(limit),)
    ) as s:
        with caplog.at_level(logging.WARNING, logger="gym_concurrency.clients"):
            response = await s.get("/endless")
            response.release()
            assert limit.active == 0
            del response
            gc.collect()
    assert not [r for r in caplog.records if "garbage-collected" in r.getMessage()]


async def test_closing_the_aiohttp_session_gives_back_the_slots_of_open_responses(
    upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/endless", ENDLESS, ENDLESS)
    session = aiohttp.ClientSession(base_url=upstream.url, middlewares=(limited_middleware(limit),))
    kept = [await session.get("/endless") for _ in "ab"]
    assert limit.active == 2
    await session.close()
    assert limit.active == 0  # at once, while the responses are still referenced
    for response in kept:
        response.release()  # later: nothing given back twice
    assert limit.active == 0


async def test_600_openai_streams_a_third_abandoned_a_third_never_read_all_complete(
    upstream: Upstream, name: str, said_again: None
):
    # A limit of 6: without the safety net the first six streams dropped unread hold every
    # slot for good, and the calls behind them time out. openai's streams sit in reference
    # cycles (the stream and its iterator), so they are collected when the cycle collector
    # runs: in a live server it runs all the time; here, where every caller may be waiting,
    # a task runs it as the rest of a process would.
    limit = MeteredSemaphore(6, component=name, limit_name="streams")
    path = "/v1/chat/completions"
    upstream.script(path, *[Reply(body=sse(4), chunks=4, chunk_delay=0.002)] * 600)
    transport = LimitedTransport(limit)
    client = openai.AsyncOpenAI(
        base_url=upstream.url + "/v1",
        api_key="none",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=transport, timeout=20),
    )
    messages = [{"role": "user", "content": "hi"}]
    done: list[int] = []

    async def call(number: int) -> None:
        stream = await client.chat.completions.create(model="m", messages=messages, stream=True)
        if number % 3 == 1:
            async for _ in stream:
                break  # abandoned mid-way, never closed
        elif number % 3 == 0:
            async for _ in stream:
                pass
        done.append(number)  # number % 3 == 2: never read at all

    async def caller(first: int) -> None:
        for number in range(first, 600, 30):
            await call(number)

    async def collector() -> None:
        while True:
            await asyncio.sleep(0.2)
            gc.collect()

    collecting = asyncio.create_task(collector())
    try:
        await asyncio.wait_for(asyncio.gather(*(caller(i) for i in range(30))), 120)
    finally:
        collecting.cancel()
    assert len(done) == 600
    gc.collect()
    await eventually(lambda: limit.active == 0, "every slot to come back", seconds=5)
    await client.close()
