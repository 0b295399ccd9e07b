"""resources_operation: queue wait, run time and outcome, by operation and executor."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap

import anyio
import pytest
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import Aggregation, View

from gym_concurrency import (
    ACTIVE_INSTRUMENT,
    DURATION_INSTRUMENT,
    EXECUTOR_ATTRIBUTE,
    OPERATION_ATTRIBUTE,
    OPERATION_BOUNDARIES_MS,
    OUTCOME_ATTRIBUTE,
    QUEUE_DURATION_INSTRUMENT,
    QUEUED_INSTRUMENT,
    MeteredSemaphore,
    ResourcesOperation,
    resources_operation,
)
from tests.metrics_capture import MetricsCapture


def key(operation: str, executor: str, outcome: str | None = None) -> frozenset[tuple[str, str]]:
    pairs = {OPERATION_ATTRIBUTE: operation, EXECUTOR_ATTRIBUTE: executor}
    if outcome is not None:
        pairs[OUTCOME_ATTRIBUTE] = outcome
    return frozenset(pairs.items())


async def test_records_queue_wait_and_run_time(metrics: MetricsCapture) -> None:
    limit = asyncio.Semaphore(1)
    await limit.acquire()
    asyncio.get_running_loop().call_later(0.05, limit.release)
    async with resources_operation(
        limit, operation="verify", executor="subprocess", meter_provider=metrics.provider
    ) as op:
        await asyncio.sleep(0.03)
    assert op.outcome == "ok"
    queue = metrics.values(QUEUE_DURATION_INSTRUMENT)[key("verify", "subprocess")]
    ran = metrics.values(DURATION_INSTRUMENT)[key("verify", "subprocess", "ok")]
    assert queue.count == 1
    assert 40 <= queue.sum < 2000  # waited for the release at 50 ms
    assert ran.count == 1
    assert 25 <= ran.sum < 2000  # ran for 30 ms
    assert tuple(queue.explicit_bounds) == OPERATION_BOUNDARIES_MS
    assert tuple(ran.explicit_bounds) == OPERATION_BOUNDARIES_MS


@pytest.mark.parametrize(
    ("raised", "outcome"),
    [(RuntimeError("boom"), "error"), (TimeoutError(), "error"), (KeyboardInterrupt(), "error")],
)
async def test_an_exception_sets_error(
    metrics: MetricsCapture, raised: BaseException, outcome: str
) -> None:
    limit = MeteredSemaphore(1)
    with pytest.raises(type(raised)):
        async with resources_operation(
            limit, "judge", "inline", meter_provider=metrics.provider
        ) as op:
            raise raised
    assert op.outcome == outcome
    assert metrics.values(DURATION_INSTRUMENT)[key("judge", "inline", outcome)].count == 1
    assert limit.active == 0


async def test_cancellation_sets_cancelled(metrics: MetricsCapture) -> None:
    limit = MeteredSemaphore(1)
    seen: list[ResourcesOperation] = []

    async def work() -> None:
        async with resources_operation(
            limit, "tool", "thread", meter_provider=metrics.provider
        ) as op:
            seen.append(op)
            await asyncio.sleep(10)

    task = asyncio.create_task(work())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen[0].outcome == "cancelled"
    assert metrics.values(DURATION_INSTRUMENT)[key("tool", "thread", "cancelled")].count == 1
    assert limit.active == 0


async def test_an_outcome_set_in_the_block_is_kept(metrics: MetricsCapture) -> None:
    limit = MeteredSemaphore(1)
    async with resources_operation(
        limit, "verify", "process", meter_provider=metrics.provider
    ) as op:
        op.outcome = "timeout"
    with pytest.raises(RuntimeError):
        async with resources_operation(
            limit, "verify", "process", meter_provider=metrics.provider
        ) as op:
            op.outcome = "crashed"
            raise RuntimeError("the verifier died")
    durations = metrics.values(DURATION_INSTRUMENT)
    assert durations[key("verify", "process", "timeout")].count == 1
    assert durations[key("verify", "process", "crashed")].count == 1
    assert key("verify", "process", "error") not in durations


async def test_unknown_names_raise_value_error_listing_the_allowed_ones() -> None:
    limit = MeteredSemaphore(1)
    with pytest.raises(ValueError, match="unknown operation 'grade': expected one of judge, other"):
        resources_operation(limit, "grade", "inline")
    with pytest.raises(ValueError, match="unknown executor 'gpu'"):
        resources_operation(limit, "judge", "gpu")
    with pytest.raises(ValueError, match=r"unknown operation \['verify'\]"):
        resources_operation(limit, ["verify"], "inline")  # type: ignore[arg-type]
    async with resources_operation(limit, "judge", "inline") as op:
        with pytest.raises(ValueError, match="unknown outcome 'fine': expected one of cancelled"):
            op.outcome = "fine"
    assert op.outcome == "ok"
    assert limit.active == 0


def test_a_limit_that_is_not_an_async_context_manager_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="limit must be an async context manager"):
        resources_operation(object(), "tool", "inline")  # type: ignore[arg-type]


async def test_never_entered_records_the_wait_but_no_duration(metrics: MetricsCapture) -> None:
    limit = MeteredSemaphore(1, timeout=0.02)
    await limit.acquire()
    with pytest.raises(TimeoutError):
        async with resources_operation(limit, "verify", "inline", meter_provider=metrics.provider):
            pytest.fail("the block must not run without the limit")
    queue = metrics.values(QUEUE_DURATION_INSTRUMENT)[key("verify", "inline")]
    assert queue.count == 1
    assert queue.sum >= 15
    assert not any(
        dict(k)[OPERATION_ATTRIBUTE] == "verify" and dict(k)[EXECUTOR_ATTRIBUTE] == "inline"
        for k in metrics.values(DURATION_INSTRUMENT)
    )
    assert metrics.values(ACTIVE_INSTRUMENT).get(key("verify", "inline"), 0) == 0
    assert metrics.values(QUEUED_INSTRUMENT)[key("verify", "inline")] == 0


async def test_cancelled_while_queued_records_the_wait_and_leaves_the_queue(
    metrics: MetricsCapture,
) -> None:
    limit = MeteredSemaphore(1)
    await limit.acquire()

    async def queued() -> None:
        async with resources_operation(limit, "tool", "process", meter_provider=metrics.provider):
            pytest.fail("the block must not run without the limit")

    task = asyncio.create_task(queued())
    await asyncio.sleep(0.02)
    assert metrics.values(QUEUED_INSTRUMENT)[key("tool", "process")] == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert metrics.values(QUEUED_INSTRUMENT)[key("tool", "process")] == 0
    assert metrics.values(QUEUE_DURATION_INSTRUMENT)[key("tool", "process")].count == 1
    assert not any(
        dict(k)[EXECUTOR_ATTRIBUTE] == "process" for k in metrics.values(DURATION_INSTRUMENT)
    )
    assert (limit.active, limit.queue_depth, limit.admission_cancelled) == (1, 0, 1)


async def test_live_queued_and_active_counts(metrics: MetricsCapture) -> None:
    limit = MeteredSemaphore(2)
    release = asyncio.Event()

    async def work() -> None:
        async with resources_operation(limit, "judge", "other", meter_provider=metrics.provider):
            await release.wait()

    tasks = [asyncio.create_task(work()) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert metrics.values(ACTIVE_INSTRUMENT)[key("judge", "other")] == 2
    assert metrics.values(QUEUED_INSTRUMENT)[key("judge", "other")] == 3
    release.set()
    await asyncio.gather(*tasks)
    assert metrics.values(ACTIVE_INSTRUMENT)[key("judge", "other")] == 0
    assert metrics.values(QUEUED_INSTRUMENT)[key("judge", "other")] == 0


@pytest.mark.parametrize(
    "make_limit",
    [
        lambda: asyncio.Semaphore(1),
        lambda: asyncio.Lock(),
        lambda: MeteredSemaphore(1),
        lambda: anyio.CapacityLimiter(1),
    ],
    ids=["asyncio.Semaphore", "asyncio.Lock", "MeteredSemaphore", "anyio.CapacityLimiter"],
)
async def test_any_async_context_manager_is_a_limit(metrics: MetricsCapture, make_limit) -> None:  # type: ignore[no-untyped-def]
    limit = make_limit()
    async with resources_operation(limit, "tool", "inline", meter_provider=metrics.provider):
        pass
    async with resources_operation(limit, "tool", "inline", meter_provider=metrics.provider):
        pass
    assert metrics.values(DURATION_INSTRUMENT)[key("tool", "inline", "ok")].count == 2


async def test_a_no_op_provider_still_limits() -> None:
    limit = MeteredSemaphore(1)
    async with resources_operation(
        limit, "tool", "inline", meter_provider=NoOpMeterProvider()
    ) as op:
        assert limit.active == 1
    assert op.outcome == "ok"
    assert limit.active == 0


def test_records_only_once_a_global_sdk_provider_is_set() -> None:
    # Before the application sets an SDK provider, the wrapper only enters the limit.
    script = textwrap.dedent(
        """
        import asyncio
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from gym_concurrency import resources_operation, operations

        async def run_one():
            async with resources_operation(asyncio.Semaphore(1), "verify", "thread"):
                await asyncio.sleep(0)

        async def main():
            await run_one()
            before = len(operations._METRICS)
            reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            await run_one()
            counts = {}
            for rm in reader.get_metrics_data().resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name.endswith("duration_ms"):
                            counts[m.name] = sum(p.count for p in m.data.data_points)
            print(before, counts["gym.resources.operation.queue_duration_ms"],
                  counts["gym.resources.operation.duration_ms"])

        asyncio.run(main())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "1", "1"]


class BrokenAggregation(Aggregation):
    """The SDK cannot aggregate: every record on a matching instrument raises."""

    def _create_aggregation(self, *args: object, **kwargs: object) -> object:
        raise RuntimeError("the SDK failed to record")


async def test_a_failing_sdk_never_reaches_the_operation_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    view = View(instrument_name="gym.resources.operation.*", aggregation=BrokenAggregation())
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()], views=[view])
    limit = MeteredSemaphore(1)
    outcomes = []
    with caplog.at_level(logging.DEBUG, logger="gym_concurrency"):
        for _ in range(3):
            async with resources_operation(
                limit, "verify", "inline", meter_provider=provider
            ) as op:
                await asyncio.sleep(0)
            outcomes.append(op.outcome)
    provider.shutdown()
    assert outcomes == ["ok", "ok", "ok"]
    assert limit.active == 0
    failures = [r for r in caplog.records if "recording gym.resources" in r.getMessage()]
    assert [r.levelno for r in failures].count(logging.ERROR) == 1  # the first, with traceback
    assert len(failures) == 6  # two records per operation; the rest at debug level
