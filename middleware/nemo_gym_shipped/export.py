"""Where the shipped limits are exported: through NeMo Gym's own telemetry when it exports
(its SDK MeterProvider is the global one, which the observer reports every named limit through
with no call), else as this process's own, once per process.

Ours follows `GYM_CONCURRENCY_NEMO_GYM_EXPORTER`, a comma list of:
- `console_line` (the default): the seed PR's console line on stderr (`console_lines.py`);
- `otlp` (OTLP over HTTP, the standard `OTEL_EXPORTER_OTLP_*` variables) and `console` (the
  SDK's JSON), through a MeterProvider of ours (the OpenTelemetry SDK; each fork of a process
  with one re-reads its resource in the child, which NeMo Gym's math_with_judge pays once per
  verification);
- `none`.
Every `OTEL_METRIC_EXPORT_INTERVAL` milliseconds (5000 by default), and once more at exit.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from gym_concurrency import observe_concurrency

from .console_lines import ConsoleLines

__all__ = ["EXPORTER_VARIABLE", "ensure_export", "nemo_gym_exports"]

EXPORTER_VARIABLE = "GYM_CONCURRENCY_NEMO_GYM_EXPORTER"
_LOGGER = logging.getLogger("gym_concurrency.nemo_gym")
_lock = threading.Lock()
_done: list[bool] = []


def nemo_gym_exports() -> bool:
    """Whether NeMo Gym's own telemetry exports metrics in this process."""
    try:
        from nemo_gym.telemetry.setup import is_metrics_exporter_active
    except ImportError:
        return False
    return bool(is_metrics_exporter_active())


def ensure_export() -> None:
    """Export this process's limits: nothing to do when NeMo Gym's telemetry exports (the
    global provider reports them), else ours, once. Never raises."""
    with _lock:
        if _done:
            return
        _done.append(True)
    if nemo_gym_exports():
        return
    try:
        _start_own()
    except Exception:  # a telemetry failure must never stop a server or a run
        _LOGGER.exception("gym_concurrency: could not set up the limits' exporter")


def _start_own() -> None:
    wanted = os.environ.get(EXPORTER_VARIABLE, "console_line")
    names = {name.strip() for name in wanted.split(",")} - {"", "none"}
    unknown = names - {"console_line", "console", "otlp"}
    if unknown:
        raise ValueError(f"{EXPORTER_VARIABLE}: unknown exporters {sorted(unknown)}")
    interval = float(os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "5000")) / 1000
    if "console_line" in names:
        ConsoleLines(interval).start()
    sdk = names & {"console", "otlp"}
    if sdk:
        observe_concurrency(_sdk_provider(sdk, interval))


def _sdk_provider(names: set[str], interval: float) -> Any:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter

    from .reader import IntervalReader

    exporters: list[MetricExporter] = []
    if "console" in names:
        exporters.append(ConsoleMetricExporter())
    if "otlp" in names:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporters.append(OTLPMetricExporter())
    return MeterProvider(metric_readers=[IntervalReader(e, interval) for e in exporters])
