"""The queue-wait histogram: how long each admission attempt on a limited route waited, by
outcome (admitted, timeout, cancelled, shed), so failed waits are seen and not only counted."""

from __future__ import annotations

import logging
import weakref

from opentelemetry import metrics
from opentelemetry.metrics import Histogram, Meter, MeterProvider

from gym_concurrency.meters import exporting_meter
from gym_concurrency.names import MILLISECONDS_UNIT, OPERATION_BOUNDARIES_MS, QUEUE_WAIT_INSTRUMENT

__all__ = ["QueueWaitRecorder"]

try:  # set-once global behind get_meter_provider(); read directly on the request path
    from opentelemetry.metrics import _internal as _api_internal
except ImportError:  # pragma: no cover - an API that moved it: get_meter_provider() still works
    _api_internal = None  # type: ignore[assignment]

_log = logging.getLogger(__name__)
_HISTOGRAMS: weakref.WeakKeyDictionary[Meter, Histogram] = weakref.WeakKeyDictionary()


class QueueWaitRecorder:
    """Records queue waits on `meter_provider` (None = the global one, read at each use)."""

    __slots__ = ("_failures", "_last", "_provider")

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        self._provider = meter_provider
        self._last: tuple[MeterProvider, Histogram | None] | None = None
        self._failures = 0  # failed records: only the first is logged with its traceback
        # Lets OTEL_PYTHON_METER_PROVIDER create the global provider now, if it names one.
        metrics.get_meter_provider()

    def histogram(self) -> Histogram | None:
        """The histogram to record on, or None while nothing exports."""
        provider = self._provider if self._provider is not None else _global_provider()
        if provider is None:
            return None
        last = self._last
        if last is not None and last[0] is provider:
            return last[1]
        meter = exporting_meter(provider)
        histogram = None if meter is None else _histogram_on(meter)
        self._last = (provider, histogram)
        return histogram

    def record(self, histogram: Histogram, wait_ms: float, attributes: dict[str, str]) -> None:
        """Record one wait; a failing SDK is logged (the first time with its traceback, then
        at debug level), never raised into the request."""
        try:
            histogram.record(wait_ms, attributes)
        except Exception:  # an exporter or SDK bug must not fail a request
            self._failures += 1
            if self._failures == 1:
                _log.exception(
                    "gym_concurrency: recording %s failed (further failures logged at debug)",
                    QUEUE_WAIT_INSTRUMENT,
                )
            else:
                _log.debug("gym_concurrency: recording %s failed again", QUEUE_WAIT_INSTRUMENT)


def _global_provider() -> MeterProvider | None:
    """The global provider, or None while none is set; read without `get_meter_provider()`'s
    environment lookup (about 0.6 us, a tenth of the middleware's per-request budget)."""
    if _api_internal is None:  # pragma: no cover
        return metrics.get_meter_provider()
    provider: MeterProvider | None = getattr(_api_internal, "_METER_PROVIDER", None)
    return provider


def _histogram_on(meter: Meter) -> Histogram:
    histogram = _HISTOGRAMS.get(meter)
    if histogram is None:
        histogram = _HISTOGRAMS[meter] = meter.create_histogram(
            QUEUE_WAIT_INSTRUMENT,
            unit=MILLISECONDS_UNIT,
            description="Time a request waited for a slot of its route's concurrency limit, "
            "by admission outcome.",
            explicit_bucket_boundaries_advisory=OPERATION_BOUNDARIES_MS,
        )
    return histogram
