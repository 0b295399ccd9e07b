"""The route table: which configured limit, if any, a request falls under.

Compiled once from the app's routes (routers added with `include_router`, mounted sub-apps,
websocket routes) into one ordered list that matches the way Starlette's router does: the
first route that matches path and method fully wins. A request whose first full match is a
method mismatch (a 405) or another route is never limited by this route's limit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from starlette.endpoints import HTTPEndpoint
from starlette.routing import BaseRoute, Host, Match, Mount, Route, WebSocketRoute, compile_path
from starlette.types import Scope

from .settings import RouteLimit

_iter_route_contexts: Callable[[Sequence[Any]], Iterator[Any]] | None
try:  # FastAPI 0.165 keeps included routers unflattened; this yields their effective routes.
    from fastapi.routing import iter_route_contexts as _iter_route_contexts
except ImportError:  # pragma: no cover - an older FastAPI that flattens, or plain Starlette
    _iter_route_contexts = None

__all__ = ["RouteTable", "UnknownRouteError", "describe_routes", "iter_routes", "routed_path"]

T = TypeVar("T")
_HTTP = frozenset({"http"})
_WEBSOCKET = frozenset({"websocket"})
_ANY_TYPE = frozenset({"http", "websocket"})
_NAMED_GROUP = re.compile(r"\(\?P<[^>]+>")
# Resolved (type, method, path, root_path) keys kept, only for a path that is one of the app's
# static routes and a method some route declares or HTTP defines: what a client sends beyond
# that (404s, templated paths, odd methods) is resolved each time and leaves nothing behind.
# Cleared when full, a bound the keys above cannot reach in practice.
_CACHE_SIZE = 4096
_HTTP_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
_HTTP_ENDPOINT_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class UnknownRouteError(ValueError):
    """A configured route limit names a path (or method) the app does not have."""


@dataclass(slots=True)
class _Entry(Generic[T]):
    """One route of the app in router order, with the limits configured on it."""

    template: str
    regex: re.Pattern[str]
    scope_types: frozenset[str]
    methods: frozenset[str] | None  # None: every method reaches the endpoint
    opaque: BaseRoute | None = None  # a route matched only by asking it (Host)
    static: bool = False  # a template without parameters: matches one path only
    # Methods a class endpoint (HTTPEndpoint) answers itself, for checking a RouteLimit's.
    endpoint_methods: frozenset[str] | None = None
    by_method: dict[str, T] = field(default_factory=dict)
    any_method: T | None = None

    @property
    def limited(self) -> bool:
        return bool(self.by_method) or self.any_method is not None

    def limit_for(self, scope_type: str, scope: Scope) -> T | None:
        if scope_type == "http" and self.by_method:
            found = self.by_method.get(scope["method"])
            if found is not None:
                return found
        return self.any_method


class RouteTable(Generic[T]):
    """Maps a request scope to the limit of the route the router will pick, or None."""

    def __init__(self, entries: list[_Entry[T]]) -> None:
        # Paths and methods worth caching: the app's static routes, its and HTTP's methods.
        self._static_paths = frozenset(e.template for e in entries if e.static)
        self._methods = _HTTP_METHODS.union(*(e.methods or () for e in entries))
        last_limited = max((i for i, e in enumerate(entries) if e.limited), default=-1)
        # Routes after the last limited one cannot change the answer.
        self._entries = entries[: last_limited + 1]
        self._cacheable = not any(e.opaque is not None for e in self._entries)
        limited = [e.regex.pattern for e in self._entries if e.limited]
        self._candidates = (
            re.compile("|".join(f"(?:{_NAMED_GROUP.sub('(?:', p)})" for p in limited))
            if limited
            else None
        )
        # One match finds the first route whose path matches (alternatives are tried in router
        # order): the walk starts there instead of trying every route's pattern in turn.
        self._first = (
            re.compile(
                "|".join(
                    f"(?P<_{i}>{_NAMED_GROUP.sub('(?:', e.regex.pattern)})"
                    for i, e in enumerate(self._entries)
                )
            )
            if limited and self._cacheable
            else None
        )
        self._cache: dict[tuple[str, str | None, str, str | None], T | None] = {}

    @classmethod
    def compile(cls, app: Any, limits: Sequence[tuple[RouteLimit, T]]) -> RouteTable[T]:
        """Compile `app`'s routes with each configured route limit attached to its value.

        Raises UnknownRouteError for a configured path or method the app does not have.
        """
        entries: list[_Entry[T]] = list(_flatten(getattr(app, "routes", None) or [], ""))
        for index, (route_limit, value) in enumerate(limits):
            _attach(entries, index, route_limit, value)
        return cls(entries)

    def resolve(self, scope: Scope) -> T | None:
        """The limit of the route `scope` (http or websocket) is routed to, or None."""
        if self._candidates is None:
            return None
        if not self._cacheable:
            return self._resolve(scope)
        method = scope.get("method")
        key = (scope["type"], method, scope["path"], scope.get("root_path"))
        cache = self._cache
        if key in cache:
            return cache[key]
        route_path = routed_path(scope)
        found = self._resolve(scope, route_path)
        if route_path in self._static_paths and (method is None or method in self._methods):
            if len(cache) >= _CACHE_SIZE:
                cache.clear()
            cache[key] = found
        return found

    def _resolve(self, scope: Scope, route_path: str | None = None) -> T | None:
        if route_path is None:
            route_path = routed_path(scope)
        assert self._candidates is not None
        if not self._candidates.match(route_path):
            return None  # no limited route can match: skip the walk
        start = 0
        if self._first is not None:
            first = self._first.match(route_path)
            if first is None or first.lastgroup is None:  # pragma: no cover - a limited one did
                return None
            start = int(first.lastgroup[1:])
        return self._walk(scope["type"], scope, route_path, start)

    def _walk(self, scope_type: str, scope: Scope, route_path: str, start: int = 0) -> T | None:
        entries = self._entries
        for index in range(start, len(entries)):
            entry = entries[index]
            if entry.opaque is not None:
                if entry.opaque.matches(scope)[0] is Match.FULL:
                    return entry.limit_for(scope_type, scope)
            elif (
                scope_type in entry.scope_types
                and entry.regex.match(route_path)
                # A method mismatch is a partial match: the router looks on (then answers 405).
                and (scope_type != "http" or not entry.methods or scope["method"] in entry.methods)
            ):
                return entry.limit_for(scope_type, scope)
        return None


def describe_routes(app: Any) -> list[str]:
    """The app's routes as 'METHODS /template' lines, in router order, for error messages."""
    lines = []
    for entry in _flatten(getattr(app, "routes", None) or [], ""):
        if entry.opaque is not None:
            lines.append(f"HOST {entry.template}")
        elif entry.scope_types == _WEBSOCKET:
            lines.append(f"WEBSOCKET {entry.template}")
        elif entry.scope_types == _ANY_TYPE:
            lines.append(f"MOUNT {entry.template}")
        else:
            lines.append(f"{','.join(sorted(entry.methods or ['*']))} {entry.template}")
    return lines


