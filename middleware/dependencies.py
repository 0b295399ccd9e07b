"""operation_limit: FastAPI dependency handles that run verifier / judge / tool work inside a
configured OperationLimit through `resources_operation`, timing only the guarded block:
`async with handle:` takes one slot; `async with handle(weight=..., flow=...):` takes `weight`
of the limit (capped at its size) in `flow`, served fairly among flows. The default flow is the
request's (`RouteLimit.flow`; gym_concurrency.flow), as for outbound calls. On a limit with a
rate budget, a block also reserves `tokens` (`handle(tokens=...)`, else `OperationLimit.tokens`,
else its weight): `handle.settle(tokens=...)` inside the block charges what the work used (the
rest is refunded), else the block's exit charges the reservation in full."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from starlette.requests import HTTPConnection

from gym_concurrency import ResourcesOperation, resources_operation
from gym_concurrency.flow import ROUTE_FLOW, flow_or_route
from gym_concurrency.limits import Limit
from gym_concurrency.limits.limit import Held, Hold
from gym_concurrency.upstream_view import has_upstream
from gym_concurrency.usage import Usage

from .limits import LIMITS_SCOPE_KEY, ConcurrencyLimits, LimitedOperation
from .routing import UnknownRouteError, iter_routes

__all__ = ["OperationHandle", "WeighedHold", "check_operation_names", "operation_limit"]

# Marks the dependency functions operation_limit makes, so startup can check their names.
_OPERATION_NAME = "__gym_concurrency_operation_limit__"


class OperationHandle:
    """A route's handle on one OperationLimit: `async with handle as op:` waits for a slot of
    the limit in the request's flow (TimeoutError after its `timeout_seconds`) and reports the
    operation; `async with handle(weight=..., flow=...) as op:` the same for `weight` in `flow`."""

    __slots__ = ("_holds", "_limit", "_meter_provider", "_open")

    def __init__(self, limit: LimitedOperation, meter_provider: Any = None) -> None:
        self._limit = limit
        self._meter_provider = meter_provider
        # Open blocks per task, so concurrent blocks in one request each close their own.
        self._open: dict[asyncio.Task[Any] | None, list[Any]] = {}
        # The budgeted holds of this handle's open blocks per task, innermost last: settle()'s.
        self._holds: dict[asyncio.Task[Any] | None, list[WeighedHold]] = {}

    @property
    def limit(self) -> LimitedOperation:
        """The configured operation limit and its limit."""
        return self._limit

    def operation(
        self, *, weight: int = 1, flow: Hashable = ROUTE_FLOW, tokens: int | None = None
    ) -> Any:
        """A fresh `resources_operation` on this limit (an async context manager) that takes
        `weight` (an int >= 1, capped at the limit's size when entered) in `flow` (any
        hashable; None is the default flow; ROUTE_FLOW, the request's flow now), and `tokens`
        of its budget (None: `OperationLimit.tokens`, else the weight). TypeError /
        ValueError for a bad argument."""
        config = self._limit.config
        limit: Any = self._limit.limit
        flow = flow_or_route(flow)
        tokens = config.tokens if tokens is None else tokens
        plain = flow is None and weight == 1 and type(weight) is int  # True is no weight
        if not plain or tokens is not None or has_upstream(limit):
            limit = WeighedHold(limit, weight, flow, tokens, self._holds)
        return resources_operation(
            limit,
            config.operation,
            config.executor,
            meter_provider=self._meter_provider,
        )

    def settle(self, tokens: int | Usage) -> None:
        """Close the reservation of this handle's innermost block open in this task with what
        its work used (`tokens`, a total, or a Usage): the rest of the estimate is refunded.
        Nothing without a budget; RuntimeError outside a block; ValueError if settled twice."""
        holds = self._holds.get(asyncio.current_task())
        if not holds:
            raise RuntimeError(
                f"operation limit {self._limit.config.limit_name!r}: settle() is called inside "
                "an `async with handle` block, for the block's reservation"
            )
        holds[-1].settle(tokens)

    def __call__(
        self, *, weight: int = 1, flow: Hashable = ROUTE_FLOW, tokens: int | None = None
    ) -> Any:
        """`async with handle(weight=..., flow=..., tokens=...) as op:`: `operation(...)`."""
        return self.operation(weight=weight, flow=flow, tokens=tokens)

    async def __aenter__(self) -> ResourcesOperation:
        operation = self.operation()
        entered: ResourcesOperation = await operation.__aenter__()
        self._open.setdefault(asyncio.current_task(), []).append(operation)
        return entered

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = await self._pop_open().__aexit__(exc_type, exc, tb)
        return result

    def _pop_open(self) -> Any:
        """The block this exit closes: the current task's innermost, else (an async generator
        finalized in another task) the most recently opened one: each releases one slot of the
        same limit, so the count stays exact either way."""
        task = asyncio.current_task()
        if task not in self._open:
            if not self._open:
                raise RuntimeError("OperationHandle exited more often than it was entered")
            task = next(reversed(self._open))
        stack = self._open[task]
        operation = stack.pop()
        if not stack:
            del self._open[task]
        return operation


class WeighedHold:
    """`weight` of `limit` in `flow` for one block: the weight is capped at the limit's size
    when the block is entered (a heavier one could never be admitted) and the same weight and
    flow are released on exit; `tokens` (None: the limit's own estimate) are reserved of the
    limit's budget, closed by `settle()` in the block, else charged in full on exit. While
    open, the hold is the last of its task's list in `open_holds`."""

    __slots__ = ("_flow", "_held", "_hold", "_limit", "_open_holds", "_tokens", "_weight")

    def __init__(
        self,
        limit: Limit,
        weight: int,
        flow: Hashable,
        tokens: int | None = None,
        open_holds: dict[asyncio.Task[Any] | None, list[WeighedHold]] | None = None,
    ) -> None:
        named = f"operation limit {limit.limit_name!r}"
        if isinstance(weight, bool) or not isinstance(weight, int):
            raise TypeError(f"{named}: weight must be an int >= 1, got {weight!r}")
        if weight < 1:
            raise ValueError(f"{named}: weight must be an int >= 1, got {weight}")
        try:
            hash(flow)
        except TypeError:
            raise TypeError(f"{named}: flow must be hashable, got {flow!r}") from None
        self._limit = limit
        self._weight = weight
        self._flow = flow
        self._tokens = tokens
        self._open_holds = {} if open_holds is None else open_holds
        self._hold: Hold | None = None
        self._held: Held | None = None

    async def __aenter__(self) -> None:
        weight = min(self._weight, max(1, self._limit.limit))
        hold = self._limit.hold(weight, self._flow, tokens=self._tokens)
        self._held = await hold.__aenter__()
        self._hold = hold
        self._open_holds.setdefault(asyncio.current_task(), []).append(self)

    async def __aexit__(self, *exc: object) -> None:
        hold, self._hold, self._held = self._hold, None, None
        for task, holds in list(self._open_holds.items()):
            if self in holds:  # (an async generator may be finalized in another task)
                holds.remove(self)
                if not holds:
                    del self._open_holds[task]
                break
        if hold is not None:
            await hold.__aexit__(*exc)  # the reservation, unless settled, charged in full

    def settle(self, usage: int | Usage) -> None:
        """Close the reservation with what the block's work used (see OperationHandle.settle)."""
        if self._held is None:
            raise RuntimeError("settle() of a block that is not open")
        self._held.settle(usage)


def operation_limit(
    limit_name: str,
) -> Callable[[HTTPConnection], Coroutine[Any, Any, OperationHandle]]:
    """A FastAPI dependency giving the handle of the OperationLimit named `limit_name`:
    `Judge = Annotated[OperationHandle, Depends(operation_limit("judge"))]`."""

    # async: a plain def would wait for a worker thread first, a queue no metric shows.
    async def dependency(connection: HTTPConnection) -> OperationHandle:
        limits: ConcurrencyLimits | None = connection.scope.get(LIMITS_SCOPE_KEY)
        if limits is None:
            raise RuntimeError(
                f"operation_limit({limit_name!r}) needs ConcurrencyLimitMiddleware on the app"
            )
        return OperationHandle(limits.operation(limit_name), limits.meter_provider)

    dependency.__name__ = f"operation_limit_{limit_name}"
    setattr(dependency, _OPERATION_NAME, limit_name)
    return dependency


def check_operation_names(app: Any, operations: Mapping[str, LimitedOperation]) -> None:
    """Raise UnknownRouteError if a route of `app` uses operation_limit(name) for a name no
    OperationLimit has."""
    for path, name in _operation_names_used(getattr(app, "routes", None) or []):
        if name not in operations:
            raise UnknownRouteError(
                f"operation_limit({name!r}) is used by {path} but no OperationLimit has "
                f"limit_name {name!r} (configured: {sorted(operations) or 'none'})"
            )


def _operation_names_used(routes: Sequence[Any]) -> Iterator[tuple[str, str]]:
    for path, route, _ in iter_routes(routes):
        for name in _names_in(getattr(route, "dependant", None), set()):
            yield path, name


def _names_in(dependant: Any, seen: set[int]) -> Iterator[str]:
    if dependant is None or id(dependant) in seen:
        return
    seen.add(id(dependant))
    name = getattr(getattr(dependant, "call", None), _OPERATION_NAME, None)
    if name is not None:
        yield name
    for child in getattr(dependant, "dependencies", ()):
        yield from _names_in(child, seen)
