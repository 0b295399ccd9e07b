"""An outbound call made while handling a request with a deadline ends with that deadline:
its wait for a slot, its response and its body, with httpx and aiohttp, whether or not the
call has a `deadline_seconds` of its own (the sooner wins)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import httpx
import pytest
from upstream import Reply, Upstream

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import (
    DeadlineExceeded,
    LimitedTransport,
    RetryPolicy,
    limited_middleware,
)
from gym_concurrency.deadline import within_deadline

CUT_OFF = r"deadline of 0\.[23]\d* s"  # what was left of the request's 0.3 s


async def request_for(seconds: float):  # type: ignore[no-untyped-def]
    return within_deadline(asyncio.get_running_loop().time() + seconds)


@pytest.mark.parametrize("own", [None, 30.0])
async def test_an_httpx_call_ends_with_the_request(
    upstream: Upstream, limit: MeteredSemaphore, own
):  # type: ignore[no-untyped-def]
    upstream.script("/slow", Reply(delay=3))
    retry = None if own is None else RetryPolicy(deadline_seconds=own)
    transport = LimitedTransport(limit, retry=retry)
    async with httpx.AsyncClient(transport=transport, base_url=upstream.url) as client:
        started = time.monotonic()
        with (
            await request_for(0.3),
            pytest.raises(httpx.TimeoutException, match=r"deadline of 0\.[23]\d* s"),
        ):
            await client.get("/slow")
        assert time.monotonic() - started < 1.5
        response = await client.get("/fast")  # outside the request: no deadline
        assert response.status_code == 200


async def test_an_httpx_wait_for_a_slot_ends_with_the_request(
    upstream: Upstream, limit: MeteredSemaphore
):  # type: ignore[no-untyped-def]
    await limit.acquire(limit.limit)  # every slot held elsewhere
    transport = LimitedTransport(limit)
    async with httpx.AsyncClient(transport=transport, base_url=upstream.url) as client:
        started = time.monotonic()
        with await request_for(0.2), pytest.raises((httpx.TimeoutException, TimeoutError)):
            await client.get("/never")
        assert time.monotonic() - started < 1.5
    limit.release(limit.limit)
    assert upstream.attempts("/never") == []


async def test_an_httpx_body_ends_with_the_request(
    upstream: Upstream, limit: MeteredSemaphore
) -> None:
    upstream.script("/stream", Reply(body=b"x" * 40, chunks=4, chunk_delay=1.0))
    transport = LimitedTransport(limit)
    async with httpx.AsyncClient(transport=transport, base_url=upstream.url) as client:
        started = time.monotonic()
        with await request_for(0.5), pytest.raises(httpx.TimeoutException, match="whole body"):
            await client.get("/stream")
        assert time.monotonic() - started < 2.0
    assert limit.active == 0


async def test_an_aiohttp_call_ends_with_the_request(
    upstream: Upstream, limit: MeteredSemaphore
) -> None:
    upstream.script("/slow", Reply(delay=3))
    async with aiohttp.ClientSession(middlewares=(limited_middleware(limit),)) as session:
        started = time.monotonic()
        with (
            await request_for(0.3),
            pytest.raises(DeadlineExceeded, match=r"deadline of 0\.[23]\d* s"),
        ):
            async with session.get(upstream.url + "/slow") as response:
                await response.read()
        assert time.monotonic() - started < 1.5
    assert limit.active == 0