def iter_routes(routes: Sequence[Any], prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(full path template, route, original route) for every route in router order, into
    included routers and mounted sub-apps; a mount comes after its own routes."""
    contexts = routes if _iter_route_contexts is None else _iter_route_contexts(routes)
    for route in contexts:
        original = getattr(route, "original_route", route)
        path = prefix + str(getattr(route, "path", None) or "")
        if isinstance(original, Mount):
            yield from iter_routes(getattr(route, "routes", None) or [], path)
        yield path, route, original


def _flatten(routes: Sequence[Any], prefix: str) -> Iterator[_Entry[Any]]:
    for path, route, original in iter_routes(routes, prefix):
        if isinstance(original, Mount):
            # Anything under the mount that none of its routes matched stays in the mount.
            yield _entry(path + "/{path:path}", _ANY_TYPE, None, path)
        elif isinstance(original, Host):
            yield _Entry(str(original.host), re.compile(""), _ANY_TYPE, None, opaque=route)
        elif isinstance(original, WebSocketRoute):
            yield _entry(path, _WEBSOCKET, None)
        elif isinstance(original, Route):
            methods = getattr(route, "methods", None)
            entry = _entry(path, _HTTP, frozenset(methods) if methods else None)
            if not methods:
                entry.endpoint_methods = _class_endpoint_methods(original.endpoint)
            yield entry


def _entry(
    template: str, scope_types: frozenset[str], methods: frozenset[str] | None, shown: str = ""
) -> _Entry[Any]:
    regex, _, convertors = compile_path(template)
    return _Entry(shown or template, regex, scope_types, methods, static=not convertors)


def _class_endpoint_methods(endpoint: Any) -> frozenset[str] | None:
    """The methods an HTTPEndpoint class answers (HEAD with its GET), or None: any ASGI app."""
    if not (isinstance(endpoint, type) and issubclass(endpoint, HTTPEndpoint)):
        return None
    methods = {m for m in _HTTP_ENDPOINT_METHODS if callable(getattr(endpoint, m.lower(), None))}
    if "GET" in methods:
        methods.add("HEAD")
    return frozenset(methods)


def _attach(entries: list[_Entry[T]], index: int, route_limit: RouteLimit, limit: T) -> None:
    targets = [e for e in entries if e.template == route_limit.path and e.opaque is None]
    targets = [e for e in targets if e.scope_types != _ANY_TYPE]  # mounts are not routes
    if not targets:
        raise UnknownRouteError(
            f"routes.{index}.path {route_limit.path!r} matches no route of the app"
        )
    if route_limit.methods is None:
        for entry in targets:
            entry.any_method = limit
        return
    http = [e for e in targets if e.scope_types == _HTTP]
    any_method = [e for e in http if e.methods is None and e.endpoint_methods is None]
    declared = set().union(*(e.methods or e.endpoint_methods or () for e in http))
    unknown = [m for m in route_limit.methods if not any_method and m not in declared]
    if (not http or unknown) and not any_method:
        raise UnknownRouteError(
            f"routes.{index}.methods {list(route_limit.methods)}: {route_limit.path} accepts "
            f"{sorted(declared) or 'no HTTP methods (a websocket route takes methods: null)'}"
        )
    for entry in targets:
        for method in route_limit.methods:
            if entry.methods is None or method in entry.methods:
                entry.by_method[method] = limit
        served = entry.methods or entry.endpoint_methods
        if "GET" in route_limit.methods and served and "HEAD" in served:
            # Starlette serves HEAD with the GET endpoint: the same work, under the same limit
            # (unless a RouteLimit names HEAD itself).
            entry.by_method.setdefault("HEAD", limit)


def routed_path(scope: Scope) -> str:
    """The path the router matches: `path` without the `root_path` prefix (as Starlette)."""
    path: str = scope["path"]
    root_path = scope.get("root_path", "")
    if not root_path or not path.startswith(root_path):
        return path
    if path == root_path:
        return ""
    return path[len(root_path) :] if path[len(root_path)] == "/" else path
