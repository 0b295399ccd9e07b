"""The queue-wait histogram: how long each admission attempt on a limited route waited, by
outcome (admitted, timeout, cancelled, shed), so failed waits are seen and not only counted."""

from __future__ import annotations

import logging
import weakref

from opentelemetry.metrics import Histogram, Meter, MeterProvider

from gym_concurrency.meters import exporting_meter, resolve_provider
from gym_concurrency.names import MILLISECONDS_UNIT, OPERATION_BOUNDARIES_MS, QUEUE_WAIT_INSTRUMENT

__all__ = ["QueueWaitRecorder"]

_log = logging.getLogger(__name__)
_HISTOGRAMS: weakref.WeakKeyDictionary[Meter, Histogram] = weakref.WeakKeyDictionary()


class QueueWaitRecorder:
    """Records queue waits on `meter_provider` (None = the global one, read at each use)."""

    __slots__ = ("_last", "_provider")

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        self._provider = meter_provider
        self._last: tuple[MeterProvider, Histogram | None] | None = None

    def histogram(self) -> Histogram | None:
        """The histogram to record on, or None while nothing exports."""
        provider = resolve_provider(self._provider)
        last = self._last
        if last is not None and last[0] is provider:
            return last[1]
        meter = exporting_meter(provider)
        histogram = None if meter is None else _histogram_on(meter)
        self._last = (provider, histogram)
        return histogram


def record(histogram: Histogram, wait_ms: float, attributes: dict[str, str]) -> None:
    """Record one wait; a failing SDK is logged, never raised into the request."""
    try:
        histogram.record(wait_ms, attributes)
    except Exception:  # an exporter or SDK bug must not fail a request
        _log.exception("gym_concurrency: recording %s failed", QUEUE_WAIT_INSTRUMENT)


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
