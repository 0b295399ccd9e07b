"""weight= and flow= of the outbound clients, through real httpx and aiohttp against a real
uvicorn upstream: a heavy call and light ones share a limit by weight, a quiet flow is served
before a flood, a weight over the limit is capped (counted, logged once), and a bad weight or
flow is a clear error before anything is held or sent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import pytest

from gym_concurrency import MeteredSemaphore, tokens
from gym_concurrency.clients import LimitedTransport, limited_middleware, openai_tokens
from tests.clients.callers import KINDS, Caller
from tests.clients.upstream import Reply, Upstream
from tests.servers import eventually


@contextlib.asynccontextmanager
async def peak_active(limit: MeteredSemaphore) -> AsyncIterator[list[int]]:
    """The most weight `limit.statistics()` showed held while the block ran (read every ms)."""
    peak = [0]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], limit.statistics().active)
            await asyncio.sleep(0.001)

    sampler = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler


def by_path(request: Any) -> int:
    """Weight 8 for /heavy, 1 for anything else (an httpx.Request or aiohttp.ClientRequest)."""
    return 8 if request.url.path == "/heavy" else 1


def by_env_header(request: Any) -> str | None:
    env: str | None = request.headers.get("x-env")
    return env


@pytest.mark.parametrize("kind", KINDS)
async def test_a_heavy_call_and_light_ones_share_a_limit_by_weight(
    kind: str, upstream: Upstream, name: str
):
    limit = MeteredSemaphore(10, component=name, limit_name="judge")
    upstream.script("/heavy", Reply(delay=2.0))
    upstream.script("/light", *[Reply(delay=0.2)] * 10)
    caller = Caller(kind, upstream.url, limit, None, weight=by_path)
    async with caller, peak_active(limit) as peak:
        heavy = asyncio.create_task(caller.get("/heavy"))
        await eventually(lambda: limit.active == 8, "the heavy call to hold 8")
        lights = [asyncio.create_task(caller.get("/light")) for _ in range(10)]
        done, _ = await asyncio.wait(lights, timeout=0.9)
        assert not heavy.done()
        # Beside the heavy call's 8, two light calls at a time: not none, never three.
        assert len(done) >= 2
        assert all(task.result()[0] == 200 for task in done)
        assert upstream.max_active == 3
        assert (await heavy)[0] == 200
        assert [status for status, _ in await asyncio.gather(*lights)] == [200] * 10
    assert peak[0] == 10  # full, never over
    assert limit.statistics().active == 0
    assert limit.flow_statistics() == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_quiet_flow_is_not_stuck_behind_a_flood(kind: str, upstream: Upstream, name: str):
    limit = MeteredSemaphore(2, component=name, limit_name="judge")
    upstream.script("/flood", *[Reply(delay=0.2)] * 20)
    flooded: list[int] = []
    async with Caller(kind, upstream.url, limit, None, flow=by_env_header) as caller:

        async def flood(number: int) -> None:
            await caller.get("/flood", {"x-env": "flood"})
            flooded.append(number)

        floods = [asyncio.create_task(flood(n)) for n in range(20)]
        await eventually(lambda: limit.queue_depth == 18, "the flood to queue")
        assert limit.statistics().flows == 1
        (flow,) = [f for f in limit.flow_statistics() if f.flow == "flood"]
        assert (flow.held, flow.queue_depth) == (2, 18)
        assert await caller.get("/quiet", {"x-env": "quiet"}) == (200, b'{"attempt": 1}')
        # First come, first served it would come after all 18; fairly, after the next to end.
        assert len(flooded) <= 6
        await asyncio.gather(*floods)
    assert len(flooded) == 20
    assert (limit.active, limit.flow_statistics()) == (0, [])


@pytest.mark.parametrize("kind", KINDS)
async def test_a_weight_over_the_limit_takes_the_whole_limit(
    kind: str, upstream: Upstream, limit: MeteredSemaphore, caplog: pytest.LogCaptureFixture
):
    upstream.script("/judge", Reply(delay=0.5), Reply(delay=0.5))
    async with Caller(kind, upstream.url, limit, None, weight=100) as caller:
        with caplog.at_level(logging.WARNING, logger="gym_concurrency.clients"):
            first = asyncio.create_task(caller.get("/judge"))
            await eventually(lambda: upstream.answering(1), "the call to reach the upstream")
            assert limit.active == limit.limit == 4  # capped at the limit, not refused
            assert (await first)[0] == 200
            assert (await caller.get("/judge"))[0] == 200
        assert caller.view.weights_capped == 2
    capped = [r.getMessage() for r in caplog.records if "capped" in r.getMessage()]
    assert len(capped) == 1, "logged once per client"
    assert "weight 100" in capped[0]
    assert "limit 4" in capped[0]


@pytest.mark.parametrize("weight", [0, -3])
def test_a_weight_below_one_is_refused_when_the_client_is_made(
    weight: int, limit: MeteredSemaphore
):
    with pytest.raises(ValueError, match=rf"weight= must be an int >= 1 .*got {weight}"):
        LimitedTransport(limit, weight=weight)
    with pytest.raises(ValueError, match=rf"weight= must be an int >= 1 .*got {weight}"):
        limited_middleware(limit, weight=weight)


@pytest.mark.parametrize("weight", [1.5, "8", True, None])
def test_a_weight_that_is_not_an_int_is_refused(weight: Any, limit: MeteredSemaphore):
    with pytest.raises(TypeError, match="weight= must be an int >= 1 or a function"):
        LimitedTransport(limit, weight=weight)


def test_an_unhashable_flow_is_refused(limit: MeteredSemaphore):
    with pytest.raises(TypeError, match=r"flow= must be hashable .*got \['env'\]"):
        limited_middleware(limit, flow=["env"])


def price_as_text(request: Any) -> Any:
    return "8"


def price_as_zero(request: Any) -> int:
    return 0


def env_as_list(request: Any) -> Any:
    return ["env"]


@pytest.mark.parametrize(
    ("ask", "error", "says"),
    [
        ({"weight": price_as_text}, TypeError, "the weight function price_as_text returned '8'"),
        ({"weight": price_as_zero}, ValueError, "the weight function price_as_zero returned 0"),
        ({"flow": env_as_list}, TypeError, r"the flow function env_as_list returned \['env'\]"),
    ],
)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_function_returning_a_bad_value_fails_the_call_before_it_is_sent(
    kind: str,
    ask: dict[str, Any],
    error: type[Exception],
    says: str,
    upstream: Upstream,
    limit: MeteredSemaphore,
):
    async with Caller(kind, upstream.url, limit, None, **ask) as caller:
        with pytest.raises(error, match=says) as raised:
            await caller.get("/judge")
    assert f"GET {upstream.url}/judge" in str(raised.value)  # which call
    assert upstream.attempts() == []  # nothing sent, nothing held (the fixture checks)


async def test_what_a_function_raises_reaches_the_caller(
    upstream: Upstream, limit: MeteredSemaphore
):
    def broken(request: httpx.Request) -> int:
        raise LookupError("no price for this model")

    transport = LimitedTransport(limit, weight=broken)
    async with httpx.AsyncClient(transport=transport, base_url=upstream.url) as client:
        with pytest.raises(LookupError, match="no price for this model"):
            await client.get("/judge")
    assert upstream.attempts() == []


async def test_the_cores_openai_tokens_prices_the_request_as_the_clients_does(
    upstream: Upstream, name: str
):
    # gym_concurrency.tokens.openai_tokens takes a parsed body; given as weight= it is taken
    # to mean the request pricer, which parses the outgoing body first.
    limit = MeteredSemaphore(5000, component=name, limit_name="model")
    upstream.script("/v1/chat/completions", Reply(delay=0.5))
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 396}], "max_tokens": 10}
    for weight in (tokens.openai_tokens, openai_tokens):
        transport = LimitedTransport(limit, weight=weight)
        assert transport.calls.ask.of(httpx.Request("POST", "http://t", json=body)) == (110, None)
    session = aiohttp.ClientSession(
        base_url=upstream.url, middlewares=(limited_middleware(limit, weight=tokens.openai_tokens),)
    )
    async with session:
        call = asyncio.create_task(session.post("/v1/chat/completions", json=body))
        await eventually(lambda: upstream.answering(1), "the call to reach the upstream")
        assert limit.active == 110  # (396 + len("user")) / 4 + max_tokens
        async with await call as response:
            assert response.status == 200
    assert limit.active == 0
