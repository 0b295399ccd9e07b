"""The middlewares users stack around ours, over a real server: uvicorn (h11) on 127.0.0.1,
flooded through each outer middleware of the matrix (NeMo Gym's only on 3.13). Queued
bodies reach the app whole, refusals are answered with their ids, every slot comes back.
tests/nemo_gym/test_body_race.py takes each of them through the race step by step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.nemo_gym.requires import needs_nemo_gym
from tests.nemo_gym.stacks import (
    NEEDS_NEMO_GYM,
    OUTER_MIDDLEWARES,
    episode_settings,
    limited_app,
    slot_of,
)
from tests.servers import UvicornServer, eventually

FLOODS = 10
REQUESTS_PER_FLOOD = 16
IN_FLIGHT = 8  # a new request goes out as soon as one returns
HOLD_SECONDS = [0.0, 0.001, 0.002, 0.004, 0.05]  # how long the app holds an admitted request


def stacks() -> Iterator[Any]:
    for outer in OUTER_MIDDLEWARES:
        marks = [needs_nemo_gym] if outer in NEEDS_NEMO_GYM else []
        yield pytest.param(outer, marks=marks, id=outer)
    yield pytest.param("nemo_gym_run_webserver", marks=[needs_nemo_gym], id="nemo_gym_webserver")


def make_app(outer: str, component: str) -> Any:
    settings = episode_settings(
        component, max_concurrent=2, queue_timeout_seconds=0.03, max_queue=4
    )
    if outer == "nemo_gym_run_webserver":
        from tests.nemo_gym.environment import build_app, echo_server

        return build_app(echo_server(settings))
    return limited_app(settings, outer)[0]


def request_body(outer: str, flood: int, number: int, hold: float) -> dict[str, Any]:
    if outer == "nemo_gym_run_webserver":  # NeMo Gym's /run parses a typed episode request
        return {
            "episode_id": {"rollout_id": f"{flood}-{number}", "attempt": 0},
            "task": {
                "task_id": {"taskset": "echo:train", "task_id": str(number)},
                "task_input": {"prompt": f"prompt {flood}-{number}", "run_seconds": hold},
            },
        }
    return {
        "episode_id": f"{flood}-{number}",
        "task": {"task_id": str(number), "hold": hold, "padding": "x" * (number * 97)},
    }


def judge(outer: str, sent: dict[str, Any], reply: httpx.Response) -> str:
    """'admitted' or the refusal reason; fails the test on anything else."""
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    if answer.get("failure") is None:
        result = answer["result"]
        if outer == "nemo_gym_run_webserver":
            assert result["response"] == sent["task"]["task_input"]["prompt"]
        else:  # the app echoes the body it read: it arrived whole
            assert json.loads(result["body"]) == sent
        return "admitted"
    assert answer["episode_id"] == sent["episode_id"]
    assert answer["task_id"] == sent["task"]["task_id"]
    assert answer["result"] is None
    assert answer["failure"]["terminal"] is False
    return answer["failure"]["failure_reason"]


@pytest.mark.parametrize("outer", list(stacks()))
async def test_floods_through_the_outer_middleware(
    outer: str, component: str, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING)
    app = make_app(outer, component)
    outcomes: Counter[str] = Counter()
    with UvicornServer(app, http="h11") as server:
        limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
        async with httpx.AsyncClient(base_url=server.url, timeout=5, limits=limits) as client:
            in_flight = asyncio.Semaphore(IN_FLIGHT)

            async def one(flood: int, number: int, rng: random.Random) -> str:
                body = request_body(outer, flood, number, rng.choice(HOLD_SECONDS))
                async with in_flight:
                    reply = await client.post("/run", json=body)
                return judge(outer, body, reply)

            for flood in range(FLOODS):
                rng = random.Random(flood)
                results = await asyncio.gather(
                    *(one(flood, number, rng) for number in range(REQUESTS_PER_FLOOD))
                )
                outcomes.update(results)
                limit = slot_of(component)
                await eventually(
                    lambda limit=limit: (limit.active, limit.queue_depth) == (0, 0),
                    f"every slot back after flood {flood + 1} behind {outer}",
                )
    if outer in ("fastapi_native_telemetry", "all_of_them"):  # FastAPI's layer really ran
        # A server span per request: "POST /run" once routed, "POST" when refused before.
        names = Counter(span.name for span in app.state.spans.get_finished_spans())
        assert names["POST /run"] == outcomes["admitted"], names
        assert names["POST"] == FLOODS * REQUESTS_PER_FLOOD - outcomes["admitted"], names
    assert sum(outcomes.values()) == FLOODS * REQUESTS_PER_FLOOD
    assert outcomes["admitted"] > 0
    assert outcomes["Episode admission queue full"] > 0, outcomes
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
