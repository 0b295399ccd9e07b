"""resources_operation: time bounded work by how long it queued, how long it ran, how it ended."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from contextlib import AbstractAsyncContextManager
from time import perf_counter
from types import TracebackType
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from . import names
from .meters import PerMeter, SafeRecorder

__all__ = ["ResourcesOperation", "operation_counts", "resources_operation"]

_Key = tuple[str, str]

# Every allowed attribute set, built once: recording then only looks a dict up.
_BASE_ATTRIBUTES: dict[_Key, dict[str, str]] = {
    (op, ex): {names.OPERATION_ATTRIBUTE: op, names.EXECUTOR_ATTRIBUTE: ex}
    for op in names.OPERATIONS
    for ex in names.EXECUTORS
}
_OUTCOME_ATTRIBUTES: dict[tuple[str, str, str], dict[str, str]] = {
    (op, ex, outcome): {**attributes, names.OUTCOME_ATTRIBUTE: outcome}
    for (op, ex), attributes in _BASE_ATTRIBUTES.items()
    for outcome in names.OUTCOMES
}


class ResourcesOperation:
    """One limited operation. Set `outcome` inside the block when the work ended other than by
    returning normally; it must be one of OUTCOMES."""

    __slots__ = ("_outcome",)

    def __init__(self) -> None:
        self._outcome: str | None = None

    @property
    def outcome(self) -> str | None:
        """How the operation ended: set by the block, else by the wrapper on exit."""
        return self._outcome

    @outcome.setter
    def outcome(self, value: str) -> None:
        self._outcome = names.check_member("outcome", value, names.OUTCOMES)

    def __repr__(self) -> str:
        return f"<ResourcesOperation outcome={self._outcome!r}>"


# (operation, executor) -> the same tuple, for every valid pair: one lookup validates both.
_KEYS: dict[_Key, _Key] = {key: key for key in _BASE_ATTRIBUTES}


class _OperationMetrics(SafeRecorder):
    """The instruments and live counts behind `resources_operation`, one set per meter."""

    def __init__(self, meter: Meter) -> None:
        super().__init__()
        self.queued: dict[_Key, int] = {}
        self.active: dict[_Key, int] = {}
        self.queue_duration = meter.create_histogram(
            names.QUEUE_DURATION_INSTRUMENT,
            unit=names.MILLISECONDS_UNIT,
            description="Time an operation waited for its concurrency limit.",
            explicit_bucket_boundaries_advisory=names.OPERATION_BOUNDARIES_MS,
        )
        self.duration = meter.create_histogram(
            names.DURATION_INSTRUMENT,
            unit=names.MILLISECONDS_UNIT,
            description="Time an operation ran inside its concurrency limit, by outcome.",
            explicit_bucket_boundaries_advisory=names.OPERATION_BOUNDARIES_MS,
        )
        meter.create_observable_up_down_counter(
            names.QUEUED_INSTRUMENT,
            [self._observe_queued],
            unit=names.OPERATION_UNIT,
            description="Operations waiting for their concurrency limit now.",
        )
        meter.create_observable_up_down_counter(
            names.ACTIVE_INSTRUMENT,
            [self._observe_active],
            unit=names.OPERATION_UNIT,
            description="Operations running inside their concurrency limit now.",
        )

    def _observe_queued(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, _BASE_ATTRIBUTES[key]) for key, n in list(self.queued.items())]

    def _observe_active(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, _BASE_ATTRIBUTES[key]) for key, n in list(self.active.items())]


_PER_METER: PerMeter[_OperationMetrics] = PerMeter(_OperationMetrics)
_METRICS = _PER_METER.made  # one _OperationMetrics per meter, as in NeMo Gym


def _metrics(meter_provider: MeterProvider | None = None) -> _OperationMetrics | None:
    """The metrics set for `meter_provider` (None = global), or None while nothing exports."""
    return _PER_METER.get(meter_provider)


def operation_counts() -> dict[_Key, tuple[int, int]]:
    """(queued, active) now per (operation, executor), summed over every meter; for status views.

    Counted only while metrics are exporting, like the instruments they feed.
    """
    counts: dict[_Key, tuple[int, int]] = {}
    for metrics in list(_METRICS.values()):
        for key in set(metrics.queued) | set(metrics.active):
            queued, active = counts.get(key, (0, 0))
            counts[key] = (queued + metrics.queued.get(key, 0), active + metrics.active.get(key, 0))
    return counts


def resources_operation(
    limit: AbstractAsyncContextManager[Any],
    operation: str,
    executor: str,
    *,
    meter_provider: MeterProvider | None = None,
) -> _Operation:
    """Enter `limit` (any async context manager, such as an asyncio.Semaphore) and report the
    operation. An exception sets the outcome to error, or cancelled for a cancellation, unless
    the block already set one."""
    try:
        key = _KEYS.get((operation, executor))
    except TypeError:  # an unhashable name: check_member below says what is wrong with it
        key = None
    if key is None:
        key = (
            names.check_member("operation", operation, names.OPERATIONS),
            names.check_member("executor", executor, names.EXECUTORS),
        )
    return _Operation(limit, key, meter_provider)


# Types already seen to be async context managers: checking each limit costs two hasattr.
_LIMIT_TYPES: set[type] = set()


def _check_limit(limit: object) -> None:
    kind = type(limit)  # `async with` looks the methods up on the type, so check it there
    if not (hasattr(kind, "__aenter__") and hasattr(kind, "__aexit__")):
        raise TypeError(f"limit must be an async context manager, got {limit!r}")
    _LIMIT_TYPES.add(kind)


class _Operation(ResourcesOperation):
    """The async context manager `resources_operation` returns, and the operation it yields;
    one use only."""

    __slots__ = ("_entered_at", "_key", "_limit", "_metrics", "_provider")

    def __init__(
        self, limit: AbstractAsyncContextManager[Any], key: _Key, provider: MeterProvider | None
    ) -> None:
        if type(limit) not in _LIMIT_TYPES:
            _check_limit(limit)
        self._limit = limit
        self._key = key
        self._provider = provider
        self._outcome = None
        # _metrics and _entered_at are set by __aenter__, before anything reads them.

    async def __aenter__(self) -> ResourcesOperation:
        metrics = self._metrics = _PER_METER.get(self._provider)
        if metrics is None:
            await self._limit.__aenter__()
            return self
        key = self._key
        metrics.queued[key] = metrics.queued.get(key, 0) + 1
        started = perf_counter()
        try:
            await self._limit.__aenter__()
        finally:
            entered = perf_counter()
            metrics.queued[key] -= 1
            queued_ms = (entered - started) * 1000.0
            metrics.record(metrics.queue_duration, queued_ms, _BASE_ATTRIBUTES[key])
        metrics.active[key] = metrics.active.get(key, 0) + 1
        self._entered_at = entered
        return self

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Awaitable[bool | None]:
        outcome = self._outcome
        if outcome is None:
            outcome = self._outcome = "ok" if exc_type is None else _outcome_of(exc_type)
        metrics = self._metrics
        if metrics is None:  # disabled: the limit's own exit is all there is to await
            return self._limit.__aexit__(exc_type, exc, tb)
        return self._exit_recording(metrics, outcome, exc_type, exc, tb)

    async def _exit_recording(
        self,
        metrics: _OperationMetrics,
        outcome: str,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        ran_ms = (perf_counter() - self._entered_at) * 1000.0
        try:
            return await self._limit.__aexit__(exc_type, exc, tb)
        finally:
            metrics.active[self._key] -= 1
            attributes = _OUTCOME_ATTRIBUTES[(*self._key, outcome)]
            metrics.record(metrics.duration, ran_ms, attributes)


def _outcome_of(exc_type: type[BaseException] | None) -> str:
    if exc_type is None:
        return "ok"
    return "cancelled" if issubclass(exc_type, asyncio.CancelledError) else "error"
