"""Contract clauses that hold for the package as a whole: instrument kinds and units, what
`import gym_concurrency` loads, and that acquiring a slot makes no OpenTelemetry call."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
from types import FrameType
from typing import Any

import pytest
from opentelemetry import metrics as otel_metrics
from opentelemetry.sdk.metrics._internal.point import Gauge, Histogram, Sum

import gym_concurrency as gc_
from gym_concurrency import MeteredSemaphore, QueueFullError, observe_concurrency
from tests.metrics_capture import MetricsCapture

# instrument -> (unit, kind) as the DESIGN table gives them.
EXPECTED = {
    gc_.CONCURRENCY_LIMIT_INSTRUMENT: ("{slot}", "up-down counter"),
    gc_.CONCURRENCY_ACTIVE_INSTRUMENT: ("{slot}", "up-down counter"),
    gc_.CONCURRENCY_AVAILABLE_INSTRUMENT: ("{slot}", "up-down counter"),
    gc_.QUEUE_DEPTH_INSTRUMENT: ("{request}", "up-down counter"),
    gc_.ADMISSION_TIMEOUTS_INSTRUMENT: ("{request}", "counter"),
    gc_.ADMISSION_CANCELLED_INSTRUMENT: ("{request}", "counter"),
    gc_.ADMISSION_SHED_INSTRUMENT: ("{request}", "counter"),
    gc_.names.QUEUED_WEIGHT_INSTRUMENT: ("{weight}", "up-down counter"),
    gc_.QUEUE_DURATION_INSTRUMENT: ("ms", "histogram"),
    gc_.DURATION_INSTRUMENT: ("ms", "histogram"),
    gc_.QUEUED_INSTRUMENT: ("{operation}", "up-down counter"),
    gc_.ACTIVE_INSTRUMENT: ("{operation}", "up-down counter"),
}
# Instruments only limits of other kinds report (a global limit; flows): an earlier test's
# limit still alive may add them, and they keep their contract too.
OTHER_KINDS = {
    gc_.names.ADMISSION_UNAVAILABLE_INSTRUMENT: ("{request}", "counter"),
    gc_.names.ADMISSION_LEASE_LOST_INSTRUMENT: ("{slot}", "counter"),
    gc_.names.FLOW_HELD_INSTRUMENT: ("{weight}", "up-down counter"),
    gc_.names.FLOW_QUEUE_DEPTH_INSTRUMENT: ("{request}", "up-down counter"),
    gc_.names.FLOW_QUEUED_WEIGHT_INSTRUMENT: ("{weight}", "up-down counter"),
    # An earlier test's limit with a budget or an engine signal, still alive, adds these.
    gc_.names.BUDGET_LIMIT_INSTRUMENT: (gc_.names.BUDGET_UNIT, "up-down counter"),
    gc_.names.BUDGET_REMAINING_INSTRUMENT: (gc_.names.BUDGET_UNIT, "up-down counter"),
    gc_.names.BUDGET_RESERVED_INSTRUMENT: (gc_.names.BUDGET_UNIT, "up-down counter"),
    gc_.names.BUDGET_REFUNDED_INSTRUMENT: (gc_.names.BUDGET_UNIT, "counter"),
    gc_.names.UPSTREAM_REPORTED_REMAINING_INSTRUMENT: (gc_.names.BUDGET_UNIT, "up-down counter"),
    gc_.names.ENGINE_WAITING_INSTRUMENT: (gc_.names.REQUEST_UNIT, "gauge"),
    gc_.names.ENGINE_CACHE_USAGE_INSTRUMENT: (gc_.names.RATIO_UNIT, "gauge"),
    gc_.names.ENGINE_SIGNAL_AGE_INSTRUMENT: (gc_.names.SECONDS_UNIT, "gauge"),
}


def kind_of(data: Any) -> str:
    if isinstance(data, Histogram):
        return "histogram"
    if isinstance(data, Gauge):
        return "gauge"
    assert isinstance(data, Sum), f"unexpected point type {type(data).__name__}"
    return "counter" if data.is_monotonic else "up-down counter"


async def test_every_instrument_has_the_unit_and_kind_of_the_contract(
    metrics: MetricsCapture,
) -> None:
    gc.collect()  # a global limit of an earlier test, unreachable now, would add its rows
    observe_concurrency(metrics.provider)
    sem = MeteredSemaphore(1, component="contract", limit_name="units", timeout=1, max_queue=1)
    async with gc_.resources_operation(sem, "verify", "inline", meter_provider=metrics.provider):
        pass
    found = {}
    for resource_metrics in metrics.reader.get_metrics_data().resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            assert scope_metrics.scope.name == "gym_concurrency"
            for metric in scope_metrics.metrics:
                found[metric.name] = (metric.unit, kind_of(metric.data))
    assert {name: found[name] for name in EXPECTED if name in found} == EXPECTED
    assert {name: got for name, got in found.items() if name not in EXPECTED} == {
        name: OTHER_KINDS[name] for name in found if name not in EXPECTED
    }


def test_importing_the_core_loads_no_web_framework_and_no_sdk() -> None:
    script = textwrap.dedent(
        """
        import sys
        import gym_concurrency
        from gym_concurrency.clients import RetryPolicy  # the outbound half, short of a transport
        loaded = sorted(
            name for name in sys.modules
            if name.split(".")[0]
            in ("starlette", "fastapi", "pydantic", "anyio", "httpx", "aiohttp", "redis")
            or name.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))
        )
        print(",".join(loaded) or "nothing")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "nothing"


