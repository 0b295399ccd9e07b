"""The queue-wait histogram: how long each admission attempt on a limited route waited, by
outcome (admitted, timeout, deadline, cancelled, shed), so failed waits are seen and not only
counted."""

from __future__ import annotations

from opentelemetry.metrics import Histogram, Meter, MeterProvider

from gym_concurrency.meters import PerMeter, SafeRecorder
from gym_concurrency.names import MILLISECONDS_UNIT, OPERATION_BOUNDARIES_MS, QUEUE_WAIT_INSTRUMENT

__all__ = ["QueueWaitRecorder"]


def _make_histogram(meter: Meter) -> Histogram:
    return meter.create_histogram(
        QUEUE_WAIT_INSTRUMENT,
        unit=MILLISECONDS_UNIT,
        description="Time a request waited for a slot of its route's concurrency limit, "
        "by admission outcome.",
        explicit_bucket_boundaries_advisory=OPERATION_BOUNDARIES_MS,
    )


_HISTOGRAMS: PerMeter[Histogram] = PerMeter(_make_histogram)


class QueueWaitRecorder(SafeRecorder):
    """Records queue waits on `meter_provider` (None = the global one, read at each use); a
    failing SDK is logged, never raised into the request."""

    __slots__ = ("_provider",)

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        super().__init__()
        self._provider = meter_provider

    def histogram(self) -> Histogram | None:
        """The histogram to record on, or None while nothing exports."""
        return _HISTOGRAMS.get(self._provider)
