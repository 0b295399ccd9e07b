"""The queue-wait histogram: how long each admission attempt on a limited route waited, by
outcome (admitted, timeout, cancelled, shed), so failed waits are seen and not only counted."""

from __future__ import annotations

import logging

from opentelemetry.metrics import Histogram, Meter, MeterProvider

from gym_concurrency.meters import PerMeter
from gym_concurrency.names import MILLISECONDS_UNIT, OPERATION_BOUNDARIES_MS, QUEUE_WAIT_INSTRUMENT

__all__ = ["QueueWaitRecorder"]

_log = logging.getLogger(__name__)


def _make_histogram(meter: Meter) -> Histogram:
    return meter.create_histogram(
        QUEUE_WAIT_INSTRUMENT,
        unit=MILLISECONDS_UNIT,
        description="Time a request waited for a slot of its route's concurrency limit, "
        "by admission outcome.",
        explicit_bucket_boundaries_advisory=OPERATION_BOUNDARIES_MS,
    )


_HISTOGRAMS: PerMeter[Histogram] = PerMeter(_make_histogram)


class QueueWaitRecorder:
    """Records queue waits on `meter_provider` (None = the global one, read at each use)."""

    __slots__ = ("_failures", "_provider")

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        self._provider = meter_provider
        self._failures = 0  # failed records: only the first is logged with its traceback

    def histogram(self) -> Histogram | None:
        """The histogram to record on, or None while nothing exports."""
        return _HISTOGRAMS.get(self._provider)
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
