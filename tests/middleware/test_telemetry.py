"""What the middleware reports: the queue-wait histogram by admission outcome, and the
operation histograms of `operation_limit` handles, on an explicit MeterProvider; and nothing
while no provider exports."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from apps import make_app
from fastapi import Depends
from gym_concurrency.middleware import (
    ConcurrencySettings,
    OperationHandle,
    OperationLimit,
    RouteLimit,
    operation_limit,
)
from servers import eventually

from gym_concurrency import OPERATION_BOUNDARIES_MS, ResourcesOperation
from tests.registry import limits_of

HERE = Path(__file__).parent
Judge = Annotated[OperationHandle, Depends(operation_limit("judge"))]


async def test_queue_wait_histogram_by_outcome(metrics: Any, component: str):
    settings = ConcurrencySettings(
        component=component,
        server_name="env_1",
        routes=[
            RouteLimit(
                path="/run",
                limit_name="episodes",
                max_concurrent=1,
                queue_timeout_seconds=0.2,
                max_queue=1,
            )
        ],
    )
    app, gate = make_app(settings, meter_provider=metrics.provider)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        first = asyncio.create_task(client.post("/run", content=b"{}"))
        await eventually(lambda: gate.inside == 1, "the first request inside")
        semaphore = limits_of(component)["episodes"]
        timing_out = asyncio.create_task(client.post("/run", content=b"{}"))
        await eventually(lambda: semaphore.queue_depth == 1, "a request queued")
        assert (await client.post("/run", content=b"{}")).status_code == 503  # shed
        assert (await timing_out).status_code == 503
        cancelled = asyncio.create_task(client.post("/run", content=b"{}"))
        await eventually(lambda: semaphore.queue_depth == 1, "a request queued")
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        gate.open = True
        assert (await first).status_code == 200
        assert (await client.post("/run", content=b"{}")).status_code == 200

    points = metrics.values("gym.concurrency.queue_wait_duration_ms")
    base = {
        "nemo.gym.concurrency.component": component,
        "nemo.gym.concurrency.limit_name": "episodes",
        "nemo.gym.server.name": "env_1",
    }
    by_outcome = {
        dict(key)["nemo.gym.concurrency.admission_outcome"]: point for key, point in points.items()
    }
    for key in points:
        assert {k: v for k, v in key if k != "nemo.gym.concurrency.admission_outcome"} == base
    counts = {outcome: point.count for outcome, point in by_outcome.items()}
    assert counts == {"admitted": 2, "timeout": 1, "shed": 1, "cancelled": 1}
    assert by_outcome["timeout"].sum >= 200 * 0.9
    assert tuple(by_outcome["admitted"].explicit_bounds) == OPERATION_BOUNDARIES_MS
    assert (
        semaphore.admission_timeouts,
        semaphore.admission_shed,
        semaphore.admission_cancelled,
    ) == (1, 1, 1)
    # The limit's own state reaches the provider the middleware was given, not only the global.
    key = frozenset(base.items())
    assert metrics.values("gym.concurrency.limit")[key] == 1
    assert metrics.values("gym.concurrency.admission_timeouts_total")[key] == 1
    assert metrics.values("gym.concurrency.admission_shed_total")[key] == 1


async def test_operation_limits_carry_the_server_name(metrics: Any, component: str):
    settings = ConcurrencySettings(
        component=component,
        server_name="s",
        operations=[
            OperationLimit(
                limit_name="judge", operation="judge", executor="inline", max_concurrent=3
            )
        ],
    )
    app, _ = make_app(settings, meter_provider=metrics.provider)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/health")).status_code == 200  # builds the middleware
    assert limits_of(component)["judge"].server == "s"
    key = frozenset(
        {
            "nemo.gym.concurrency.component": component,
            "nemo.gym.concurrency.limit_name": "judge",
            "nemo.gym.server.name": "s",
        }.items()
    )
    assert metrics.values("gym.concurrency.limit")[key] == 3


NO_PROVIDER_SCRIPT = """
import asyncio

