"""The concurrency observer: what a metrics backend sees for every named semaphore."""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import textwrap

import pytest

from gym_concurrency import (
    ADMISSION_CANCELLED_INSTRUMENT,
    ADMISSION_SHED_INSTRUMENT,
    ADMISSION_TIMEOUTS_INSTRUMENT,
    COMPONENT_ATTRIBUTE,
    CONCURRENCY_ACTIVE_INSTRUMENT,
    CONCURRENCY_AVAILABLE_INSTRUMENT,
    CONCURRENCY_LIMIT_INSTRUMENT,
    LIMIT_NAME_ATTRIBUTE,
    QUEUE_DEPTH_INSTRUMENT,
    SERVER_ATTRIBUTE,
    MeteredSemaphore,
    QueueFullError,
    observe_concurrency,
)
from gym_concurrency.limits import registered_limits
from tests.metrics_capture import MetricsCapture


def attrs(component: str, limit_name: str, server: str | None = None) -> frozenset[tuple[str, str]]:
    pairs = {COMPONENT_ATTRIBUTE: component, LIMIT_NAME_ATTRIBUTE: limit_name}
    if server is not None:
        pairs[SERVER_ATTRIBUTE] = server
    return frozenset(pairs.items())


async def test_reports_limit_active_available_and_queue_depth(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    sem = MeteredSemaphore(2, component="obs_state", limit_name="episodes", server="srv")
    await sem.acquire()
    await sem.acquire()
    waiter = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0)
    key = attrs("obs_state", "episodes", "srv")
    assert metrics.values(CONCURRENCY_LIMIT_INSTRUMENT)[key] == 2
    assert metrics.values(CONCURRENCY_ACTIVE_INSTRUMENT)[key] == 2
    assert metrics.values(CONCURRENCY_AVAILABLE_INSTRUMENT)[key] == 0
    assert metrics.values(QUEUE_DEPTH_INSTRUMENT)[key] == 1
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    sem.release()
    assert metrics.values(ADMISSION_CANCELLED_INSTRUMENT)[key] == 1
    assert metrics.values(QUEUE_DEPTH_INSTRUMENT)[key] == 0
    assert metrics.values(CONCURRENCY_ACTIVE_INSTRUMENT)[key] == 1


