"""The process observer: reports every named limit (any `Limit`: a MeteredSemaphore, a limit
shared across processes) through observable instruments.

Limits are held weakly; a collected one stops reporting. Instruments are read at export, so
acquiring a slot makes no OpenTelemetry call (and a shared limit no Redis call: it reports
plain numbers kept in process). The global MeterProvider observes every named limit with no
call at all (through the API's proxy, also when the SDK provider is set later);
`observe_concurrency(provider)` adds another provider. Global limits carry the scope attribute
and report `admission_unavailable_total`; process limits carry no scope attribute.

A limit with a rate budget or an engine signal also reports them (upstream_instruments.py).

Per flow, cardinality is bounded for the life of the process (flow_series.py): each limit's
flows go under labels from a bounded vocabulary: "default", its first
`set_flow_names_per_limit(k)` flows by name (default 32), rank slots "top:1".."top:N" for its
busiest flows without a name (N: `set_flow_series_per_limit(n)`, default 5) and "other" for
the rest; a label once reported stays, at 0 while its flow is idle.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from . import names
from .attributes import limit_attributes
from .busiest_flows import FlowRow
from .flow_series import FlowSeries
from .limits import FlowStatistics, Limit, registered_limits
from .limits.registry import watch
from .meters import SCOPE_VERSION, meter_for
from .upstream_instruments import create_upstream_instruments

__all__ = ["observe_concurrency", "set_flow_names_per_limit", "set_flow_series_per_limit"]

_log = logging.getLogger(__name__)

_AttributeKey = tuple[tuple[str, str], ...]
_Reading = Callable[[Limit], "int | None"]

_ATTRIBUTES: dict[_AttributeKey, dict[str, str]] = {}

_lock = threading.Lock()
_flow_series_per_limit: int = names.DEFAULT_FLOW_SERIES_PER_LIMIT
_flow_names_per_limit: int = names.DEFAULT_FLOW_NAMES_PER_LIMIT
_flow_series = FlowSeries()  # every provider's: they all report the same labels
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


def set_flow_series_per_limit(n: int) -> None:
    """Report each limit's `n` busiest flows (by held + queued weight) on their own: by name,
    or in rank slots "top:1".."top:n" once the limit has no room for another name; 0 reports
    no flow series at all. Process-wide, for every provider, from the next export. Default 5."""
    global _flow_series_per_limit
    _flow_series_per_limit = _checked("flow series per limit", n, "0: no flow series")


def set_flow_names_per_limit(k: int) -> None:
    """Let each limit name at most `k` flows (besides "default") in its flow series: the
    first k among its busiest it reports; 0 names none. Process-wide, for every provider,
    from the next export (names given stay). Default 32."""
    global _flow_names_per_limit
    _flow_names_per_limit = _checked("flow names per limit", k, "0: none")


def _checked(what: str, n: int, zero: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{what} must be an int, got {n!r}")
    if n < 0:
        raise ValueError(f"{what} must be >= 0 ({zero}), got {n}")
    return n


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
        names.QUEUED_WEIGHT_INSTRUMENT,
        monotonic=False,
        read=lambda s: s.statistics().queued_weight,
        unit=names.WEIGHT_UNIT,
        description="Weight the tasks waiting for a concurrency limit ask for now.",
    ),
    _Instrument(
        names.ADMISSION_TIMEOUTS_INSTRUMENT,
        monotonic=True,
        read=lambda s: s.admission_timeouts,
        # Without a timeout, a waiter's own deadline may still refuse: shown once one has.
        only_if=lambda limit: limit.timeout is not None or limit.admission_timeouts > 0,
        unit=names.REQUEST_UNIT,
        description="Waits for a slot that gave up at the limit's timeout or their deadline.",
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


class _FlowInstrument(NamedTuple):
    """An observable up-down counter with a point per reported flow of each limit."""

    name: str
    read: Callable[[FlowRow], int]
    unit: str
    description: str


_FLOW_INSTRUMENTS = (
    _FlowInstrument(
        names.FLOW_HELD_INSTRUMENT,
        read=lambda f: f.held,
        unit=names.WEIGHT_UNIT,
        description="Weight of a concurrency limit a flow holds now (named flows, the busiest "
        'others in rank slots "top:N", the rest as flow "other").',
    ),
    _FlowInstrument(
        names.FLOW_QUEUE_DEPTH_INSTRUMENT,
        read=lambda f: f.queue_depth,
        unit=names.REQUEST_UNIT,
        description="Tasks of a flow waiting for a concurrency limit now.",
    ),
    _FlowInstrument(
        names.FLOW_QUEUED_WEIGHT_INSTRUMENT,
        read=lambda f: f.queued_weight,
        unit=names.WEIGHT_UNIT,
        description="Weight the waiting tasks of a flow ask of a concurrency limit now.",
    ),
)


def _create_instruments(meter: Meter) -> list[Any]:
    readings = _FlowReadings()  # one per provider: its flow instruments share each reading
    made = []
    for spec in (*_INSTRUMENTS, *_FLOW_INSTRUMENTS):
        if isinstance(spec, _FlowInstrument):
            observations = partial(readings.observations, spec)
        else:
            observations = partial(_observations, spec)
        create = (
            meter.create_observable_counter
            if isinstance(spec, _Instrument) and spec.monotonic
            else meter.create_observable_up_down_counter
        )
        callbacks = [_guarded(spec.name, observations)]
        made.append(create(spec.name, callbacks, unit=spec.unit, description=spec.description))
    return made + create_upstream_instruments(meter, _guarded, _attributes_of)


def _attributes_of(limit: Limit) -> dict[str, str]:
    return _ATTRIBUTES[_attribute_key(limit)]


def _guarded(
    name: str, observations: Callable[[], list[Observation]]
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    """A callback reporting `observations()`, or nothing (logged) if reading fails."""
    failed_before = False  # log the first failure with its traceback, later ones at debug

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        nonlocal failed_before
        try:
            return observations()
        except Exception:  # an exception must never reach the SDK's collection
            if failed_before:
                _log.debug("gym_concurrency: observing %s failed again", name)
            else:
                failed_before = True
                _log.exception("gym_concurrency: observing %s failed; reporting nothing", name)
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


_FLOW_READING_SECONDS = 1.0  # one export reads its flow instruments well within this


class _FlowReadings:
    """Every limit's reported flows, read once and shared by one provider's flow instruments:
    each instrument takes a reading once; one taking it again (the next export) or later than
    _FLOW_READING_SECONDS reads anew. The flow series of one export thus agree (the same
    flows named, the same rest) and the limits are read once, not once per instrument."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[_AttributeKey, list[FlowRow]] = {}
        self._taken: set[str] = set()
        self._read_at = -math.inf  # nothing read yet

    def observations(self, spec: _FlowInstrument) -> list[Observation]:
        """One point per label each attribute set reports, the label as FLOW_ATTRIBUTE."""
        found = []
        for key, rows in self._take(spec.name).items():
            attributes = _ATTRIBUTES[key]
            found += [
                Observation(spec.read(row), {**attributes, names.FLOW_ATTRIBUTE: row.flow})
                for row in rows
            ]
        return found

    def _take(self, name: str) -> dict[_AttributeKey, list[FlowRow]]:
        with self._lock:
            now = time.monotonic()
            if name in self._taken or now - self._read_at > _FLOW_READING_SECONDS:
                self._rows = _read_flows(_flow_series_per_limit)
                self._taken.clear()
                self._read_at = now
            self._taken.add(name)
            return self._rows


def _read_flows(top: int) -> dict[_AttributeKey, list[FlowRow]]:
    """Per attribute set of the limits alive: its limits' flows merged, under the labels it
    reports (flow_series.py), every label it reported before included. Nothing at all when
    `top` is 0."""
    if top == 0:
        return {}
    flows: dict[_AttributeKey, list[FlowStatistics]] = {}
    for limit in registered_limits():
        flows.setdefault(_attribute_key(limit), []).extend(_flows_of(limit))
    names_per_limit = _flow_names_per_limit
    return {
        key: _flow_series.report(key, merged, top, names_per_limit) for key, merged in flows.items()
    }


def _flows_of(limit: Limit) -> list[FlowStatistics]:
    """`limit.flow_statistics()`, read again (up to twice) if the event loop's thread changed
    the limit's flows while this, the exporter's thread, went through them."""
    for _ in range(2):
        try:
            return limit.flow_statistics()
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return limit.flow_statistics()
