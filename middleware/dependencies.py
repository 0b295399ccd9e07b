"""operation_limit: FastAPI dependency handles that run verifier / judge / tool work inside a
configured OperationLimit through `resources_operation`, timing only the guarded block:
`async with handle:` takes one slot; `async with handle(weight=..., flow=...):` takes `weight`
of the limit (capped at its size) in `flow`, served fairly among flows. The default flow is the
request's (`RouteLimit.flow`; gym_concurrency.flow), as for outbound calls. On a limit with a
rate budget, a block also reserves `tokens` (`handle(tokens=...)`, else `OperationLimit.tokens`,
else its weight), charged in full: a block reports no usage to settle it by."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from starlette.requests import HTTPConnection

from gym_concurrency import ResourcesOperation, resources_operation
from gym_concurrency.flow import ROUTE_FLOW, flow_or_route
from gym_concurrency.limits import Limit

from .limits import LIMITS_SCOPE_KEY, ConcurrencyLimits, LimitedOperation
from .routing import UnknownRouteError, iter_routes

__all__ = ["OperationHandle", "WeighedHold", "check_operation_names", "operation_limit"]

# Marks the dependency functions operation_limit makes, so startup can check their names.
_OPERATION_NAME = "__gym_concurrency_operation_limit__"


class OperationHandle:
    """A route's handle on one OperationLimit: `async with handle as op:` waits for a slot of
    the limit in the request's flow (TimeoutError after its `timeout_seconds`) and reports the
    operation; `async with handle(weight=..., flow=...) as op:` the same for `weight` in `flow`."""

    __slots__ = ("_limit", "_meter_provider", "_open")

    def __init__(self, limit: LimitedOperation, meter_provider: Any = None) -> None:
        self._limit = limit
        self._meter_provider = meter_provider
        # Open blocks per task, so concurrent blocks in one request each close their own.
        self._open: dict[asyncio.Task[Any] | None, list[Any]] = {}

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
        if not plain or tokens is not None:
            limit = WeighedHold(limit, weight, flow, tokens)
        return resources_operation(
            limit,
            config.operation,
            config.executor,
            meter_provider=self._meter_provider,
        )

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
    flow are released on exit; `tokens` (None: none asked) are reserved of the limit's budget
    and charged in full."""

    __slots__ = ("_flow", "_held", "_limit", "_tokens", "_weight")

    def __init__(
        self, limit: Limit, weight: int, flow: Hashable, tokens: int | None = None
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
        self._held = 0

    async def __aenter__(self) -> None:
        weight = min(self._weight, max(1, self._limit.limit))
        if self._tokens is None:
            await self._limit.acquire(weight, self._flow)
        else:
            await self._limit.acquire(weight, self._flow, tokens=self._tokens)
        self._held = weight

    async def __aexit__(self, *exc: object) -> None:
        held, self._held = self._held, 0
        self._limit.release(held, self._flow)


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
