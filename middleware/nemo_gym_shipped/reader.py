"""The metric reader of our own provider: every `interval` seconds, on one daemon thread, what
the provider collects goes to one exporter; once more at shutdown (the process's last state).

Why not the SDK's PeriodicExportingMetricReader: it registers a fork handler that starts a new
export thread in every forked child, and NeMo Gym's servers fork per request (math_with_judge
forks a process per verification), each fork then paying for a thread its short-lived child
never uses. Threads do not survive a fork: here a forked child exports nothing. Imported only
when our provider is made (it imports the OpenTelemetry SDK).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, MetricsData

__all__ = ["IntervalReader"]

_LOGGER = logging.getLogger("gym_concurrency.nemo_gym")


class IntervalReader(MetricReader):
    """Collects every `interval` seconds and at shutdown, and hands each collection to
    `exporter` (whose errors are logged, never raised)."""

    def __init__(self, exporter: MetricExporter, interval: float) -> None:
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self._exporter = exporter
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._tick, name="gym-concurrency-limits-export", daemon=True
        )
        self._thread.start()

    def _tick(self) -> None:
        while not self._stopped.wait(self._interval):
            self.collect()

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        try:
            self._exporter.export(metrics_data, timeout_millis=timeout_millis)
        except Exception:  # an export failure never reaches a request or a run
            _LOGGER.exception("gym_concurrency: exporting the limits failed")

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._thread.join(timeout=timeout_millis / 1000)
        self.collect(timeout_millis=timeout_millis)
        self._exporter.shutdown(timeout_millis=timeout_millis)
