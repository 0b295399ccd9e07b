"""Where the shipped limits are exported: through NeMo Gym's own telemetry when it exports
(its SDK MeterProvider is the global one, which the observer reports every named limit through
with no call), else as this process's own, once per process. Either way one INFO line says
which, and when NeMo Gym's telemetry exports nothing, why (`nemo_telemetry.why_not_exporting`).

Ours follows `GYM_CONCURRENCY_NEMO_GYM_EXPORTER`, a comma list of:
- `console_line` (the default): the seed PR's console line on stderr (`console_lines.py`);
- `otlp` (OTLP over HTTP, the standard `OTEL_EXPORTER_OTLP_*` variables) and `console` (the
  SDK's JSON), through a MeterProvider of ours (the OpenTelemetry SDK; each fork of a process
  with one re-reads its resource in the child, which NeMo Gym's math_with_judge pays once per
  verification);
- `none`.
Every INTERVAL_VARIABLE milliseconds (else `OTEL_METRIC_EXPORT_INTERVAL`, else 5000), and once
more at exit. Our own variable comes first because nemo-lens reads `OTEL_METRIC_EXPORT_INTERVAL`
too: setting it for our console lines would drive NeMo Gym's exporter at the same rate.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from gym_concurrency import observe_concurrency

from .console_lines import ConsoleLines
from .nemo_telemetry import why_not_exporting

__all__ = [
    "EXPORTER_VARIABLE",
    "INTERVAL_VARIABLE",
    "ensure_export",
    "export_interval",
    "nemo_gym_exports",
]

EXPORTER_VARIABLE = "GYM_CONCURRENCY_NEMO_GYM_EXPORTER"
INTERVAL_VARIABLE = "GYM_CONCURRENCY_NEMO_GYM_EXPORT_INTERVAL"
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


def ensure_export(owner: str) -> None:
    """Export this process's limits: nothing to do when NeMo Gym's telemetry exports (the
    global provider reports them), else ours, once. Says which at INFO, naming `owner` (the
    server, or the rollout driver). Never raises."""
    with _lock:
        if _done:
            return
        _done.append(True)
    if nemo_gym_exports():
        _LOGGER.info(
            "gym_concurrency: %s's limits are exported through NeMo Gym's telemetry (its "
            "exporter and resource)",
            owner,
        )
        return
    try:
        instead = _start_own()
    except Exception:  # a telemetry failure must never stop a server or a run
        _LOGGER.exception("gym_concurrency: could not set up the limits' exporter")
        return
    _LOGGER.info(
        "gym_concurrency: NeMo Gym's telemetry exports nothing in %s's process (%s); its "
        "limits are exported by gym-concurrency instead: %s",
        owner,
        why_not_exporting(),
        instead,
    )


def _start_own() -> str:
    """Start the exporters EXPORTER_VARIABLE names; what they are, in words."""
    wanted = os.environ.get(EXPORTER_VARIABLE, "console_line")
    names = {name.strip() for name in wanted.split(",")} - {"", "none"}
    unknown = names - {"console_line", "console", "otlp"}
    if unknown:
        raise ValueError(f"{EXPORTER_VARIABLE}: unknown exporters {sorted(unknown)}")
    interval = export_interval()
    if "console_line" in names:
        ConsoleLines(interval).start()
    sdk = names & {"console", "otlp"}
    if sdk:
        observe_concurrency(_sdk_provider(sdk, interval))
    if not names:
        return f"none ({EXPORTER_VARIABLE}={wanted})"
    return f"{', '.join(sorted(names))} every {interval:g} s ({EXPORTER_VARIABLE})"


def export_interval() -> float:
    """Seconds between our exports: INTERVAL_VARIABLE (ms), else OTEL_METRIC_EXPORT_INTERVAL
    (ms), else 5; a value that is not a positive number is an error naming its variable."""
    for variable in (INTERVAL_VARIABLE, "OTEL_METRIC_EXPORT_INTERVAL"):
        raw = os.environ.get(variable, "").strip()
        if not raw:
            continue
        try:
            milliseconds = float(raw)
        except ValueError:
            milliseconds = 0.0
        if not milliseconds > 0 or milliseconds == float("inf"):
            raise ValueError(f"{variable} must be a positive number of milliseconds, got {raw!r}")
        return milliseconds / 1000
    return 5.0


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
