"""The caller's cancellation, at every point of a limited call, through httpx and aiohttp, one
slot a call or weight 3 in a flow: it is never retried, and whatever was held is given back, the
same weight in the same flow (the limit fixture checks none leaked, in any flow)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import RetryPolicy
from tests.clients.callers import KINDS, Caller
from tests.clients.upstream import Reply, Upstream
from tests.servers import eventually

POLICY = RetryPolicy(backoff_seconds=0.01, backoff_max_seconds=0.05)

# What each call asks for: the default (one slot), or weight 3 in the flow of its x-env header.
ASKS: dict[str, dict[str, Any]] = {
    "one_slot": {},
    "weighed": {"weight": 3, "flow": lambda request: request.headers.get("x-env")},
}
HEADERS = {"x-env": "env-a"}

pytestmark = [
    pytest.mark.parametrize("kind", KINDS),
    pytest.mark.parametrize("ask", list(ASKS)),
]


def weight_of(ask: str) -> int:
    return int(ASKS[ask].get("weight", 1))


async def cancelled(task: asyncio.Task[object]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancelled_while_waiting_for_a_slot(
    kind: str, ask: str, upstream: Upstream, limit: MeteredSemaphore
):
    for _ in range(limit.limit):
        await limit.acquire()  # every slot held elsewhere
    async with Caller(kind, upstream.url, limit, POLICY, **ASKS[ask]) as caller:
        call = asyncio.create_task(caller.get("/judge", HEADERS))
        await eventually(lambda: limit.queue_depth == 1, "the call to queue for a slot")
        await cancelled(call)
        assert (limit.queue_depth, limit.admission_cancelled) == (0, 1)
        for _ in range(limit.limit):
            limit.release()
        assert await caller.get("/judge", HEADERS) == (200, b'{"attempt": 1}')  # still works
    assert len(upstream.attempts("/judge")) == 1


async def test_cancelled_during_an_attempt(
    kind: str, ask: str, upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/judge", Reply(delay=3))
    async with Caller(kind, upstream.url, limit, POLICY, **ASKS[ask]) as caller:
        call = asyncio.create_task(caller.get("/judge", HEADERS))
        await eventually(lambda: upstream.active == 1, "the attempt to reach the upstream")
        assert limit.active == weight_of(ask)
        await cancelled(call)
        assert limit.active == 0
        await asyncio.sleep(0.3)
    assert len(upstream.attempts("/judge")) == 1  # not retried


async def test_cancelled_while_reading_the_body(
    kind: str, ask: str, upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/judge", Reply(chunks=20, chunk_delay=0.1, body=b"x" * 200))
    async with Caller(kind, upstream.url, limit, POLICY, **ASKS[ask]) as caller:
        call = asyncio.create_task(caller.get("/judge", HEADERS))
        await eventually(lambda: upstream.attempts("/judge")[-1:] != [], "the attempt")
        await eventually(
            lambda: upstream.attempts("/judge")[0].answered is not None, "the headers sent"
        )
        await asyncio.sleep(0.25)  # a few chunks read
        assert limit.active == weight_of(ask)
        await cancelled(call)
        assert limit.active == 0
        await asyncio.sleep(0.3)
    assert len(upstream.attempts("/judge")) == 1


async def test_cancelled_while_backing_off(
    kind: str, ask: str, upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/judge", Reply(429, {"retry-after-ms": "3000"}))
    async with Caller(kind, upstream.url, limit, POLICY, **ASKS[ask]) as caller:
        call = asyncio.create_task(caller.get("/judge", HEADERS))
        await eventually(lambda: len(upstream.attempts("/judge")) == 1, "the first attempt")
        await eventually(lambda: limit.active == 0, "the backoff (holding no slot)")
        await asyncio.sleep(0.1)
        assert not call.done()
        await cancelled(call)
        await asyncio.sleep(0.3)
    assert len(upstream.attempts("/judge")) == 1  # the retry was never made
