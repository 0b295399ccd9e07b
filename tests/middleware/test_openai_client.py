"""What openai-python's own client does with the `openai` profile's 503, measured for
docs/failure-responses.md: it retries (max_retries, 2 by default) after `Retry-After` when that
is within its cap (60 s in openai 2.x, 120 s in 3.x); past the cap 2.x retries after its own
backoff (0.5 s doubling, with jitter) and 3.x does not retry. NeMo Gym's model client, which
ignores `Retry-After`, is measured in tests/nemo_gym/test_environment_server.py."""

from __future__ import annotations

import itertools
import time
from typing import Any

import openai
import pytest
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit

from tests.registry import limits_of
from tests.servers import UvicornServer


def openai_app(component: str, retry_after_seconds: int, arrivals: list[float]) -> Any:
    """/v1/chat/completions limited to 1 slot, refused at once (max_queue=0) with the openai
    profile; every request's arrival time recorded."""
    settings = ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path="/v1/chat/completions",
                limit_name="upstream",
                max_concurrent=1,
                max_queue=0,
                failure="openai",
                retry_after_seconds=retry_after_seconds,
            )
        ],
    )
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions() -> dict[str, Any]:
        raise AssertionError("never admitted: the test holds the only slot")

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            arrivals.append(time.monotonic())
        await app(scope, receive, send)

    return timed


async def refused_attempts(
    component: str, retry_after_seconds: int, max_retries: int, attempts: int
) -> tuple[openai.APIStatusError, list[float]]:
    """The error openai-python raises and the gaps between its attempts, the slot held."""
    arrivals: list[float] = []
    with UvicornServer(openai_app(component, retry_after_seconds, arrivals)) as server:
        slot = limits_of(component)["upstream"]
        assert slot.try_acquire()  # the only slot: every attempt is refused at once
        try:
            client = openai.AsyncOpenAI(
                base_url=server.url + "/v1", api_key="k", max_retries=max_retries
            )
            with pytest.raises(openai.InternalServerError) as raised:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
            await client.close()
        finally:
            slot.release()
    assert len(arrivals) == attempts
    return raised.value, [later - earlier for earlier, later in itertools.pairwise(arrivals)]


async def test_openai_python_retries_a_503_after_retry_after(component: str):
    error, gaps = await refused_attempts(
        component, retry_after_seconds=2, max_retries=2, attempts=3
    )
    assert error.status_code == 503
    assert error.code == "queue_full"  # the openai profile's body, read as an OpenAI error
    assert all(1.9 < gap < 3.5 for gap in gaps), gaps  # Retry-After's 2 s, not 0.5 s / 1 s


async def test_past_its_cap_openai_python_backs_off_by_itself_or_stops(component: str):
    # The cap and what happens past it changed between versions: openai 2.x (the one NeMo
    # Gym 0.7.0 pins, on Python 3.13 here) retries after its own backoff past 60 s; 3.x
    # honours up to 120 s and does not retry past that.
    major = int(openai.__version__.split(".")[0])
    error, gaps = await refused_attempts(
        component, retry_after_seconds=300, max_retries=1, attempts=2 if major < 3 else 1
    )
    assert error.status_code == 503
    assert all(gap < 2.0 for gap in gaps), gaps  # its own backoff (0.375-0.5 s), not 300 s
