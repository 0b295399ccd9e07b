"""The process observer: reports every named limit (any `Limit`: a MeteredSemaphore, a limit
shared across processes) through observable instruments.

Limits are held weakly; a collected one stops reporting. Instruments are read at export, so
acquiring a slot makes no OpenTelemetry call (and a shared limit no Redis call: it reports
plain numbers kept in process). The global MeterProvider observes every named limit with no
call at all (through the API's proxy, also when the SDK provider is set later);
`observe_concurrency(provider)` adds another provider. Global limits carry the scope attribute
and report `admission_unavailable_total`; process limits carry no scope attribute.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from . import names
from .attributes import limit_attributes
from .limits import Limit, registered_limits
from .limits.registry import watch
from .meters import SCOPE_VERSION, meter_for

__all__ = ["observe_concurrency"]

_log = logging.getLogger(__name__)

_AttributeKey = tuple[tuple[str, str], ...]
_Reading = Callable[[Limit], "int | None"]

_ATTRIBUTES: dict[_AttributeKey, dict[str, str]] = {}

_lock = threading.Lock()
_global_instruments: list[Any] | None = None
_provider_instruments: weakref.WeakKeyDictionary[MeterProvider, list[Any]] = (
    weakref.WeakKeyDictionary()
)


def observe_concurrency(meter_provider: MeterProvider | None = None) -> None:
    """Report every named limit through `meter_provider` too (None = global); idempotent."""
    if meter_provider is None or meter_provider is metrics.get_meter_provider():
        _observe_global()
        return
    with _lock:
        if meter_provider not in _provider_instruments:
            _provider_instruments[meter_provider] = _create_instruments(meter_for(meter_provider))


def _observe_global(_limit: Limit | None = None) -> None:
    global _global_instruments
    if _global_instruments is not None:
        return
    with _lock:
        if _global_instruments is None:
            # The API's get_meter returns a proxy until an SDK provider is set, and the proxy
            # re-creates these instruments (callbacks included) on that provider once it is.
            meter = metrics.get_meter(names.METER_NAME, SCOPE_VERSION)
            _global_instruments = _create_instruments(meter)


# The global provider observes every named limit from the first one made, with no call.
watch(_observe_global)


def _attribute_key(limit: Limit) -> _AttributeKey:
    attributes = limit_attributes(limit)  # a registered limit has a component and a name
    key = tuple(attributes.items())
    if key not in _ATTRIBUTES:
        _ATTRIBUTES[key] = attributes
    return key


class _Instrument(NamedTuple):
    name: str
    monotonic: bool  # an observable counter, else an observable up-down counter
    read: _Reading  # None leaves the limit out (no timeout: no timeouts series)
    unit: str
    description: str
    only_if: Callable[[Limit], bool] | None = None  # which limits have this series at all


_INSTRUMENTS = (
    _Instrument(
        names.CONCURRENCY_LIMIT_INSTRUMENT,
        monotonic=False,
        read=lambda s: s.limit,
        unit=names.SLOT_UNIT,
        description="Slots a concurrency limit allows.",
    ),
    _Instrument(
        names.CONCURRENCY_ACTIVE_INSTRUMENT,
        monotonic=False,
        read=lambda s: s.active,
        unit=names.SLOT_UNIT,
        description="Slots of a concurrency limit held now.",
    ),
    _Instrument(
        names.CONCURRENCY_AVAILABLE_INSTRUMENT,
        monotonic=False,
        read=lambda s: s.available,
        unit=names.SLOT_UNIT,
        description="Slots of a concurrency limit free now.",
    ),
    _Instrument(
        names.QUEUE_DEPTH_INSTRUMENT,
        monotonic=False,
        read=lambda s: s.queue_depth,
        unit=names.REQUEST_UNIT,
        description="Tasks waiting for a slot of a concurrency limit now.",
    ),
    _Instrument(
        names.ADMISSION_TIMEOUTS_INSTRUMENT,
        monotonic=True,
        read=lambda s: s.admission_timeouts,
        only_if=lambda limit: limit.timeout is not None,
        unit=names.REQUEST_UNIT,
        description="Waits for a slot that gave up at the limit's timeout.",
    ),
    _Instrument(
        names.ADMISSION_CANCELLED_INSTRUMENT,
        monotonic=True,
        read=lambda s: s.admission_cancelled,
        unit=names.REQUEST_UNIT,
        description="Waits for a slot that were cancelled (e.g. the client went away).",
    ),
    _Instrument(
        names.ADMISSION_SHED_INSTRUMENT,
        monotonic=True,
        read=lambda s: s.admission_shed,
        only_if=lambda limit: limit.max_queue is not None,
        unit=names.REQUEST_UNIT,
        description="Acquires refused at once because the limit's queue was full.",
    ),
    _Instrument(
        names.ADMISSION_UNAVAILABLE_INSTRUMENT,
        monotonic=True,
        read=lambda s: s.statistics().admission_unavailable,
        only_if=lambda limit: limit.scope == names.GLOBAL_SCOPE,
        unit=names.REQUEST_UNIT,
        description=(
            "Admissions to a limit shared across processes that could not reach its store "
            "(refused, or admitted through the process-local fallback)."
        ),
    ),
    _Instrument(
        names.ADMISSION_LEASE_LOST_INSTRUMENT,
        monotonic=True,
        read=lambda s: s.statistics().admission_lease_lost,
        only_if=lambda limit: limit.scope == names.GLOBAL_SCOPE,
        unit=names.SLOT_UNIT,
        description=(
            "Leases of a limit shared across processes that this process could not renew "
            "within the lease (its store was away): their work ran on while the store may "
            "have granted their slots again."
        ),
    ),
)


def _create_instruments(meter: Meter) -> list[Any]:
    made = []
    for spec in _INSTRUMENTS:
        create = (
            meter.create_observable_counter
            if spec.monotonic
            else meter.create_observable_up_down_counter
        )
        callbacks = [_callback(spec)]
        made.append(create(spec.name, callbacks, unit=spec.unit, description=spec.description))
    return made


def _callback(spec: _Instrument) -> Callable[[CallbackOptions], Iterable[Observation]]:
    failed_before = False  # log the first failure with its traceback, later ones at debug

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        nonlocal failed_before
        try:
            return _observations(spec)
        except Exception:  # an exception must never reach the SDK's collection
            if failed_before:
                _log.debug("gym_concurrency: observing %s failed again", spec.name)
            else:
                failed_before = True
                _log.exception("gym_concurrency: observing %s failed; reporting nothing", spec.name)
            return []

    return observe


def _observations(spec: _Instrument) -> list[Observation]:
    """One point per attribute set: the limits that share one are summed (as one limit)."""
    totals: dict[_AttributeKey, int] = {}
    for limit in registered_limits():
        if spec.only_if is not None and not spec.only_if(limit):
            continue
        value = spec.read(limit)
        if value is not None:
            key = _attribute_key(limit)
            totals[key] = totals.get(key, 0) + value
    return [Observation(value, _ATTRIBUTES[key]) for key, value in totals.items()]
