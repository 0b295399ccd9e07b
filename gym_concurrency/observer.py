"""The process observer: reports every named MeteredSemaphore through observable instruments.

Semaphores are held weakly; a collected one stops reporting. Instruments are read at export,
so acquiring a slot makes no OpenTelemetry call. The global MeterProvider observes every
named semaphore with no call at all (through the API's proxy, also when the SDK provider is
set later); `observe_concurrency(provider)` adds another provider.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from . import names
from .meters import SCOPE_VERSION, meter_for

if TYPE_CHECKING:
    from .semaphore import MeteredSemaphore

__all__ = ["observe_concurrency", "registered_semaphores"]

_log = logging.getLogger(__name__)

_AttributeKey = tuple[tuple[str, str], ...]
_Reading = Callable[["MeteredSemaphore"], "int | None"]

# id(semaphore) -> (weak reference, attribute key). A plain dict so that a snapshot taken
# on the exporter's thread (`list(values())`) is atomic while the event loop registers more.
_REGISTRY: dict[int, tuple[weakref.ref[MeteredSemaphore], _AttributeKey]] = {}
_ATTRIBUTES: dict[_AttributeKey, dict[str, str]] = {}

_lock = threading.Lock()
_global_instruments: list[Any] | None = None
_provider_instruments: weakref.WeakKeyDictionary[MeterProvider, list[Any]] = (
    weakref.WeakKeyDictionary()
)


def register(semaphore: MeteredSemaphore) -> None:
    """Report `semaphore` (it has a component and a limit_name) until it is collected."""
    key = _attribute_key(semaphore)
    ident = id(semaphore)

    def forget(ref: weakref.ref[MeteredSemaphore]) -> None:
        entry = _REGISTRY.get(ident)
        if entry is not None and entry[0] is ref:
            _REGISTRY.pop(ident, None)

    _REGISTRY[ident] = (weakref.ref(semaphore, forget), key)
    if _global_instruments is None:
        _observe_global()


def registered_semaphores() -> list[MeteredSemaphore]:
    """The named semaphores alive now, in registration order."""
    return [sem for ref, _ in list(_REGISTRY.values()) if (sem := ref()) is not None]


def observe_concurrency(meter_provider: MeterProvider | None = None) -> None:
    """Report every named semaphore through `meter_provider` too (None = global); idempotent."""
    if meter_provider is None or meter_provider is metrics.get_meter_provider():
        _observe_global()
        return
    with _lock:
        if meter_provider not in _provider_instruments:
            _provider_instruments[meter_provider] = _create_instruments(meter_for(meter_provider))


def _observe_global() -> None:
    global _global_instruments
    with _lock:
        if _global_instruments is None:
            # The API's get_meter returns a proxy until an SDK provider is set, and the proxy
            # re-creates these instruments (callbacks included) on that provider once it is.
            meter = metrics.get_meter(names.METER_NAME, SCOPE_VERSION)
            _global_instruments = _create_instruments(meter)


def _attribute_key(semaphore: MeteredSemaphore) -> _AttributeKey:
    pairs = [
        (names.COMPONENT_ATTRIBUTE, str(semaphore.component)),
        (names.LIMIT_NAME_ATTRIBUTE, str(semaphore.limit_name)),
    ]
    if semaphore.server is not None:
        pairs.append((names.SERVER_ATTRIBUTE, semaphore.server))
    key = tuple(pairs)
    _ATTRIBUTES.setdefault(key, dict(pairs))
    return key


class _Instrument(NamedTuple):
    name: str
    monotonic: bool  # an observable counter, else an observable up-down counter
    read: _Reading  # None leaves the semaphore out (no timeout: no timeouts series)
    unit: str
    description: str


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
        read=lambda s: None if s.timeout is None else s.admission_timeouts,
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
        read=lambda s: None if s.max_queue is None else s.admission_shed,
        unit=names.REQUEST_UNIT,
        description="Acquires refused at once because the limit's queue was full.",
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
        callbacks = [_callback(spec.name, spec.read)]
        made.append(create(spec.name, callbacks, unit=spec.unit, description=spec.description))
    return made


def _callback(what: str, read: _Reading) -> Callable[[CallbackOptions], Iterable[Observation]]:
    failed_before = False  # log the first failure with its traceback, later ones at debug

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        nonlocal failed_before
        try:
            return _observations(read)
        except Exception:  # an exception must never reach the SDK's collection
            if failed_before:
                _log.debug("gym_concurrency: observing %s failed again", what)
            else:
                failed_before = True
                _log.exception("gym_concurrency: observing %s failed; reporting nothing", what)
            return []

    return observe


def _observations(read: _Reading) -> list[Observation]:
    totals: dict[_AttributeKey, int] = {}
    for ref, key in list(_REGISTRY.values()):
        semaphore = ref()
        if semaphore is None:
            continue
        value = read(semaphore)
        if value is not None:
            totals[key] = totals.get(key, 0) + value
    return [Observation(value, _ATTRIBUTES[key]) for key, value in totals.items()]
