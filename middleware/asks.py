"""What a request asks of its route's limit: its weight, its flow and its deadline, read from
the request as `RouteLimit.weight`, `RouteLimit.flow` and `RouteLimit.deadline` say; on a limit
with an upstream budget also its token estimate, by `RouteLimit.tokens` (None: the weight's
rule), read as a weight is but never capped at the limit (the budget caps it at a minute).

Flows: `header:<name>`, `query:<name>`, `path:<param>`, `json:<dotted.path>` or `client` (the
client's address); a missing value is the default flow (None). Weights: an int, `json:<dotted.
path>` (a number in the body) or `openai_tokens` (gym_concurrency.tokens); a missing or bad
value is weight 1 (for `openai_tokens`, the default output alone). A weight over the limit,
however large (1e400, 10^5000), is capped at it and counted: no request can ask for more than
the limit could ever give, and none fails for what it asked.
Flow values are client-controlled: cut to `MAX_FLOW_CHARACTERS`, so memory stays bounded. A
flow from a credential header or a `hash:` source is never kept raw: its keyed hash (or its
label) is the flow (middleware/credential_flows.py), read whole, before any cut.
A deadline is `header:<name>`: milliseconds remaining, ASCII digits with an optional fraction
(as Envoy's x-envoy-expected-rq-timeout-ms); anything else is no deadline.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Hashable
from urllib.parse import parse_qsl

from starlette.routing import compile_path
from starlette.types import Scope

from gym_concurrency import json_numbers
from gym_concurrency.limits import Limit
from gym_concurrency.tokens import openai_tokens

from .credential_flows import CredentialFlows
from .routing import routed_path
from .settings import RouteLimit

__all__ = ["MAX_FLOW_CHARACTERS", "RouteAsk", "route_ask", "unread_length"]

_log = logging.getLogger("gym_concurrency.middleware")

MAX_FLOW_CHARACTERS = 128
_MISSING = object()
_MILLISECONDS = re.compile(rb"^[0-9]{1,12}(\.[0-9]{1,6})?$")

Body = object  # the parsed JSON body, or _MISSING when it was not read or is not JSON
FlowOf = Callable[[Scope, Body], Hashable]
WeightOf = Callable[[Scope, Body], int]


class RouteAsk:
    """Reads one route's (weight, flow) from a request; `reads_body` says whether it needs
    the request's body (read, bounded, before admission)."""

    __slots__ = (
        "_deadline_header",
        "_floor",
        "_flow_of",
        "_limit",
        "_name",
        "_tokens_of",
        "_tokens_unread",
        "_unread_output",
        "_weight_of",
        "capped",
        "reads_body",
    )

    def __init__(self, config: RouteLimit, limit: Limit, credentials: CredentialFlows) -> None:
        self._name = config.limit_name
        self._limit = limit
        self._flow_of = _flow_reader(config, credentials)
        self._weight_of = _weight_reader(config, config.weight)
        # A body too long to read ahead is priced by its length (openai_tokens only).
        self._unread_output = _unread_output(config, config.weight)
        tokens = config.weight if config.tokens is None else config.tokens
        self._tokens_of = _weight_reader(config, tokens) if config.has_upstream else None
        self._tokens_unread = _unread_output(config, tokens)
        # An adaptive limit may shrink under a waiter: cap at its floor, which it never goes
        # below, so a capped request always fits once the limit is idle.
        self._floor = None if config.adaptive is None else config.adaptive.min_concurrent
        flow = None if config.flow is None else config.flow.removeprefix("hash:")
        self.reads_body = _reads_body(flow) or _reads_body(config.weight)
        self.reads_body = self.reads_body or (config.has_upstream and _reads_body(tokens))
        self.capped = 0  # requests whose weight was more than the limit
        deadline = config.deadline
        self._deadline_header = None if deadline is None else deadline[7:].lower().encode()

    def deadline(self, scope: Scope) -> float | None:
        """Seconds the request has left, by its deadline header; None without one."""
        if self._deadline_header is None:
            return None
        value = _header(scope, self._deadline_header)
        if value is None or not _MILLISECONDS.match(value):
            return None
        return float(value) / 1000.0

    def __call__(self, scope: Scope, body: bytes | None, unread: int = 0) -> tuple[int, Hashable]:
        """(weight, flow) of the request with `scope` and (if `reads_body`) `body`; `unread`:
        the length of a body the bounds kept from being read in full (else 0)."""
        weight, flow, _ = self.read(scope, body, unread)
        return weight, flow

    def read(
        self, scope: Scope, body: bytes | None, unread: int = 0
    ) -> tuple[int, Hashable, int | None]:
        """(weight, flow, token estimate) of the request, as `__call__`; the estimate is None
        on a limit without an upstream."""
        parsed = _parse(body) if self.reads_body else _MISSING
        tokens = None
        if self._tokens_of is not None:
            tokens = _priced(self._tokens_of, self._tokens_unread, scope, parsed, unread)
        weight = _priced(self._weight_of, self._unread_output, scope, parsed, unread)
        ceiling = max(1, self._limit.limit if self._floor is None else self._floor)
        if weight > ceiling:
            if not self.capped:
                _log.warning(
                    "gym_concurrency: limit %r: a request asked for weight %s, more than the "
                    "limit %d; capped at the limit (counted, and logged only this once)",
                    self._name,
                    json_numbers.shown(weight),
                    ceiling,
                )
            self.capped += 1
            weight = ceiling
        return weight, self._flow_of(scope, parsed), tokens


