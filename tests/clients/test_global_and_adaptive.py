"""An outbound limit shared across processes (SharedLimit on a real redis-server: each instance
stands for one process) and an outbound limit that moves (adaptive=, the controllers of
adaptive routes) finding an upstream's capacity from its 429s."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from gym_concurrency.middleware import AdaptiveLimit

from gym_concurrency import MeteredSemaphore, SharedLimit, names
from gym_concurrency.clients import LimitedTransport, RetryPolicy
from gym_concurrency.limits.adaptive import GradientController, limiter_of
from tests.clients.callers import Caller
from tests.clients.upstream import Reply, Upstream
from tests.metrics_capture import MetricsCapture
from tests.servers import eventually
from tests.shared.redis_server import RedisServer

FAST = RetryPolicy(backoff_seconds=0.01, backoff_max_seconds=0.05)


@pytest.fixture
async def shared(redis_server: RedisServer, name: str) -> Any:
    """Makes SharedLimits of 2 slots on one key (each one a process); closes them after."""
    made: list[SharedLimit] = []
    key = f"clients-{uuid.uuid4().hex[:8]}"

    def make() -> SharedLimit:
        limit = SharedLimit(
            2, redis_url=redis_server.url, key=key, component=name, limit_name="judge"
        )
        made.append(limit)
        return limit

    yield make
    for limit in made:
        assert (limit.active, limit.queue_depth) == (0, 0), "a slot leaked"
        await limit.close()
    assert redis_server.client().zcard(made[0].redis_keys["leases"]) == 0


@pytest.mark.parametrize("kind", ["httpx", "aiohttp"])
async def test_one_judge_limit_spans_two_processes(kind: str, upstream: Upstream, shared: Any):
    upstream.script("/judge", *[Reply(delay=0.1)] * 12)
    first, second = shared(), shared()
    async with (
        Caller(kind, upstream.url, first, FAST) as a,
        Caller(kind, upstream.url, second, FAST) as b,
    ):
        replies = await asyncio.gather(*(c.get("/judge") for c in (a, b) for _ in range(6)))
    assert [status for status, _ in replies] == [200] * 12
    assert upstream.max_active == 2  # never more than the global limit, across both


async def test_cancelled_while_waiting_for_a_global_slot(upstream: Upstream, shared: Any):
    limit = shared()
    upstream.script("/judge", Reply(delay=2), Reply(delay=2))
    async with Caller("httpx", upstream.url, limit, FAST) as caller:
        held = [asyncio.create_task(caller.get("/judge")) for _ in range(2)]
        await eventually(lambda: upstream.active == 2, "both slots in use")
        waiting = asyncio.create_task(caller.get("/judge"))
        await eventually(lambda: limit.queue_depth == 1, "the third call to queue")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert limit.queue_depth == 0
        assert [r[0] for r in await asyncio.gather(*held)] == [200, 200]
    assert len(upstream.attempts("/judge")) == 2


async def test_a_global_limits_instruments_carry_the_scope(
    upstream: Upstream, shared: Any, metrics: MetricsCapture, name: str
):
    upstream.script("/judge", Reply(503, {"retry-after-ms": "1"}))
    limit = shared()
    transport = LimitedTransport(limit, retry=FAST, meter_provider=metrics.provider)
    async with httpx.AsyncClient(transport=transport, base_url=upstream.url) as client:
        assert (await client.get("/judge")).status_code == 200
    (point,) = metrics.collect()[names.CLIENT_RETRIES_INSTRUMENT]
    assert dict(point.attributes) == {
        names.COMPONENT_ATTRIBUTE: name,
        names.LIMIT_NAME_ATTRIBUTE: "judge",
        names.SCOPE_ATTRIBUTE: "global",
        names.RETRY_REASON_ATTRIBUTE: "status",
    }


class Capacity:
    """Wraps an Upstream: at most `capacity` requests inside, the rest answered 429."""

    def __init__(self, upstream: Upstream, capacity: int) -> None:
        self.capacity = capacity
        self.inside = 0
        self.refused = 0
        upstream_call = upstream.__call__

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if self.inside >= self.capacity:
                self.refused += 1
                headers = [(b"retry-after-ms", b"5"), (b"content-length", b"0")]
                await send({"type": "http.response.start", "status": 429, "headers": headers})
                await send({"type": "http.response.body", "body": b""})
                return
            self.inside += 1
            try:
                await upstream_call(scope, receive, send)
            finally:
                self.inside -= 1

        self.app = app


async def judged(served: Any, name: str, adaptive: Any) -> tuple[int, int]:
    """24 callers x 6 calls of 50 ms through a limit of 32 against an upstream of capacity 4
    (429, retry-after-ms 5 above it): the 429s drawn and where the limit ended."""
    server, switch = served
    upstream = Upstream(server.url)
    for _ in range(400):
        upstream.script("/judge", Reply(delay=0.05))
    capacity = Capacity(upstream, 4)
    switch.app = capacity.app
    limit = MeteredSemaphore(32, component=name, limit_name=f"judge-{id(adaptive)}")
    patient = RetryPolicy(max_attempts=1000, budget_min_per_second=1e4)
    transport = LimitedTransport(limit, retry=patient, adaptive=adaptive)
    if adaptive is not None:
        assert limiter_of(limit) is transport.calls.limiter
    async with httpx.AsyncClient(transport=transport, base_url=server.url) as client:

        async def caller() -> None:
            for _ in range(6):
                assert (await client.get("/judge")).status_code == 200

        await asyncio.gather(*(caller() for _ in range(24)))
    assert (limit.active, limit.queue_depth) == (0, 0)
    return capacity.refused, limit.limit


@pytest.mark.parametrize("adaptive", ["config", "controller"])
async def test_an_adaptive_limit_moves_down_to_the_upstreams_capacity(
    adaptive: str, served: Any, name: str
):
    """(How many 429s that saves against a fixed limit, under load: benchmarks/outbound.py.)"""
    config: Any = (
        AdaptiveLimit(min_concurrent=1, max_concurrent=64)  # the route setting, reused
        if adaptive == "config"
        else GradientController(1, 64, 32)
    )
    refused, moved_to = await judged(served, name, config)
    assert refused > 0
    assert moved_to <= 8  # from 32 to about the upstream's 4
