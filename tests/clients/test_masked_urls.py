"""An outbound call's errors show its URL without secrets: a deadline passed on a call whose
query carries a key (httpx and aiohttp, a real upstream), a flow function's bad value, and a
refusal's detail."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import pytest
from gym_concurrency.middleware.nemo_gym import refusal_of
from upstream import Reply, Upstream

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import DeadlineExceeded, LimitedTransport, limited_middleware
from gym_concurrency.deadline import within_deadline

QUERY = {"api_key": "SECRET-KEY-VALUE", "model": "judge"}
SHOWN = "/slow?api_key=***&model=judge"


async def test_an_httpx_deadline_error_masks_the_key(
    upstream: Upstream, limit: MeteredSemaphore
) -> None:
    upstream.script("/slow", Reply(delay=3))
    transport = LimitedTransport(limit)
    async with httpx.AsyncClient(transport=transport, base_url=upstream.url) as client:
        with (
            within_deadline(asyncio.get_running_loop().time() + 0.2),
            pytest.raises(httpx.TimeoutException) as error,
        ):
            await client.get("/slow", params=QUERY)
    assert SHOWN in str(error.value)
    assert "SECRET-KEY-VALUE" not in str(error.value)


async def test_an_aiohttp_deadline_error_masks_the_key(
    upstream: Upstream, limit: MeteredSemaphore
) -> None:
    upstream.script("/slow", Reply(delay=3))
    async with aiohttp.ClientSession(middlewares=(limited_middleware(limit),)) as session:
        with (
            within_deadline(asyncio.get_running_loop().time() + 0.2),
            pytest.raises(DeadlineExceeded) as error,
        ):
            async with session.get(upstream.url + "/slow", params=QUERY) as response:
                await response.read()
    assert SHOWN in str(error.value)
    assert "SECRET-KEY-VALUE" not in str(error.value)


def test_a_refusal_detail_masks_the_url() -> None:
    request = httpx.Request("POST", "http://hop/v1/responses?token=SECRET-TOKEN")
    response = httpx.Response(503, content=b"busy", request=request)
    refusal = refusal_of(httpx.HTTPStatusError("503", request=request, response=response))
    assert refusal is not None
    assert refusal.detail.startswith("http://hop/v1/responses?token=*** answered 503")


async def test_a_bad_flow_function_s_error_masks_the_url(
    upstream: Upstream, limit: MeteredSemaphore
) -> None:
    transport = LimitedTransport(limit, flow=lambda request: ["not", "hashable"])
    async with httpx.AsyncClient(transport=transport, base_url=upstream.url) as client:
        with pytest.raises(TypeError, match="a flow is hashable") as error:
            await client.get("/slow", params=QUERY)
    assert SHOWN in str(error.value)
    assert "SECRET-KEY-VALUE" not in str(error.value)
