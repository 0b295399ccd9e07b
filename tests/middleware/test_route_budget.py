"""A route limit with a rate budget, on a real uvicorn: each request reserves its estimate (the
route's `tokens` rule) with its slot; the reservation is settled from the usage the response
body reports as it passes (JSON or streamed), charged in full without one (an app error, a
body without usage); a request the budget cannot hold in time is refused with the route's
profile: 429 + Retry-After (when the budget holds it) for problem and openai, a non-terminal
episode failure for episode."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    RouteLimit,
    status_snapshot,
)
from opentelemetry.metrics import MeterProvider

from tests.metrics_capture import MetricsCapture
from tests.registry import limits_of
from tests.servers import UvicornServer, wait_until

PATH = "/v1/chat/completions"
PROMPT = "x" * 396  # 100 tokens of prompt at 4 characters a token


def chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, **extra}


def app() -> FastAPI:
    made = FastAPI()

    @made.post(PATH)
    async def completions(request: Request) -> Any:
        body = await request.json()
        usage = {"prompt_tokens": 100, "completion_tokens": body.get("use", 20)}
        if body.get("fail"):
            raise RuntimeError("the upstream broke")
        if body.get("no_usage"):
            return JSONResponse({"choices": []})
        if not body.get("stream"):
            return JSONResponse({"choices": [], "usage": usage})

        async def events() -> AsyncIterator[bytes]:
            yield b'data: {"choices": [{"delta": {"content": "hi"}}], "usage": null}\n\n'
            await asyncio.sleep(body.get("pause", 0))
            yield b'data: {"choices": [], "usage": ' + json.dumps(usage).encode() + b"}\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return made


def serve(
    component: str,
    failure: str = "openai",
    meter_provider: MeterProvider | None = None,
    **route: Any,
) -> UvicornServer:
    """The app on uvicorn behind the middleware: its chat route limited to 4 at a time, with a
    budget of 1,000 tokens and 100 requests a minute."""
    settings = ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path=PATH,
                limit_name="chat",
                max_concurrent=4,
                failure=failure,
                queue_timeout_seconds=0.5,
                tokens_per_minute=1000,
                requests_per_minute=100,
                tokens="openai_tokens",
                **route,
            )
        ],
    )
    made = app()
    made.add_middleware(
        ConcurrencyLimitMiddleware, settings=settings, meter_provider=meter_provider
    )
    return UvicornServer(made)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[UvicornServer]:
    with serve(request.node.name[:40]) as running:
        yield running


def tokens(component: str) -> Any:
    """The route's token budget once every request is done (the client may have its whole
    answer a moment before the server settles and releases)."""
    limit = limits_of(component)["chat"]
    wait_until(lambda: limit.active == 0, what="the requests to end")
    budget = limit.budget
    assert budget is not None
    statistics = budget.statistics().tokens
    assert statistics is not None
    return statistics


def test_a_json_answer_settles_its_reservation_to_the_usage(server: UvicornServer) -> None:
    component = "test_a_json_answer_settles_its_reservation_to_the_usage"[:40]
    answer = httpx.post(server.url + PATH, json=chat(500, use=20))
    assert answer.status_code == 200
    spent = tokens(component)
    # Reserved 100 + 500 = 600; used 100 + 20: 480 given back, nothing left reserved.
    assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 480, 880)


def test_a_streamed_answer_settles_from_its_final_usage_chunk(server: UvicornServer) -> None:
    component = "test_a_streamed_answer_settles_from_its_final_usage_chunk"[:40]
    with httpx.stream("POST", server.url + PATH, json=chat(500, use=30, stream=True)) as answer:
        assert answer.status_code == 200
        assert b"[DONE]" in answer.read()
    spent = tokens(component)
    assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 470, 870)


def test_a_client_gone_before_the_usage_came_is_charged_in_full() -> None:
    component = "client gone mid-stream"
    with serve(component) as server:
        body = chat(500, stream=True, pause=1.0)
        with httpx.stream("POST", server.url + PATH, json=body) as answer:
            next(answer.iter_raw())  # the first event, then the client leaves
        spent = tokens(component)
    assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 0, 400)


@pytest.mark.parametrize("body", [{"no_usage": True}, {"fail": True}])
def test_an_answer_without_usage_is_charged_in_full(body: dict[str, Any]) -> None:
    component = f"charged in full {sorted(body)[0]}"
    with serve(component) as server:
        answer = httpx.post(server.url + PATH, json=chat(500, **body))
        assert answer.status_code == (500 if "fail" in body else 200)
        spent = tokens(component)
    assert (spent.reserved, spent.refunded_total, spent.remaining) == (0, 0, 400)


def test_a_request_the_budget_cannot_hold_in_time_gets_429_and_when(
    server: UvicornServer,
) -> None:
    component = "test_a_request_the_budget_cannot_hold_in_time_gets_429_and_when"[:40]
    assert httpx.post(server.url + PATH, json=chat(800, use=800)).status_code == 200
    refused = httpx.post(server.url + PATH, json=chat(500))  # 600 more: not within 0.5 s
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    # The sliding minute frees the first charge 60 to 61 s after it was made.
    assert 59 <= int(refused.headers["retry-after"]) <= 61
    assert int(refused.headers["retry-after-ms"]) == 1000 * int(refused.headers["retry-after"])
    limit = limits_of(component)["chat"]
    assert limit.statistics().admission_budget == 1
    spent = tokens(component)
    assert (spent.reserved, spent.remaining) == (0, 100)  # the refused one took nothing


def test_the_problem_and_episode_profiles_answer_a_spent_budget() -> None:
    with serve("budget problem", failure="problem") as server:
        httpx.post(server.url + PATH, json=chat(800, use=800))
        refused = httpx.post(server.url + PATH, json=chat(500))
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    problem = refused.json()
    assert problem["type"] == "urn:gym-concurrency:budget-exhausted"
    assert problem["status"] == 429
    assert math.isclose(int(refused.headers["retry-after"]), 60, abs_tol=1)
    with serve("budget episode", failure="episode") as server:
        httpx.post(server.url + PATH, json=chat(800, use=800))
        refused = httpx.post(server.url + PATH, json={**chat(500), "episode_id": "e-1"})
    assert refused.status_code == 200
    assert "retry-after" not in refused.headers
    assert refused.json() == {
        "episode_id": "e-1",
        "task_id": None,
        "result": None,
        "failure": {
            "failure_reason": "Episode admission budget exhausted",
            "terminal": False,
            "stage": "admission",
        },
    }


def test_budget_instruments_and_the_refusal_outcome_are_exported(
    metrics: MetricsCapture,
) -> None:
    component = "budget instruments"
    with serve(component, meter_provider=metrics.provider) as server:
        httpx.post(server.url + PATH, json=chat(500, use=20))
        httpx.post(server.url + PATH, json=chat(900))  # never fits after 120 were spent
        tokens(component)  # both done
        mine = {"nemo.gym.concurrency.component": component}

        def points(name: str) -> dict[str, Any]:
            return {
                dict(key)["nemo.gym.concurrency.budget"]: value
                for key, value in metrics.values(name).items()
                if mine.items() <= dict(key).items()
            }

        assert points("gym.concurrency.budget.limit") == {"tokens": 1000, "requests": 100}
        assert points("gym.concurrency.budget.remaining") == {"tokens": 880, "requests": 99}
        assert points("gym.concurrency.budget.reserved") == {"tokens": 0, "requests": 0}
        assert points("gym.concurrency.budget.refunded_total") == {"tokens": 480, "requests": 0}
        [row] = [r for r in status_snapshot()["limits"] if r["component"] == component]
        assert [(b["budget"], b["remaining"], b["limit"]) for b in row["budgets"]] == [
            ("tokens", 880, 1000),
            ("requests", 99, 100),
        ]
        waits = metrics.values("gym.concurrency.queue_wait_duration_ms")
        outcomes = {
            dict(key)["nemo.gym.concurrency.admission_outcome"]: point.count
            for key, point in waits.items()
            if mine.items() <= dict(key).items()
        }
        assert outcomes == {"admitted": 1, "budget": 1}
