"""A configured client limit with a budget (`ClientLimit.tokens_per_minute`, `tokens`): the
transports and middlewares made from it reserve each call's estimate by the settings' rule and
settle it from the usage read, against the fake provider on a real uvicorn; a reload resizes
the budget and changes the rule for every transport made so far."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from gym_concurrency.middleware import ClientLimit, ConcurrencySettings
from gym_concurrency.middleware.limits import ConcurrencyLimits

from benchmarks._fake_provider import FakeProvider
from tests.servers import UvicornServer

PATH = "/v1/chat/completions"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "x" * 396}], "max_tokens": 300}


@pytest.fixture
def provider() -> Iterator[UvicornServer]:
    with UvicornServer(FakeProvider(10_000, 100, completion_share=0.5), lifespan="off") as server:
        yield server


def settings(component: str, **client: Any) -> ConcurrencySettings:
    config = {"limit_name": "model", "max_concurrent": 4, "requests_per_minute": 100, **client}
    return ConcurrencySettings(component=component, clients=[ClientLimit(**config)])


def tokens(limits: ConcurrencyLimits) -> Any:
    budget = limits.client("model").limit.budget
    return budget.statistics().tokens


async def test_configured_transports_reserve_by_the_rule_and_settle(
    provider: UvicornServer,
) -> None:
    limits = ConcurrencyLimits(
        settings("configured budget", tokens_per_minute=1000, tokens="openai_tokens")
    )
    model = limits.client("model")
    async with httpx.AsyncClient(base_url=provider.url, transport=model.transport()) as client:
        assert (await client.post(PATH, json=CHAT)).status_code == 200
    spent = tokens(limits)  # reserved 100 + 300, used 100 + 150
    assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 150, 750)
    middleware = model.middleware()
    async with (
        aiohttp.ClientSession(provider.url, middlewares=(middleware,)) as session,
        session.post(PATH, json=CHAT) as answer,
    ):
        await answer.read()
    spent = tokens(limits)
    assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 300, 500)


async def test_a_reload_resizes_the_budget_and_changes_the_rule(provider: UvicornServer) -> None:
    first = ConcurrencyLimits(settings("reloaded budget", tokens_per_minute=1000))
    transport = first.client("model").transport()
    second = ConcurrencyLimits(
        settings("reloaded budget", tokens_per_minute=2000, tokens=50), previous=first
    )
    assert second.apply() == [
        "client limit 'model': tokens_per_minute 1000 -> 2000",
        "client limit 'model': tokens None -> 50",
    ]
    async with httpx.AsyncClient(base_url=provider.url, transport=transport) as client:
        assert (await client.post(PATH, json=CHAT)).status_code == 200
    spent = tokens(second)  # reserved 50 by the new rule; used 250: 200 more charged
    assert spent.limit == 2000
    assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 0, 1750)
