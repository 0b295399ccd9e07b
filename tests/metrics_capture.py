"""Reading what an SDK MeterProvider collected, for tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader


@dataclass
class MetricsCapture:
    """An SDK MeterProvider with an in-memory reader, and ways to read what it collected."""

    provider: MeterProvider
    reader: InMemoryMetricReader

    def collect(self) -> dict[str, list[Any]]:
        """Every metric collected now: name -> its data points."""
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        if data is None:
            return found
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def values(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        """Collect now; the named metric's points keyed by attribute set (value, or the point)."""
        points = self.collect().get(name, [])
        return {frozenset(p.attributes.items()): getattr(p, "value", p) for p in points}