def route_ask(config: RouteLimit, limit: Limit, credentials: CredentialFlows) -> RouteAsk | None:
    """The route's ask, or None when every request asks for weight 1 in the default flow,
    with no deadline, of a limit without an upstream."""
    plain = config.flow is None and config.weight == 1 and config.deadline is None
    if plain and not config.has_upstream:
        return None
    return RouteAsk(config, limit, credentials)


def _reads_body(source: object) -> bool:
    return source == "openai_tokens" or (isinstance(source, str) and source.startswith("json:"))


def _parse(body: bytes | None) -> Body:
    if body is None:
        return _MISSING
    try:
        return json_numbers.loads(body)  # an integer too long for Python: its leading digits
    except (ValueError, RecursionError):  # not JSON (or not UTF-8, or nested too deep)
        return _MISSING


def _flow_reader(config: RouteLimit, credentials: CredentialFlows) -> FlowOf:
    source = config.flow
    if source is None:
        return lambda scope, body: None
    read = _value_reader(config, source.removeprefix("hash:"))
    if credentials.hashes(source):
        hasher = credentials.hasher()
        return lambda scope, body: _hashed(read(scope, body), hasher)
    return lambda scope, body: _flow(read(scope, body))


def _value_reader(config: RouteLimit, source: str) -> Callable[[Scope, Body], object]:
    """What `source` reads off a request, as it is (None when it is missing)."""
    if source == "client":
        return lambda scope, body: (scope.get("client") or (None,))[0]
    kind, _, name = source.partition(":")
    if kind == "header":
        key = name.lower().encode("latin-1")
        return lambda scope, body: _header(scope, key)
    if kind == "query":
        return lambda scope, body: _query(scope, name)
    if kind == "path":
        regex = compile_path(config.path)[0]
        return lambda scope, body: _path_param(scope, regex, name)
    keys = name.split(".")
    return lambda scope, body: _dotted(body, keys)


def _priced(
    read: WeightOf, unread_output: int | None, scope: Scope, body: Body, unread: int
) -> int:
    """What `read` prices the request at; a body too long to read ahead, by its length."""
    if unread and unread_output is not None:
        return math.ceil(unread / 4) + unread_output
    return read(scope, body)


def _unread_output(config: RouteLimit, source: int | str) -> int | None:
    """The output an unread body is priced with (openai_tokens only), else None."""
    return config.default_output_tokens if source == "openai_tokens" else None


def _weight_reader(config: RouteLimit, source: int | str) -> WeightOf:
    if isinstance(source, int):
        return lambda scope, body: source
    if source == "openai_tokens":
        output = config.default_output_tokens
        return lambda scope, body: openai_tokens(
            None if body is _MISSING else body, default_output_tokens=output
        )
    keys = source.removeprefix("json:").split(".")
    return lambda scope, body: _count(_dotted(body, keys))


def _flow(value: object) -> Hashable:
    """A flow from a value read off the request: text (cut to MAX_FLOW_CHARACTERS, NUL
    replaced, as a global limit needs), else the default flow."""
    text = _text(value)
    return None if text is None else text[:MAX_FLOW_CHARACTERS].replace("\0", "\ufffd")


def _hashed(value: object, hasher: Callable[[str | bytes], str]) -> Hashable:
    """The keyed hash (or label) of a value read off the request, whole; else the default
    flow. A header is hashed as its bytes, any other text as UTF-8."""
    if isinstance(value, bytes):
        return hasher(value) if value else None
    text = _text(value)
    return None if text is None else hasher(text)


def _text(value: object) -> str | None:
    """A value read off the request as text (a header's bytes as latin-1, a number written
    out); None if missing, empty or anything else."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        return None
    return value


def _count(value: object) -> int:
    """A weight from a number in the body (rounded up, however large: capped by the caller);
    1 if it is not a number >= 1."""
    return json_numbers.count(value) or 1


def unread_length(scope: Scope, read: int) -> int:
    """The length of a body the bounds kept from being read ahead: its Content-Length, else
    what was read of it."""
    declared = _header(scope, b"content-length")
    if declared is not None and declared.isdigit() and len(declared) <= 15:
        return max(read, int(declared))
    return read


def _header(scope: Scope, key: bytes) -> bytes | None:
    for name, value in scope.get("headers") or ():
        if name == key:
            return bytes(value)
    return None


def _query(scope: Scope, name: str) -> str | None:
    query: bytes = scope.get("query_string") or b""
    for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=False):
        if key == name:
            return value
    return None


def _path_param(scope: Scope, regex: re.Pattern[str], name: str) -> str | None:
    match = regex.match(routed_path(scope))
    return None if match is None else str(match.group(name))


def _dotted(body: Body, keys: list[str]) -> object:
    """The value at `keys` in the parsed body (list items by index), or None."""
    value: object = body
    for key in keys:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return None
    return value
