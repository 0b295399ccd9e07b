"""The outbound instruments: retries made, retries denied and time spent backing off, each with
the attributes of the limit the calls go through. Nothing is recorded unless an SDK
MeterProvider exports (see gym_concurrency.meters); recording happens only when a call
retries or is denied one, never on an attempt that simply succeeds."""

from __future__ import annotations

from opentelemetry.metrics import Meter, MeterProvider

from .. import names
from ..attributes import limit_attributes
from ..limits import Limit
from ..meters import PerMeter, SafeRecorder
from .retry import BackoffSource, DeniedReason, RetryReason

__all__ = ["ClientMetrics"]


class _Instruments(SafeRecorder):
    """The three instruments on one meter."""

    __slots__ = ("backoff", "denied", "retries")

    def __init__(self, meter: Meter) -> None:
        super().__init__()
        self.retries = meter.create_counter(
            names.CLIENT_RETRIES_INSTRUMENT,
            unit=names.RETRY_UNIT,
            description="Retries of outbound calls, by reason.",
        )
        self.denied = meter.create_counter(
            names.CLIENT_RETRIES_DENIED_INSTRUMENT,
            unit=names.RETRY_UNIT,
            description="Retries of outbound calls not made, by what denied them.",
        )
        self.backoff = meter.create_histogram(
            names.CLIENT_BACKOFF_DURATION_INSTRUMENT,
            unit=names.MILLISECONDS_UNIT,
            description="Time an outbound call waited before a retry, by where the wait came from.",
            explicit_bucket_boundaries_advisory=names.OPERATION_BOUNDARIES_MS,
        )


_PER_METER: PerMeter[_Instruments] = PerMeter(_Instruments)


def _by_value(base: dict[str, str], key: str, values: frozenset[str]) -> dict[str, dict[str, str]]:
    return {value: {**base, key: value} for value in values}


class ClientMetrics:
    """What one limited client records, with its limit's attributes (built once)."""

    __slots__ = ("_backoff", "_denied", "_provider", "_retries")

    def __init__(self, limit: Limit, meter_provider: MeterProvider | None = None) -> None:
        base = limit_attributes(limit)
        self._provider = meter_provider
        self._retries = _by_value(base, names.RETRY_REASON_ATTRIBUTE, names.RETRY_REASONS)
        self._denied = _by_value(
            base, names.RETRY_DENIED_REASON_ATTRIBUTE, names.RETRY_DENIED_REASONS
        )
        self._backoff = _by_value(base, names.BACKOFF_SOURCE_ATTRIBUTE, names.BACKOFF_SOURCES)

    def retried(self, reason: RetryReason, delay_seconds: float, source: BackoffSource) -> None:
        """A retry was granted for `reason`, after `delay_seconds` taken from `source`."""
        instruments = _PER_METER.get(self._provider)
        if instruments is not None:
            instruments.add(instruments.retries, 1, self._retries[reason])
            instruments.record(instruments.backoff, delay_seconds * 1000.0, self._backoff[source])

    def denied(self, reason: DeniedReason) -> None:
        """A retry the outcome called for was not made, for `reason`."""
        instruments = _PER_METER.get(self._provider)
        if instruments is not None:
            instruments.add(instruments.denied, 1, self._denied[reason])