class OpenTelemetryCalls:
    """Counts calls into opentelemetry modules while active (a sys.setprofile hook)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __enter__(self) -> OpenTelemetryCalls:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_globals.get("__name__", "").startswith("opentelemetry"):
            self.calls.append(f"{frame.f_globals['__name__']}.{frame.f_code.co_name}")


async def test_acquire_and_release_make_no_opentelemetry_call() -> None:
    sem = MeteredSemaphore(
        1, component="contract", limit_name="hot_path", timeout=0.02, max_queue=1
    )
    with OpenTelemetryCalls() as probe:
        otel_metrics.get_meter_provider()  # the probe sees OpenTelemetry when it is called
    assert probe.calls, "the probe must see a call into opentelemetry"

    with OpenTelemetryCalls() as probe:
        async with sem:  # uncontended
            waiter = asyncio.create_task(sem.acquire())
            await asyncio.sleep(0)
            with pytest.raises(QueueFullError):
                await sem.acquire()  # shed
        await waiter  # handed over
        with pytest.raises(TimeoutError):
            await sem.acquire()  # timed out
        cancelled = asyncio.create_task(sem.acquire())
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        sem.release()
    assert probe.calls == []
    assert (sem.admission_shed, sem.admission_timeouts, sem.admission_cancelled) == (1, 1, 1)


def test_the_semaphore_is_a_bounded_semaphore_by_behaviour_not_by_its_state() -> None:
    # A drop-in asyncio.BoundedSemaphore (isinstance holds) whose asyncio state is never
    # made: every asyncio method is its own, but two that nothing here calls.
    sem = MeteredSemaphore(2)
    assert isinstance(sem, asyncio.BoundedSemaphore)
    assert not {"_value", "_bound_value", "_waiters"} & vars(sem).keys()
    inherited = {
        name
        for cls in asyncio.BoundedSemaphore.__mro__
        if cls.__module__.startswith("asyncio")
        for name, value in vars(cls).items()
        if callable(value) and getattr(MeteredSemaphore, name) is value
    }
    # _get_loop reads only a class attribute; _wake_up_next is called only by asyncio's own
    # acquire() and release(), which MeteredSemaphore replaces.
    assert inherited == {"_get_loop", "_wake_up_next"}