import httpx
from apps import make_app
from gym_concurrency.meters import current_provider
from gym_concurrency.middleware import ConcurrencySettings, RouteLimit
from gym_concurrency.middleware.queue_wait import QueueWaitRecorder
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.metrics_capture import MetricsCapture

assert current_provider() is None, "a global provider is already set"
route = RouteLimit(path="/run", limit_name="episodes", max_concurrent=1)
app, gate = make_app(ConcurrencySettings(component="c", routes=[route]))
gate.open = True


async def post() -> int:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return (await client.post("/run", content=b"{}")).status_code


print(asyncio.run(post()), QueueWaitRecorder(None).histogram())
capture = MetricsCapture(MeterProvider(metric_readers=[reader := InMemoryMetricReader()]), reader)
metrics.set_meter_provider(capture.provider)
status = asyncio.run(post())
print(status, sum(p.count for p in capture.collect()["gym.concurrency.queue_wait_duration_ms"]))
"""


def test_nothing_is_recorded_until_a_global_provider_is_set():
    # A fresh interpreter: in this one, the global provider depends on what other tests did.
    env = {"PYTHONPATH": f"{HERE}:{HERE.parents[1]}", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", NO_PROVIDER_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # No provider: the request works and there is no histogram to record on. Once the global
    # SDK provider is set, the same middleware records the next wait on it.
    assert result.stdout.splitlines() == ["200 None", "200 1"]


def judge_app(metrics: Any, component: str, **limit: Any) -> tuple[Any, asyncio.Event]:
    settings = ConcurrencySettings(
        component=component,
        operations=[
            OperationLimit(
                limit_name="judge", operation="judge", executor="inline", max_concurrent=1, **limit
            )
        ],
    )
    app, _ = make_app(settings, meter_provider=metrics.provider)
    release = asyncio.Event()

    @app.post("/verify")
    async def verify(judge: Judge) -> dict[str, Any]:
        await asyncio.sleep(0.1)  # outside the guarded block: never timed
        async with judge as op:
            assert isinstance(op, ResourcesOperation)
            await release.wait()
        return {"limit": judge.limit.config.limit_name}

    return app, release


async def test_operation_limit_handle_reports_the_operation(metrics: Any, component: str):
    app, release = judge_app(metrics, component)
    release.set()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.post("/verify")).json() == {"limit": "judge"}
    collected = metrics.collect()
    (ran,) = collected["gym.resources.operation.duration_ms"]
    assert dict(ran.attributes) == {
        "nemo.gym.resources.operation": "judge",
        "nemo.gym.resources.executor": "inline",
        "nemo.gym.resources.operation.outcome": "ok",
    }
    assert ran.count == 1
    assert ran.sum < 90  # the 100 ms before the block is not in it
    (queued,) = collected["gym.resources.operation.queue_duration_ms"]
    assert queued.count == 1
    judge = limits_of(component)["judge"]
    assert (judge.limit, judge.active, judge.timeout) == (1, 0, None)


async def test_operation_limit_timeout_is_seen(metrics: Any, component: str):
    app, release = judge_app(metrics, component, timeout_seconds=0.05)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        holding = asyncio.create_task(client.post("/verify"))
        await eventually(
            lambda: (
                limits_of(component).get("judge") is not None
                and limits_of(component)["judge"].active == 1
            ),
            "the judge slot taken",
        )
        with pytest.raises(TimeoutError):
            await client.post("/verify")
        release.set()
        assert (await holding).status_code == 200
    judge = limits_of(component)["judge"]
    assert (judge.admission_timeouts, judge.active) == (1, 0)
    collected = metrics.collect()
    assert sum(p.count for p in collected["gym.resources.operation.queue_duration_ms"]) == 2
    assert sum(p.count for p in collected["gym.resources.operation.duration_ms"]) == 1


async def test_operation_limit_without_the_middleware_says_so():
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/verify")
    async def verify(judge: Judge) -> None:
        return None

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        with pytest.raises(
            RuntimeError,
            match=r"operation_limit\('judge'\) needs "
            "ConcurrencyLimitMiddleware",
        ):
            await client.post("/verify")
