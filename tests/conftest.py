"""Fixtures shared by every test folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.metrics_capture import MetricsCapture


@pytest.fixture
def metrics() -> Iterator[MetricsCapture]:
    """A private SDK MeterProvider (never the global one) with an in-memory reader."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield MetricsCapture(provider, reader)
    provider.shutdown()
