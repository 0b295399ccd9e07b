"""limited_middleware in a real aiohttp ClientSession against real uvicorn: retries after
Retry-After, the last response unchanged, the slot held until the response is read, released
or closed, a limit's own refusal, connection errors, read timeouts and the deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gym_concurrency import MeteredSemaphore, QueueFullError
from gym_concurrency.clients import DeadlineExceeded, RetryPolicy, limited_middleware
from tests.clients.upstream import Reply, Upstream
from tests.servers import UvicornServer, eventually

FAST = RetryPolicy(backoff_seconds=0.01, backoff_max_seconds=0.05)


def session_for(
    url: str, limit: Any, retry: RetryPolicy | None = FAST, **options: Any
) -> aiohttp.ClientSession:
    middleware = limited_middleware(limit, retry=retry)
    return aiohttp.ClientSession(base_url=url, middlewares=(middleware,), **options)


@pytest.fixture
async def session(
    upstream: Upstream, limit: MeteredSemaphore
) -> AsyncIterator[aiohttp.ClientSession]:
    async with session_for(upstream.url, limit) as made:
        yield made


async def test_a_503_is_retried_after_retry_after_and_the_success_returned(
    upstream: Upstream, session: aiohttp.ClientSession
):
    upstream.script("/judge", Reply(503, {"retry-after": "1"}))
    async with session.post("/judge", json={"q": 1}) as response:
        assert response.status == 200
        assert (await response.json())["attempt"] == 2
    (gap,) = upstream.gaps("/judge")
    assert gap >= 1.0


async def test_the_last_response_is_returned_unchanged(
    upstream: Upstream, session: aiohttp.ClientSession
):
    upstream.script("/judge", *[Reply(429, {"retry-after-ms": "5", "x-n": str(n)}) for n in "abcd"])
    async with session.get("/judge") as response:
        assert (response.status, response.headers["x-n"]) == (429, "d")
        assert await response.json() == {"attempt": 4}


async def test_the_slot_is_held_until_the_response_is_read_released_or_closed(
    upstream: Upstream, limit: MeteredSemaphore, session: aiohttp.ClientSession
):
    for _ in range(3):
        upstream.script("/s", Reply(chunks=4, chunk_delay=0.05, body=b"abcdefgh"))
    response = await session.get("/s")
    assert limit.active == 1
    assert await response.read() == b"abcdefgh"
    assert limit.active == 0  # read in full
    response = await session.get("/s")
    assert limit.active == 1
    response.release()
    assert limit.active == 0
    response = await session.get("/s")
    await response.content.read(2)
    assert limit.active == 1  # a streamed body keeps it
    response.close()
    assert limit.active == 0
    async with session.head("/s") as empty:  # no body at all: nothing to hold
        assert empty.status == 200
        assert limit.active == 0


async def test_a_limits_own_refusal_reaches_the_caller_and_is_not_retried(
    upstream: Upstream, name: str
):
    waits = MeteredSemaphore(1, component=name, limit_name="waits", timeout=0.05)
    sheds = MeteredSemaphore(1, component=name, limit_name="sheds", max_queue=0)
    for limit, error in ((waits, TimeoutError), (sheds, QueueFullError)):
        await limit.acquire()
        async with session_for(upstream.url, limit) as session:
            with pytest.raises(error) as raised:
                await session.get("/judge")
        assert type(raised.value) is error
        limit.release()
    assert upstream.attempts() == []


async def test_a_refused_connection_is_retried_until_the_upstream_listens(
    limit: MeteredSemaphore,
):
    late = Upstream()
    server = UvicornServer(late)
    policy = RetryPolicy(max_attempts=100, backoff_seconds=0.05, backoff_max_seconds=0.1)
    async with session_for(server.url, limit, retry=policy) as session:
        call = asyncio.create_task(session.post("/judge", data=b"not idempotent"))
        await asyncio.sleep(0.3)
        assert not call.done()
        await asyncio.to_thread(server.__enter__)
        try:
            async with await call as response:
                assert response.status == 200
        finally:
            await asyncio.to_thread(server.__exit__, None, None, None)
    assert len(late.attempts("/judge")) == 1


async def test_a_read_timeout_is_retried_only_for_an_idempotent_method(
    upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/get", Reply(delay=1.0))
    upstream.script("/post", Reply(delay=1.0))
    timeout = aiohttp.ClientTimeout(sock_read=0.2)
    async with session_for(upstream.url, limit, timeout=timeout) as session:
        async with session.get("/get") as response:
            assert (await response.json())["attempt"] == 2
        with pytest.raises(aiohttp.ServerTimeoutError):
            await session.post("/post", data=b"x")
    await eventually(lambda: upstream.active == 0, "the upstream to finish", seconds=5)
    assert (len(upstream.attempts("/get")), len(upstream.attempts("/post"))) == (2, 1)


async def test_the_deadline_cuts_off_a_slow_attempt(upstream: Upstream, limit: MeteredSemaphore):
    upstream.script("/slow", Reply(delay=3))
    policy = RetryPolicy(deadline_seconds=0.3)
    async with session_for(upstream.url, limit, retry=policy) as session:
        with pytest.raises(DeadlineExceeded, match=r"deadline of 0\.3 s"):
            await session.get("/slow")
    assert limit.active == 0


async def test_the_deadline_ends_a_body_that_outlasts_it(
    upstream: Upstream, limit: MeteredSemaphore
):
    # Headers at once, then a body of 4 chunks a second apart: a 1 s deadline ends the read
    # within 1.2 s (it stopped at the headers before), and the slot is given back.
    upstream.script("/stream", Reply(chunks=4, chunk_delay=1.0))
    loop = asyncio.get_running_loop()
    async with session_for(upstream.url, limit, retry=RetryPolicy(deadline_seconds=1.0)) as session:
        started = loop.time()
        response = await session.get("/stream")
        with pytest.raises(DeadlineExceeded, match=r"no whole body within the call's deadline"):
            await response.read()
        assert loop.time() - started < 1.2
        await eventually(lambda: limit.active == 0, "the slot to come back", seconds=2)
