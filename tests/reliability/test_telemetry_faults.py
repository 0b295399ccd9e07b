"""Telemetry faults never reach a request: an OTLP endpoint that refuses connections, a
reader whose every collection ends in an exception, and an SDK whose recording raises.

Each test serves a limited app on a real uvicorn (127.0.0.1), drives admitted, timed-out and
shed requests through it while the faults happen, and checks that every answer is the normal
one, the limit's counts are exact, and each failure is logged, but not once per request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import Aggregation

from gym_concurrency import MeteredSemaphore, observe_concurrency
from gym_concurrency.limits import registered_limits
from tests.servers import UvicornServer, free_port

HOLD_SECONDS = 0.1
EXPORT_INTERVAL_MS = 100
BURSTS = 12
BURST_SIZE = 6
PLAIN_REQUESTS = 200
REQUESTS = BURSTS * BURST_SIZE + PLAIN_REQUESTS


class RaisingExporter(MetricExporter):
    """An exporter whose every export raises, so every collection of its reader fails."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.calls += 1
        raise RuntimeError("reliability test: the metric reader's collection failed")

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


class BrokenAggregation(Aggregation):
    """An aggregation that cannot aggregate: every histogram record in the SDK raises."""

    def _create_aggregation(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("reliability test: the SDK failed to record")


def limited_app(component: str, provider: MeterProvider) -> FastAPI:
    """`/work` (1 slot, 0.03 s queue timeout, 1 waiter) and unlimited `/health`."""
    app = FastAPI()

    @app.post("/work")
    async def work(hold: float = 0.0) -> dict[str, bool]:
        await asyncio.sleep(hold)
        return {"ok": True}

    settings = ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path="/work",
                limit_name="work",
                max_concurrent=1,
                queue_timeout_seconds=0.03,
                max_queue=1,
            )
        ],
    )
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings, meter_provider=provider)
    return app


def the_limit(component: str) -> MeteredSemaphore:
    return next(s for s in registered_limits() if s.component == component)


async def drive(url: str) -> dict[str, int]:
    """Plain admitted requests, then bursts that overflow the limit: outcome -> count.
    Any answer other than the documented ones fails the test right here."""
    outcomes: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def one(hold: float) -> None:
            response = await client.post("/work", params={"hold": hold})
            outcome = classify(response)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

        for _ in range(PLAIN_REQUESTS):
            await one(0.0)
        for _ in range(BURSTS):
            await asyncio.gather(*(one(HOLD_SECONDS) for _ in range(BURST_SIZE)))
    return outcomes


def classify(response: httpx.Response) -> str:
    if response.status_code == 200:
        assert response.json() == {"ok": True}
        return "admitted"
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "1"
    kind = response.json()["type"]
    assert kind in ("urn:gym-concurrency:admission-timeout", "urn:gym-concurrency:queue-full")
    return "timeout" if kind.endswith("timeout") else "shed"


def check_counts(outcomes: dict[str, int], semaphore: MeteredSemaphore) -> None:
    """Every request answered; the limit counted each failure once and holds nothing."""
    assert sum(outcomes.values()) == REQUESTS
    assert outcomes.get("timeout", 0) == semaphore.admission_timeouts > 0
    assert outcomes.get("shed", 0) == semaphore.admission_shed > 0
    assert (semaphore.active, semaphore.queue_depth, semaphore.admission_cancelled) == (0, 0, 0)


@pytest.fixture
def component() -> str:
    return f"faults_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def provider_with(request: pytest.FixtureRequest) -> Iterator[Any]:
    """provider_with(readers) -> an SDK MeterProvider (not the global one), shut down after."""
    made: list[MeterProvider] = []

    def make(readers: Sequence[MetricReader]) -> MeterProvider:
        provider = MeterProvider(metric_readers=list(readers))
        observe_concurrency(provider)  # the observer's callbacks run at every collection too
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.shutdown(timeout_millis=5_000)


def records_from(caplog: pytest.LogCaptureFixture, prefix: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(prefix)]


async def test_refused_otlp_and_failing_collections_never_reach_a_request(
    component: str, provider_with: Any, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING)
    closed_port = free_port()  # nothing listens there: every export is refused
    otlp = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{closed_port}/v1/metrics", timeout=0.5)
    raising = RaisingExporter()
    provider = provider_with(
        [
            PeriodicExportingMetricReader(otlp, export_interval_millis=EXPORT_INTERVAL_MS),
            PeriodicExportingMetricReader(raising, export_interval_millis=EXPORT_INTERVAL_MS),
        ]
    )
    with UvicornServer(limited_app(component, provider)) as server:
        outcomes = await drive(server.url)
        # Let several export cycles fail while the server runs.
        await asyncio.to_thread(wait_for, lambda: raising.calls >= 5, "five failed collections")
    check_counts(outcomes, the_limit(component))

    otlp_errors = records_from(caplog, "opentelemetry.exporter.otlp")
    reader_errors = [
        r
        for r in records_from(caplog, "opentelemetry.sdk.metrics")
        if r.getMessage() == "Exception while exporting metrics"
    ]
    assert otlp_errors, "the refused OTLP export was not logged"
    assert reader_errors, "the failing collection was not logged"
    # Logged per export cycle (every 0.1 s), not per request: bounded by the cycles counted
    # (the raising exporter's calls), which a slow machine makes more of, and far below the
    # requests.
    assert len(reader_errors) <= raising.calls
    assert len(otlp_errors) <= 2 * raising.calls
    assert raising.calls < REQUESTS / 2
    assert not records_from(caplog, "gym_concurrency"), "the faults reached gym_concurrency"
    assert not records_from(caplog, "uvicorn"), "a fault reached a request"


async def serve_with_failing_record(component: str, provider_with: Any) -> None:
    """Drive the app while every histogram record in the SDK raises; check every answer."""
    reader = InMemoryMetricReader(preferred_aggregation={Histogram: BrokenAggregation()})
    provider = provider_with([reader])
    with UvicornServer(limited_app(component, provider)) as server:
        outcomes = await drive(server.url)
    check_counts(outcomes, the_limit(component))


async def test_a_failing_sdk_record_never_reaches_a_request(
    component: str, provider_with: Any, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING)
    await serve_with_failing_record(component, provider_with)
    failures = records_from(caplog, "gym_concurrency")
    assert failures, "the failing record was not logged"
    assert "queue_wait_duration_ms" in failures[0].getMessage()
    assert not records_from(caplog, "uvicorn"), "a fault reached a request"


async def test_a_failing_sdk_record_is_logged_not_once_per_request(
    component: str, provider_with: Any, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING)
    await serve_with_failing_record(component, provider_with)
    failures = records_from(caplog, "gym_concurrency")
    assert 1 <= len(failures) <= 5, f"logged {len(failures)} times for {REQUESTS} requests"


def wait_for(condition: Any, what: str, timeout: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if condition():
            done.set()
            break
        done.wait(0.02)
    assert done.is_set(), f"timed out waiting for {what}"
