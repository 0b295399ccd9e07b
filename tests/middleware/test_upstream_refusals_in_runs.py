"""A refusal for a rate budget or an engine, met inside a NeMo Gym run(), is a refusal
(gym_concurrency.middleware.nemo_gym): a route's 429 / 503 read by its problem type or openai
code, an inner environment server's episode failure, and a limit's own UpstreamCapacityError,
each of its own kind (`budget_exhausted`, `engine_saturated`), so that it ends as a
non-terminal failure `--resume` retries."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from gym_concurrency.middleware.nemo_gym import (
    EpisodeRefusedError,
    RefusalMet,
    raise_for_episode_refusal,
    refusal_of,
)

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits.rate_budget import RateBudget


async def refused(component: str, failure: str) -> RefusalMet:
    """The refusal read from a route whose budget (100 tokens a minute) a first request of 80
    spent: the second is refused as it arrives."""
    app = FastAPI()

    @app.post("/run")
    async def run() -> dict[str, Any]:
        return {"usage": {"prompt_tokens": 80, "completion_tokens": 0}}

    route = RouteLimit(
        path="/run",
        limit_name="run",
        max_concurrent=4,
        failure=failure,
        queue_timeout_seconds=0.1,
        tokens_per_minute=100,
        tokens="json:tokens",
    )
    app.add_middleware(
        ConcurrencyLimitMiddleware,
        settings=ConcurrencySettings(component=component, routes=[route]),
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inner") as client:
        assert (await client.post("/run", json={"tokens": 80})).status_code == 200
        reply = await client.post("/run", json={"tokens": 80, "episode_id": "e"})
    if failure == "episode":
        with pytest.raises(EpisodeRefusedError) as raised:
            raise_for_episode_refusal(reply.json())
        refusal = refusal_of(raised.value)
    else:
        assert reply.status_code == 429
        with pytest.raises(httpx.HTTPStatusError) as status:
            reply.raise_for_status()
        refusal = refusal_of(status.value)
    assert refusal is not None
    return refusal


@pytest.mark.parametrize("failure", ["problem", "openai", "episode"])
async def test_a_spent_budget_at_an_inner_hop_is_its_own_refusal(failure: str) -> None:
    refusal = await refused(f"budget refusal {failure}", failure)
    assert refusal.failure_kind == "gym_concurrency:budget_exhausted"


async def test_a_limits_own_upstream_refusal_is_its_own_kind() -> None:
    budget = RateBudget(tokens_per_minute=100)
    limit = MeteredSemaphore(
        4, component="own upstream refusal", limit_name="m", timeout=0.1, budget=budget
    )
    await limit.acquire(tokens=80)
    limit.release()
    with pytest.raises(TimeoutError) as raised:
        await limit.acquire(tokens=80)
    refusal = refusal_of(raised.value)
    assert refusal is not None
    assert refusal.kind == "budget_exhausted"
