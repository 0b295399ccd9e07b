"""Which meter to record on, and whether anything is exporting at all.

Recording is skipped unless a real (SDK) MeterProvider is in use: the API's no-op and proxy
providers discard every point, so building attributes and reading clocks for them is waste.
"""

from __future__ import annotations

import weakref

from opentelemetry import metrics
from opentelemetry.metrics import Meter, MeterProvider, NoOpMeterProvider

from .names import METER_NAME

try:  # The proxy stands in for the global provider until the application sets one.
    from opentelemetry.metrics._internal import _ProxyMeterProvider
except ImportError:  # pragma: no cover - a future API that moved it
    _ProxyMeterProvider = NoOpMeterProvider  # type: ignore[misc,assignment]

SCOPE_VERSION = "0.1.0"
_METERS: weakref.WeakKeyDictionary[MeterProvider, Meter] = weakref.WeakKeyDictionary()


def is_exporting(provider: MeterProvider) -> bool:
    """True if `provider` records points: neither the API's no-op nor its unset proxy."""
    return not isinstance(provider, (NoOpMeterProvider, _ProxyMeterProvider))


def resolve_provider(meter_provider: MeterProvider | None) -> MeterProvider:
    """`meter_provider`, or the global provider when it is None."""
    return metrics.get_meter_provider() if meter_provider is None else meter_provider


def meter_for(provider: MeterProvider) -> Meter:
    """The project's meter on `provider`, made once per provider."""
    meter = _METERS.get(provider)
    if meter is None:
        meter = _METERS[provider] = provider.get_meter(METER_NAME, SCOPE_VERSION)
    return meter


def exporting_meter(meter_provider: MeterProvider | None = None) -> Meter | None:
    """The project's meter on `meter_provider` (None = global), or None if it exports nothing."""
    provider = resolve_provider(meter_provider)
    return meter_for(provider) if is_exporting(provider) else None
