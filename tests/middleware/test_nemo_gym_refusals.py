"""gym_concurrency.middleware.nemo_gym without NeMo Gym (every Python): which errors are refusals,
read from the real failure responses the middleware sends and the real errors limits raise.
Turning them into NeMo Gym's HandledEpisodeError, read by its collector, is
tests/nemo_gym/test_refusals_in_run.py (Python 3.13)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
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
    refusals_as_episode_failures,
)

from gym_concurrency import DeadlineExceededError, MeteredSemaphore, QueueFullError
from tests.registry import limits_of
from tests.uvicorn_process import clean_env


def limited_app(component: str, failure: str, **limit: Any) -> FastAPI:
    app = FastAPI()

    @app.post("/work")
    async def work() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/broken")
    async def broken() -> None:
        raise RuntimeError("a bug")

    route = RouteLimit(path="/work", limit_name="work", max_concurrent=1, failure=failure, **limit)
    settings = ConcurrencySettings(component=component, routes=[route])
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    return app


async def refused(
    component: str,
    failure: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    **limit: Any,
) -> RefusalMet:
    """The refusal read from the error httpx raises for the route's failure response (to a
    request with `headers`), its only slot held by a request in flight."""
    app = limited_app(component, failure, **limit)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://inner") as client:
        assert (await client.post("/work", json=body)).status_code == 200
        slot = limits_of(component)["work"]
        await slot.acquire()
        try:
            reply = await client.post("/work", json=body, headers=headers)
        finally:
            slot.release()
    if failure == "episode":
        assert reply.status_code == 200
        with pytest.raises(EpisodeRefusedError) as raised:
            raise_for_episode_refusal(reply.json())
        refusal = refusal_of(raised.value)
    else:
        with pytest.raises(httpx.HTTPStatusError) as raised_status:
            reply.raise_for_status()
        refusal = refusal_of(raised_status.value)
    assert refusal is not None
    return refusal


@pytest.mark.parametrize("failure", ["problem", "openai"])
async def test_a_503_refusal_is_read_by_its_type_or_code(request: pytest.FixtureRequest, failure):
    component = f"refusal_{failure}_{request.node.name[-8:]}"
    timeout = await refused(component + "_t", failure, queue_timeout_seconds=0.01)
    assert timeout.kind == "admission_timeout"
    assert timeout.failure_kind == "gym_concurrency:admission_timeout"
    assert timeout.detail.startswith("http://inner/work answered 503: No slot of limit 'work'")
    full = await refused(component + "_q", failure, max_queue=0)
    assert full.kind == "queue_full"
    assert "already has 0 requests queued" in full.detail
    late = await refused(component + "_d", failure, None, {"x-ms": "0"}, deadline="header:x-ms")
    assert late.kind == "deadline_exceeded"
    assert "The request's deadline passed" in late.detail


async def test_an_episode_refusal_is_read_from_the_reply():
    body = {
        "episode_id": {"rollout_id": "r-1", "attempt": 0},
        "task": {"task_id": {"taskset": "t", "task_id": "1"}},
    }
    timeout = await refused("refusal_episode_t", "episode", body, queue_timeout_seconds=0.01)
    assert timeout == RefusalMet(
        "admission_timeout", "an inner environment server: Episode admission timed out"
    )
    full = await refused("refusal_episode_q", "episode", body, max_queue=0)
    assert full.kind == "queue_full"
    late = await refused(
        "refusal_episode_d", "episode", body, {"x-ms": "0"}, deadline="header:x-ms"
    )
    assert late == RefusalMet(
        "deadline_exceeded", "an inner environment server: Episode admission deadline exceeded"
    )


def test_an_episode_reply_that_is_no_refusal_raises_nothing():
    result = {"episode_id": {}, "task_id": {}, "result": {"reward": 1.0}, "failure": None}
    raise_for_episode_refusal(result)
    failed = {"failure": {"failure_reason": "Episode timed out", "terminal": False}}
    raise_for_episode_refusal(failed)  # a failure, but not an admission refusal
    terminal = {
        "failure": {
            "failure_reason": "Episode admission timed out",
            "terminal": True,
            "stage": "admission",
        }
    }
    raise_for_episode_refusal(terminal)


def http_error(status: int, content: bytes = b"", **headers: str) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://hop/v1/responses")
    response = httpx.Response(status, content=content, headers=headers, request=request)
    return httpx.HTTPStatusError(f"{status}", request=request, response=response)


def test_an_overloaded_hop_is_a_refusal_other_errors_are_not():
    for status in (429, 502, 503, 504):
        refusal = refusal_of(http_error(status, b'{"error": "busy"}'))
        assert refusal is not None
        assert refusal.kind == "overloaded"
        assert refusal.detail == (
            f'http://hop/v1/responses answered {status}, after any retries: {{"error": "busy"}}'
        )
    for status in (400, 404, 422, 500):  # the hop's answer, not its load: left to fail
        assert refusal_of(http_error(status)) is None
    assert refusal_of(RuntimeError("a bug")) is None
    assert refusal_of(ValueError("bad")) is None


async def test_a_local_limit_refusal_is_a_refusal():
    limit = MeteredSemaphore(1, timeout=0.01, max_queue=1)
    await limit.acquire()
    with pytest.raises(TimeoutError) as timed_out:
        await limit.acquire()
    refusal = refusal_of(timed_out.value)
    assert refusal is not None
    assert refusal.kind == "timeout"
    assert "no slot within 0.01 s" in refusal.detail
    waiter = asyncio.ensure_future(limit.acquire())
    await asyncio.sleep(0)
    with pytest.raises(QueueFullError) as full:
        await limit.acquire()
    refusal = refusal_of(full.value)
    assert refusal is not None
    assert refusal.kind == "queue_full"
    assert "1 tasks already waiting (max_queue=1)" in refusal.detail
    waiter.cancel()
    limit.release()


async def test_a_local_limits_deadline_refusal_is_its_own_kind():
    limit = MeteredSemaphore(1, timeout=30)
    await limit.acquire()
    with pytest.raises(DeadlineExceededError) as late:
        await limit.acquire(deadline=0.01)
    refusal = refusal_of(late.value)
    assert refusal is not None
    assert refusal.failure_kind == "gym_concurrency:deadline_exceeded"
    assert "no slot within the deadline" in refusal.detail
    limit.release()


def test_a_non_refusal_passes_through_the_block_unchanged():
    error = RuntimeError("a bug")
    with pytest.raises(RuntimeError) as raised, refusals_as_episode_failures("agent"):
        raise error
    assert raised.value is error


def test_a_stage_nemo_gym_does_not_have_is_refused_at_the_block():
    expected = r"stage must be one of \('admission', 'seed', 'agent'"
    with pytest.raises(ValueError, match=expected):
        refusals_as_episode_failures("verify").__enter__()  # type: ignore[arg-type]


def test_the_module_imports_without_nemo_gym_aiohttp_or_httpx():
    code = (
        "import sys, gym_concurrency.middleware.nemo_gym\n"
        "loaded = {'nemo_gym', 'aiohttp', 'httpx'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=clean_env(), timeout=60)
