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
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from . import names
from .meters import SCOPE_VERSION, meter_for

if TYPE_CHECKING:
    from .limit import Limit

__all__ = ["observe_concurrency", "registered_limits", "registered_semaphores"]

_log = logging.getLogger(__name__)

_AttributeKey = tuple[tuple[str, str], ...]
_Reading = Callable[["Limit"], "int | None"]

# id(limit) -> (weak reference, attribute key). A plain dict so that a snapshot taken
# on the exporter's thread (`list(values())`) is atomic while the event loop registers more.
_REGISTRY: dict[int, tuple[weakref.ref[Limit], _AttributeKey]] = {}
_ATTRIBUTES: dict[_AttributeKey, dict[str, str]] = {}

_lock = threading.Lock()
_global_instruments: list[Any] | None = None
_provider_instruments: weakref.WeakKeyDictionary[MeterProvider, list[Any]] = (
    weakref.WeakKeyDictionary()
)


def register(limit: Limit) -> None:
    """Report `limit` (it has a component and a limit_name) until it is collected."""
    key = _attribute_key(limit)
    ident = id(limit)

    def forget(ref: weakref.ref[Limit]) -> None:
        entry = _REGISTRY.get(ident)
        if entry is not None and entry[0] is ref:
            _REGISTRY.pop(ident, None)

    _REGISTRY[ident] = (weakref.ref(limit, forget), key)
    if _global_instruments is None:
        _observe_global()


def registered_limits() -> list[Limit]:
    """The named limits alive now (of every kind), in registration order."""
    return [limit for ref, _ in list(_REGISTRY.values()) if (limit := ref()) is not None]


registered_semaphores = registered_limits  # the earlier name, kept working


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


def _attribute_key(limit: Limit) -> _AttributeKey:
    pairs = [
        (names.COMPONENT_ATTRIBUTE, str(limit.component)),
        (names.LIMIT_NAME_ATTRIBUTE, str(limit.limit_name)),
    ]
    if limit.server is not None:
        pairs.append((names.SERVER_ATTRIBUTE, limit.server))
    if limit.scope == names.GLOBAL_SCOPE:
        pairs.append((names.SCOPE_ATTRIBUTE, names.GLOBAL_SCOPE))
    key = tuple(pairs)
    _ATTRIBUTES.setdefault(key, dict(pairs))
    return key


class _Instrument(NamedTuple):
    name: str
    monotonic: bool  # an observable counter, else an observable up-down counter
    read: _Reading  # None leaves the limit out (no timeout: no timeouts series)
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
    _Instrument(
        names.ADMISSION_UNAVAILABLE_INSTRUMENT,
        monotonic=True,
        read=lambda s: _unavailable(s),
        unit=names.REQUEST_UNIT,
        description=(
            "Admissions to a limit shared across processes that could not reach its store "
            "(refused, or admitted through the process-local fallback)."
        ),
    ),
)


def _unavailable(limit: Limit) -> int | None:
    """A global limit's `admission_unavailable`; None (no series) for a process limit."""
    if limit.scope != names.GLOBAL_SCOPE:
        return None
    count = getattr(limit, "admission_unavailable", None)
    return count if isinstance(count, int) else None


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
        limit = ref()
        if limit is None:
            continue
        value = read(limit)
        if value is not None:
            totals[key] = totals.get(key, 0) + value
    return [Observation(value, _ATTRIBUTES[key]) for key, value in totals.items()]
