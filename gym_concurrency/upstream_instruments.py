"""The observer's instruments of a limit's upstream (docs/metrics.md): its rate budgets, one
point per budget (`nemo.gym.concurrency.budget`: tokens, requests, input_tokens,
output_tokens), and its engine signal's last reading, each with the limit's attributes.

Read at export from plain numbers (upstream_view.py: a RateBudget's or an EngineSignal's
`statistics()`, a shared limit's budgets as last seen): no Redis call, nothing on the
admission path. Limits sharing attributes are summed, as the slot instruments are; an
engine's readings (the same engine, read by each) are not summed: the freshest is reported.
A limit without a budget or an engine reports no such series (never a 0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from . import names
from .engines.signal import EngineStatistics
from .limits import Limit, registered_limits
from .limits.rate_budget import BudgetStatistics
from .upstream_view import upstream_statistics

__all__ = ["create_upstream_instruments"]

Guard = Callable[
    [str, Callable[[], list[Observation]]], Callable[[CallbackOptions], Iterable[Observation]]
]
AttributesOf = Callable[[Limit], dict[str, str]]


class _BudgetInstrument(NamedTuple):
    name: str
    monotonic: bool
    read: Callable[[BudgetStatistics], int | None]
    description: str


class _EngineInstrument(NamedTuple):
    name: str
    read: Callable[[EngineStatistics], float | None]
    unit: str
    description: str


_BUDGET_INSTRUMENTS = (
    _BudgetInstrument(
        names.BUDGET_LIMIT_INSTRUMENT,
        False,
        lambda b: b.limit,
        "What a limit's rate budget allows a minute (tokens or requests).",
    ),
    _BudgetInstrument(
        names.BUDGET_REMAINING_INSTRUMENT,
        False,
        lambda b: b.remaining,
        "What admission may take of a rate budget now (the provider's word where smaller).",
    ),
    _BudgetInstrument(
        names.BUDGET_RESERVED_INSTRUMENT,
        False,
        lambda b: b.reserved,
        "Estimates of calls admitted and not yet settled from their usage.",
    ),
    _BudgetInstrument(
        names.BUDGET_REFUNDED_INSTRUMENT,
        True,
        lambda b: b.refunded_total,
        "Estimates given back: what calls reserved and did not use, and calls never sent.",
    ),
    _BudgetInstrument(
        names.UPSTREAM_REPORTED_REMAINING_INSTRUMENT,
        False,
        lambda b: b.reported_remaining,
        "What the provider's rate-limit headers last said remains, until their reset.",
    ),
)

_ENGINE_INSTRUMENTS = (
    _EngineInstrument(
        names.ENGINE_WAITING_INSTRUMENT,
        lambda e: e.waiting,
        names.REQUEST_UNIT,
        "Requests waiting in the engine a limit follows, at its last scrape.",
    ),
    _EngineInstrument(
        names.ENGINE_CACHE_USAGE_INSTRUMENT,
        lambda e: e.cache_usage,
        names.RATIO_UNIT,
        "KV-cache usage (1 is full) of the engine a limit follows, at its last scrape.",
    ),
    _EngineInstrument(
        names.ENGINE_SIGNAL_AGE_INSTRUMENT,
        lambda e: e.signal_age_seconds,
        names.SECONDS_UNIT,
        "Age of the last reading of the engine a limit follows (stale past its bound).",
    ),
)


def create_upstream_instruments(
    meter: Meter, guard: Guard, attributes_of: AttributesOf
) -> list[Any]:
    """Every upstream instrument on `meter`; `guard` wraps a reading into a callback that
    never raises, `attributes_of` gives a limit's attributes."""
    made: list[Any] = []
    for spec in _BUDGET_INSTRUMENTS:
        create = (
            meter.create_observable_counter
            if spec.monotonic
            else meter.create_observable_up_down_counter
        )
        callback = guard(spec.name, partial(_budget_points, spec, attributes_of))
        made.append(
            create(spec.name, [callback], unit=names.BUDGET_UNIT, description=spec.description)
        )
    for engine in _ENGINE_INSTRUMENTS:
        callback = guard(engine.name, partial(_engine_points, engine, attributes_of))
        gauge = meter.create_observable_gauge  # a reading, not a sum
        made.append(
            gauge(engine.name, [callback], unit=engine.unit, description=engine.description)
        )
    return made


def _budget_points(spec: _BudgetInstrument, attributes_of: AttributesOf) -> list[Observation]:
    totals: dict[tuple[tuple[str, str], ...], int] = {}
    for limit in registered_limits():
        statistics, _ = upstream_statistics(limit)
        if statistics is None:
            continue
        base = attributes_of(limit)
        for budget in statistics.budgets():
            value = spec.read(budget)
            if value is not None:
                key = tuple({**base, names.BUDGET_ATTRIBUTE: budget.budget}.items())
                totals[key] = totals.get(key, 0) + value
    return [Observation(value, dict(key)) for key, value in totals.items()]


def _engine_points(spec: _EngineInstrument, attributes_of: AttributesOf) -> list[Observation]:
    freshest: dict[tuple[tuple[str, str], ...], tuple[float, float]] = {}
    for limit in registered_limits():
        _, engine = upstream_statistics(limit)
        value = None if engine is None else spec.read(engine)
        if engine is None or value is None:
            continue
        age = engine.signal_age_seconds
        key = tuple(attributes_of(limit).items())
        seen = freshest.get(key)
        if seen is None or (age is not None and age < seen[0]):
            freshest[key] = (float("inf") if age is None else age, value)
    return [Observation(value, dict(key)) for key, (_, value) in freshest.items()]
