"""How the limits of one ConcurrencySettings relate by name: routes sharing a limit_name agree
on the limit, no request falls under two route limits, and operation and client limits have
names of their own."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import ClientLimit, OperationLimit, RouteLimit

__all__ = [
    "check_client_names",
    "check_no_overlapping_routes",
    "check_operation_names",
    "check_shared_route_limits",
]

# What routes sharing a limit_name share (one limit): a global limit and a process one cannot be
# the same limit, nor two fallbacks of different sizes.
_SHARED_ROUTE_FIELDS = (
    "max_concurrent",
    "queue_timeout_seconds",
    "max_queue",
    "adaptive",
    "scope",
    "local_max_concurrent",
    "backfill_seconds",
)


def check_shared_route_limits(routes: list[RouteLimit]) -> None:
    first: dict[str, tuple[int, RouteLimit]] = {}
    for index, route in enumerate(routes):
        if route.limit_name not in first:
            first[route.limit_name] = (index, route)
            continue
        first_index, other = first[route.limit_name]
        for field in _SHARED_ROUTE_FIELDS:
            mine, theirs = getattr(route, field), getattr(other, field)
            if mine != theirs:
                raise ValueError(
                    f"routes.{index}.{field}: limit_name {route.limit_name!r} is shared with "
                    f"routes.{first_index} ({other.path}), which sets {field}={theirs!r}, but "
                    f"this route ({route.path}) sets {mine!r}; routes sharing a limit_name "
                    "share one limit and must agree on it"
                )


def check_no_overlapping_routes(routes: list[RouteLimit]) -> None:
    for index, route in enumerate(routes):
        for earlier_index in range(index):
            earlier = routes[earlier_index]
            if earlier.path != route.path:
                continue
            common = _common_methods(earlier.methods, route.methods)
            if common:
                raise ValueError(
                    f"routes.{index}: {route.path} {common} is already limited by "
                    f"routes.{earlier_index}; a request can be under one route limit only"
                )


def _common_methods(a: Iterable[str] | None, b: Iterable[str] | None) -> str:
    if a is None or b is None:
        return "(every method)" if a is None and b is None else str(sorted(set(a or b or ())))
    return str(sorted(set(a) & set(b))) if set(a) & set(b) else ""


def check_operation_names(operations: list[OperationLimit], routes: list[RouteLimit]) -> None:
    _check_distinct(
        "operations",
        [operation.limit_name for operation in operations],
        {route.limit_name for route in routes},
        "is also a route limit_name; operation and route limits are separate limits and need "
        "distinct names",
    )


def check_client_names(
    clients: list[ClientLimit], operations: list[OperationLimit], routes: list[RouteLimit]
) -> None:
    _check_distinct(
        "clients",
        [client.limit_name for client in clients],
        {route.limit_name for route in routes} | {op.limit_name for op in operations},
        "is also a route or operation limit_name; a client limit is a limit of its own and "
        "needs a distinct name",
    )


def _check_distinct(section: str, names: list[str], taken: set[str], also: str) -> None:
    """ValueError naming the entry of `section` whose name repeats, or is in `taken`."""
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise ValueError(f"{section}.{index}.limit_name: {name!r} is configured twice")
        if name in taken:
            raise ValueError(f"{section}.{index}.limit_name: {name!r} {also}")
        seen.add(name)
