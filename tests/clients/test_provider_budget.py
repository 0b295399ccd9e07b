"""Outbound calls on a limit with a rate budget, against the fake hosted provider
(benchmarks/_fake_provider.py on a real uvicorn), through httpx and aiohttp: each call reserves
its estimate (`tokens=openai_tokens`) with its slot, is settled to the usage its body reports
as the caller reads it (JSON or streamed), charged in full when closed unread; the provider's
rate-limit headers reach the budget on every answer, a 429's included, so that a provider that
has seen more than this process (another key holder) stops the next call here, before it
goes, with an UpstreamCapacityError saying when the budget holds it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest

from benchmarks._fake_provider import FakeProvider
from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import LimitedTransport, limited_middleware, openai_tokens
from gym_concurrency.limits import UpstreamCapacityError
from gym_concurrency.limits.rate_budget import BudgetStatistics, RateBudget
from tests.servers import UvicornServer

PATH = "/v1/chat/completions"
PROMPT = [{"role": "user", "content": "x" * 396}]  # 100 tokens, as both sides price it


def chat(max_tokens: int, **more: Any) -> dict[str, Any]:
    return {"model": "fake", "messages": PROMPT, "max_tokens": max_tokens, **more}


@pytest.fixture
def provider() -> Iterator[UvicornServer]:
    # The provider uses half of each call's max_tokens: 100 + 150 of an estimate of 400.
    with UvicornServer(FakeProvider(1000, 100, completion_share=0.5), lifespan="off") as server:
        yield server


def budgeted(name: str, tokens_per_minute: int = 1000) -> MeteredSemaphore:
    budget = RateBudget(tokens_per_minute=tokens_per_minute, requests_per_minute=100)
    return MeteredSemaphore(4, component="provider", limit_name=name, timeout=0.3, budget=budget)


def tokens(limit: MeteredSemaphore) -> BudgetStatistics:
    assert limit.budget is not None
    found = limit.budget.statistics().tokens
    assert found is not None
    return found


async def test_httpx_calls_settle_from_json_and_streamed_usage(provider: UvicornServer) -> None:
    limit = budgeted("httpx settles")
    transport = LimitedTransport(limit, tokens=openai_tokens)
    async with httpx.AsyncClient(base_url=provider.url, transport=transport) as client:
        answer = await client.post(PATH, json=chat(300))
        assert answer.json()["usage"]["completion_tokens"] == 150
        spent = tokens(limit)
        assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 150, 750)
        assert spent.reported_remaining == 750  # the provider's header, told to the budget
        stream = chat(300, stream=True, stream_options={"include_usage": True})
        async with client.stream("POST", PATH, json=stream) as streamed:
            async for _ in streamed.aiter_bytes():
                pass
        spent = tokens(limit)
        assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 300, 500)
        async with client.stream("POST", PATH, json=chat(100)) as unread:
            assert unread.status_code == 200  # closed without reading: charged in full
        spent = tokens(limit)
        assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 300, 300)
    assert limit.active == 0


async def test_aiohttp_calls_settle_from_json_and_streamed_usage(provider: UvicornServer) -> None:
    limit = budgeted("aiohttp settles")
    middleware = limited_middleware(limit, tokens=openai_tokens)
    async with aiohttp.ClientSession(provider.url, middlewares=(middleware,)) as session:
        async with session.post(PATH, json=chat(300)) as answer:
            assert (await answer.json())["usage"]["completion_tokens"] == 150
        spent = tokens(limit)
        assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 150, 750)
        assert spent.reported_remaining == 750
        stream = chat(300, stream=True, stream_options={"include_usage": True})
        async with session.post(PATH, json=stream) as streamed:
            async for _ in streamed.content.iter_any():
                pass
        spent = tokens(limit)
        assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 300, 500)
    assert limit.active == 0


async def test_a_provider_that_saw_more_stops_the_next_call_before_it_goes(
    provider: UvicornServer,
) -> None:
    # Another holder of the key spent 800 tokens: the provider has 200 left, the budget here
    # thinks 5000. The 429 is charged in full and its headers tighten the budget.
    async with httpx.AsyncClient(base_url=provider.url) as other:
        assert (await other.post(PATH, json=chat(1400))).status_code == 200  # 100 + 700
    limit = budgeted("provider saw more", tokens_per_minute=5000)
    transport = LimitedTransport(limit, tokens=openai_tokens)
    async with httpx.AsyncClient(base_url=provider.url, transport=transport) as client:
        refused = await client.post(PATH, json=chat(300))  # 400 > 200 left at the provider
        assert refused.status_code == 429
        spent = tokens(limit)
        assert spent.reported_remaining == 200
        assert (spent.reserved, spent.refunded_total) == (0, 0)  # charged in full
        with pytest.raises(UpstreamCapacityError) as caught:
            await client.post(PATH, json=chat(300))
    assert caught.value.reason == "budget"
    assert caught.value.retry_after is not None
    assert 0 < caught.value.retry_after <= 61
    assert limit.statistics().admission_budget == 1
    assert limit.active == 0


async def test_a_call_cancelled_while_it_waits_for_the_budget_takes_nothing(
    provider: UvicornServer,
) -> None:
    budget = RateBudget(tokens_per_minute=1000, requests_per_minute=100)
    limit = MeteredSemaphore(4, component="provider", limit_name="cancelled", budget=budget)
    transport = LimitedTransport(limit, tokens=openai_tokens)
    async with httpx.AsyncClient(base_url=provider.url, transport=transport) as client:
        await client.post(PATH, json=chat(800))  # 900 reserved, 500 used: 500 left
        waiting = asyncio.create_task(client.post(PATH, json=chat(600)))  # 700: waits
        await asyncio.sleep(0.1)
        assert limit.queue_depth == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    spent = tokens(limit)
    assert (spent.reserved, spent.remaining, limit.active, limit.queue_depth) == (0, 500, 0, 0)
