"""The failure responses of a refusal for a route's rate budget or its engine, as
docs/failure-responses.md prints them: byte for byte the same bodies (for the route the doc
describes), 429 for a spent budget in the problem and openai profiles with its Retry-After the
budget's wait, 503 for a saturated engine, the episode profile's non-terminal 200 for both."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from gym_concurrency.middleware import RouteLimit
from gym_concurrency.middleware.failures import RouteFailures

DOC = Path(__file__).parents[2] / "docs" / "failure-responses.md"


def documented() -> list[Any]:
    blocks = re.findall(r"```json\s*\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    return [json.loads(block) for block in blocks]


def route(failure: str) -> RouteLimit:
    name, path = (
        ("upstream", "/v1/chat/completions") if failure == "openai" else ("episodes", "/run")
    )
    return RouteLimit(
        path=path, limit_name=name, max_concurrent=1, failure=failure, tokens_per_minute=1000
    )


async def answer(
    failures: RouteFailures, reason: Any, **kwargs: Any
) -> tuple[int, dict[bytes, bytes], Any]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    body = b'{"episode_id": "ep-1", "task": {"task_id": "t-1"}}'
    await failures.send(send, reason, body, **kwargs)
    return sent[0]["status"], dict(sent[0]["headers"]), json.loads(sent[1]["body"])


@pytest.mark.parametrize("failure", ["problem", "openai", "episode"])
@pytest.mark.parametrize("reason", ["budget", "saturated"])
async def test_each_profile_answers_as_the_doc_prints(failure: str, reason: str) -> None:
    status, headers, body = await answer(RouteFailures(route(failure)), reason, budget_wait=42)
    if reason == "saturated" and failure == "episode":
        assert body["failure"]["failure_reason"] == "Episode admission engine saturated"
    else:
        assert body in documented()
    if failure == "episode":
        assert (status, b"retry-after" in headers) == (200, False)
        return
    assert status == (429 if reason == "budget" else 503)
    assert headers[b"retry-after"] == (b"42" if reason == "budget" else b"1")
    if failure == "openai":
        assert headers[b"retry-after-ms"] == headers[b"retry-after"] + b"000"


async def test_a_budget_refusal_without_a_known_wait_says_the_routes_retry_after() -> None:
    config = route("problem").model_copy(update={"queue_timeout_seconds": 2.5})
    _, headers, _ = await answer(RouteFailures(config), "budget")
    assert headers[b"retry-after"] == b"3"
