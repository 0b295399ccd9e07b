"""The demo exporting over OTLP/HTTP to a receiver in the test that decodes the real protobuf,
and an unreachable collector that no request notices."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from demo_processes import demo, example_settings, fake_model, free_port, wait_for

from tests.otlp_receiver import OtlpReceiver

EPISODE = {
    "episode_id": "e-1",
    "task": {"task_id": "t-1", "prompt": "The answer is 42", "expected": "42"},
}
CONCURRENCY = {
    "gym.concurrency.limit",
    "gym.concurrency.active",
    "gym.concurrency.available",
    "gym.concurrency.queue_depth",
    "gym.concurrency.admission_timeouts_total",
    "gym.concurrency.admission_cancelled_total",
    "gym.concurrency.admission_shed_total",
    "gym.concurrency.queue_wait_duration_ms",
}
OPERATIONS = {
    "gym.resources.operation.queue_duration_ms",
    "gym.resources.operation.duration_ms",
    "gym.resources.operation.queued",
    "gym.resources.operation.active",
}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def otlp_env(endpoint: str) -> dict[str, str]:
    return {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        "OTEL_SERVICE_NAME": "otlp-test-demo",
    }


def test_the_demo_exports_every_gym_instrument_over_otlp(tmp_path: Path, receiver: OtlpReceiver):
    with (
        fake_model(tmp_path) as upstream,
        demo(tmp_path, upstream, **otlp_env(receiver.url)) as (url, _),
    ):
        assert httpx.post(f"{url}/run", json=EPISODE, timeout=10).json()["failure"] is None
        judged = httpx.post(f"{url}/judge", json={"response": "42", "expected": "42"}, timeout=10)
        assert judged.status_code == 200
        assert httpx.get(f"{url}/metrics", timeout=5).status_code == 404  # no prometheus reader
        wanted = CONCURRENCY | OPERATIONS | {"http.server.request.duration"}
        wait_for(lambda: wanted <= set(receiver.points()), 15, "every instrument over OTLP")
    points = receiver.points()
    limits = {
        attrs["nemo.gym.concurrency.limit_name"]: point.as_int
        for attrs, point in points["gym.concurrency.limit"]
    }
    assert limits == {
        "episodes": 8,
        "upstream_requests": 16,
        "verify_requests": 32,
        "verifier": 2,
        "judge": 4,
    }
    outcomes = {
        (
            attrs["nemo.gym.resources.operation"],
            attrs["nemo.gym.resources.executor"],
            attrs["nemo.gym.resources.operation.outcome"],
        )
        for attrs, point in points["gym.resources.operation.duration_ms"]
        if point.count > 0
    }
    assert outcomes == {("verify", "subprocess", "ok"), ("judge", "inline", "ok")}
    admitted = [
        point
        for attrs, point in points["gym.concurrency.queue_wait_duration_ms"]
        if attrs.get("nemo.gym.concurrency.admission_outcome") == "admitted"
    ]
    assert admitted
    assert set(receiver.paths) == {"/v1/metrics"}  # metrics only: traces are off by default
    resource = receiver.resources()[0]
    assert resource["service.name"] == "otlp-test-demo"
    assert resource["service.instance.id"]


def test_an_unreachable_collector_never_reaches_a_request(tmp_path: Path):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = example_settings(episodes={"max_concurrent": 2})
    with (
        fake_model(tmp_path) as upstream,
        demo(tmp_path, upstream, settings=settings, **otlp_env(endpoint)) as (url, process),
    ):
        for _ in range(10):
            response = httpx.post(f"{url}/run", json=EPISODE, timeout=10)
            assert response.status_code == 200
            assert response.json()["failure"] is None
        wait_for(lambda: failed_export(process.log()), 30, "the SDK to log a failed export")


def failed_export(log: str) -> bool:
    """Whether the SDK logged a failed export: a retry, or the attempt given up (which one
    comes first depends on the backoff's jitter against the 2 s export timeout)."""
    return any(
        line in log
        for line in (
            "exporting metrics batch",  # "Transient error ... while exporting metrics batch"
            "Failed to export metrics batch",  # "... due to timeout, max retries or shutdown"
            "Exception while exporting metrics",
        )
    )
