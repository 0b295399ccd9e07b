"""Which meter to record on, and whether anything is exporting at all.

Recording is skipped unless a real (SDK) MeterProvider is in use: the API's no-op and proxy
providers discard every point, so building attributes and reading clocks for them is waste.
"""

from __future__ import annotations

import importlib
import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from opentelemetry import metrics
from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider, NoOpMeterProvider

from .names import METER_NAME

# The API's private module: its set-once global (read directly, see current_provider) and the
# proxy that stands in for the global provider until the application sets one. Looked up by
# name, so that an API which moved them degrades to the public calls instead of failing.
_api_internal = importlib.import_module("opentelemetry.metrics._internal")
_NOT_EXPORTING: tuple[type, ...] = (
    NoOpMeterProvider,
    *[t for t in (getattr(_api_internal, "_ProxyMeterProvider", None),) if isinstance(t, type)],
)

SCOPE_VERSION = "0.1.0"
T = TypeVar("T")

_log = logging.getLogger("gym_concurrency")

_MOVED = object()  # the API no longer has the private global: ask it the public way
_HAS_GLOBAL = hasattr(_api_internal, "_METER_PROVIDER")
_METERS: weakref.WeakKeyDictionary[MeterProvider, Meter] = weakref.WeakKeyDictionary()
_environment_consulted = False
_global_seen: MeterProvider | None = None  # the global provider, once it was seen to be one


def is_exporting(provider: MeterProvider) -> bool:
    """True if `provider` records points: neither the API's no-op nor its unset proxy."""
    return not isinstance(provider, _NOT_EXPORTING)


def current_provider(meter_provider: MeterProvider | None = None) -> MeterProvider | None:
    """`meter_provider`, else the global provider once one is set; None while none is.

    Reads the API's set-once global directly: `get_meter_provider()` looks the environment up
    on every call, which would cost more than the rest of a request's bookkeeping.
    """
    global _environment_consulted, _global_seen
    if meter_provider is not None:
        return meter_provider
    provider = _api_internal._METER_PROVIDER if _HAS_GLOBAL else _MOVED
    # The common answers first, with no ABC isinstance (slow, and paid on every operation).
    if provider is None:
        if _environment_consulted:
            return None
        _environment_consulted = True
        metrics.get_meter_provider()  # lets OTEL_PYTHON_METER_PROVIDER set the global now
        provider = getattr(_api_internal, "_METER_PROVIDER", None)
    elif provider is _global_seen:
        return _global_seen
    if provider is _MOVED:  # pragma: no cover - depends on the API's internals
        return metrics.get_meter_provider()
    if isinstance(provider, MeterProvider):
        _global_seen = provider  # set once per process: checked once
        return provider
    return None


def meter_for(provider: MeterProvider) -> Meter:
    """The project's meter on `provider`, made once per provider."""
    meter = _METERS.get(provider)
    if meter is None:
        meter = _METERS[provider] = provider.get_meter(METER_NAME, SCOPE_VERSION)
    return meter


class PerMeter(Generic[T]):
    """Instruments made once per exporting meter by `make(meter)`.

    `get(meter_provider)` answers None while nothing exports; the last provider's answer is
    kept, since a process almost always records through one provider.
    """

    def __init__(self, make: Callable[[Meter], T]) -> None:
        self.made: weakref.WeakKeyDictionary[Meter, T] = weakref.WeakKeyDictionary()
        self._make = make
        self._last: tuple[MeterProvider, T | None] | None = None

    def get(self, meter_provider: MeterProvider | None = None) -> T | None:
        """What `make` made for `meter_provider` (None = global), or None if it exports nothing."""
        if (
            meter_provider is None
            and _environment_consulted
            and _HAS_GLOBAL
            and _api_internal._METER_PROVIDER is None
        ):
            return None  # no global provider yet: the common answer, with no call at all
        provider = current_provider(meter_provider)
        if provider is None:
            return None
        last = self._last
        if last is not None and last[0] is provider:
            return last[1]
        found = None
        if is_exporting(provider):
            meter = meter_for(provider)
            found = self.made.get(meter)
            if found is None:
                found = self.made[meter] = self._make(meter)
        self._last = (provider, found)
        return found


class SafeRecorder:
    """Records histogram points and counter increments; an SDK failure is logged (the first
    with its traceback, later ones at debug level) and never raised into the work measured."""

    __slots__ = ("_failures",)

    def __init__(self) -> None:
        self._failures = 0

    def record(self, histogram: Histogram, value: float, attributes: Mapping[str, str]) -> None:
        """Record `value` on `histogram`, whatever the SDK does."""
        try:
            histogram.record(value, attributes)
        except Exception:  # an exporter or SDK bug must not fail the request or the operation
            self._failed(histogram)

    def add(self, counter: Counter, amount: int, attributes: Mapping[str, str]) -> None:
        """Add `amount` to `counter`, whatever the SDK does."""
        try:
            counter.add(amount, attributes)
        except Exception:  # as for record()
            self._failed(counter)

    def _failed(self, instrument: object) -> None:
        self._failures += 1
        name = getattr(instrument, "name", "an instrument")
        if self._failures == 1:
            _log.exception(
                "gym_concurrency: recording %s failed (further failures logged at debug)", name
            )
        else:
            _log.debug("gym_concurrency: recording %s failed again", name)