def test_attributes_are_exactly_component_limit_name_and_server(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    kept = [
        MeteredSemaphore(3, component="obs_attrs", limit_name="with_server", server="s1"),
        MeteredSemaphore(4, component="obs_attrs", limit_name="no_server"),
    ]
    limits = metrics.values(CONCURRENCY_LIMIT_INSTRUMENT)
    assert limits[attrs("obs_attrs", "with_server", "s1")] == 3
    assert limits[attrs("obs_attrs", "no_server")] == 4
    assert len(kept) == 2


def test_unnamed_semaphores_report_no_series(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    kept = [
        MeteredSemaphore(5, component="obs_unnamed"),
        MeteredSemaphore(5, limit_name="obs_unnamed_limit"),
        MeteredSemaphore(5),
    ]
    for points in metrics.collect().values():
        for point in points:
            assert point.attributes.get(COMPONENT_ATTRIBUTE) != "obs_unnamed"
            assert point.attributes.get(LIMIT_NAME_ATTRIBUTE) != "obs_unnamed_limit"
    assert not any(s in registered_limits() for s in kept)


async def test_same_attributes_are_summed_into_one_point(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    first = MeteredSemaphore(2, component="obs_sum", limit_name="shared")
    second = MeteredSemaphore(3, component="obs_sum", limit_name="shared")
    await first.acquire()
    await second.acquire()
    await second.acquire()
    key = attrs("obs_sum", "shared")
    assert metrics.values(CONCURRENCY_LIMIT_INSTRUMENT)[key] == 5
    assert metrics.values(CONCURRENCY_ACTIVE_INSTRUMENT)[key] == 3
    assert metrics.values(CONCURRENCY_AVAILABLE_INSTRUMENT)[key] == 2


async def test_timeout_and_shed_counters_exist_only_where_they_can_happen(
    metrics: MetricsCapture,
) -> None:
    observe_concurrency(metrics.provider)
    plain = MeteredSemaphore(1, component="obs_optional", limit_name="plain")
    timed = MeteredSemaphore(1, component="obs_optional", limit_name="timed", timeout=0.01)
    shedding = MeteredSemaphore(1, component="obs_optional", limit_name="shedding", max_queue=0)
    async with timed:
        with pytest.raises(TimeoutError):
            await timed.acquire()
    async with shedding:
        with pytest.raises(QueueFullError):
            await shedding.acquire()
    timeouts = metrics.values(ADMISSION_TIMEOUTS_INSTRUMENT)
    shed = metrics.values(ADMISSION_SHED_INSTRUMENT)
    cancelled = metrics.values(ADMISSION_CANCELLED_INSTRUMENT)
    assert timeouts[attrs("obs_optional", "timed")] == 1
    assert attrs("obs_optional", "plain") not in timeouts
    assert attrs("obs_optional", "shedding") not in timeouts
    assert shed[attrs("obs_optional", "shedding")] == 1
    assert attrs("obs_optional", "plain") not in shed
    assert attrs("obs_optional", "timed") not in shed
    for name in ("plain", "timed", "shedding"):  # every named limit can be cancelled
        assert cancelled[attrs("obs_optional", name)] == 0
    assert plain.limit == 1


def test_a_collected_semaphore_stops_reporting(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    sem = MeteredSemaphore(1, component="obs_weak", limit_name="gone")
    assert attrs("obs_weak", "gone") in metrics.values(CONCURRENCY_LIMIT_INSTRUMENT)
    del sem
    gc.collect()
    assert attrs("obs_weak", "gone") not in metrics.values(CONCURRENCY_LIMIT_INSTRUMENT)


def test_observe_concurrency_is_idempotent_per_provider(metrics: MetricsCapture) -> None:
    observe_concurrency(metrics.provider)
    observe_concurrency(metrics.provider)
    kept = MeteredSemaphore(7, component="obs_once", limit_name="l")
    names = [
        m.name
        for rm in metrics.reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == CONCURRENCY_LIMIT_INSTRUMENT
    ]
    assert names == [CONCURRENCY_LIMIT_INSTRUMENT]
    assert metrics.values(CONCURRENCY_LIMIT_INSTRUMENT)[attrs("obs_once", "l")] == kept.limit


def test_a_failing_reading_never_reaches_the_sdk_and_is_logged_once(
    metrics: MetricsCapture, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(MeteredSemaphore):
        broken = True

        @property
        def active(self) -> int:
            if self.broken:
                raise RuntimeError("broken reading")
            return super().active

    observe_concurrency(metrics.provider)
    broken = Broken(1, component="obs_broken", limit_name="b")
    with caplog.at_level(logging.ERROR, logger="gym_concurrency.observer"):
        for _ in range(3):
            collected = metrics.collect()
    assert CONCURRENCY_LIMIT_INSTRUMENT in collected  # the other instruments still report
    message = "observing gym.concurrency.active failed"
    failures = [r for r in caplog.records if message in r.getMessage()]
    assert len(failures) == 1
    # The logged tracebacks keep it alive past this test: it must not break later ones.
    broken.broken = False
    del broken
    gc.collect()


def test_global_provider_set_after_the_semaphores_were_made() -> None:
    # The global provider can be set once per process: prove it in a fresh interpreter.
    script = textwrap.dedent(
        """
        import asyncio
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from gym_concurrency import MeteredSemaphore

        async def main():
            sem = MeteredSemaphore(4, component="late", limit_name="made_first")
            await sem.acquire()
            reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            found = {}
            for rm in reader.get_metrics_data().resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        for p in m.data.data_points:
                            found[m.name] = p.value
            print(found["gym.concurrency.limit"], found["gym.concurrency.active"])

        asyncio.run(main())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["4", "1"]
