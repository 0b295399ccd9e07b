"""A bounded `episode` queue that sheds is warned about once, with its numbers: an episode
refusal is answered at once, so a rollout collector with more rollouts in flight than slots
plus queue has each refusal make room for the next one (docs/settings.md)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from apps import make_app
from gym_concurrency.middleware import ConcurrencySettings, RouteLimit
from servers import eventually

from tests.registry import limits_of


def cascade_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "gym_concurrency.middleware" and "full queue" in record.getMessage()
    ]


def state(component: str) -> tuple[int, int] | None:
    limit = limits_of(component).get("episodes")  # made at the app's first request
    return None if limit is None else (limit.active, limit.queue_depth)


async def flood(component: str, failure: str, rounds: int) -> list[int]:
    """`rounds` times: 2 requests held (1 running, 1 queued) and 3 more refused at once, on a
    route of 1 slot and max_queue 1. The statuses of the refused ones."""
    route = RouteLimit(
        path="/run", limit_name="episodes", max_concurrent=1, max_queue=1, failure=failure
    )
    app, gate = make_app(ConcurrencySettings(component=component, routes=[route]))
    transport = httpx.ASGITransport(app=app)
    statuses = []
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for _ in range(rounds):
            gate.open = False
            held = [asyncio.create_task(client.post("/run", content=b"{}")) for _ in range(2)]
            await eventually(lambda: state(component) == (1, 1), "1 running, 1 queued")
            refused: list[Any] = await asyncio.gather(
                *(client.post("/run", content=b"{}") for _ in range(3))
            )
            statuses += [reply.status_code for reply in refused]
            gate.open = True
            assert [(await task).status_code for task in held] == [200, 200]
    return statuses


async def test_an_episode_route_that_sheds_is_warned_about_once(
    component: str, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING, logger="gym_concurrency.middleware")
    statuses = await flood(component, "episode", rounds=3)
    assert statuses == [200] * 9  # every one an episode failure body
    assert limits_of(component)["episodes"].admission_shed == 9
    [warning] = cascade_warnings(caplog)
    assert warning.startswith(
        "gym_concurrency: route /run (limit 'episodes', failure 'episode') refused a request "
        "from a full queue: 1 running (max_concurrent=1), 1 queued (max_queue=1), so at least 3 "
        "requests arrived at once."
    )
    assert "num_samples_in_parallel" in warning
    assert "here more than 1" in warning


@pytest.mark.parametrize("failure", ["problem", "openai"])
async def test_a_503_route_that_sheds_is_not_warned_about(
    component: str, failure: str, caplog: pytest.LogCaptureFixture
):
    # A 503 is not answered as a finished episode: the collector does not move on to its next
    # task (it ends the run, docs/nemo-gym.md), so there is no cascade to warn about.
    caplog.set_level(logging.WARNING, logger="gym_concurrency.middleware")
    assert await flood(component, failure, rounds=1) == [503] * 3
    assert cascade_warnings(caplog) == []
