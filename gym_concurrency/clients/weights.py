"""What one outbound call asks of its limit: a `weight` (an int >= 1; default 1) and a `flow`
(any hashable; None is the default flow), each a constant or a function of the outgoing request
(an `httpx.Request`, or the `aiohttp.ClientRequest` the middleware sees), called once per call,
before its first attempt. The default flow, `ROUTE_FLOW`, is the flow of the request being
handled when the call is made (gym_concurrency.flow), the default flow outside one.

`weight=openai_tokens` (from gym_concurrency.clients, or gym_concurrency.tokens: either is
taken as the request pricer) prices an OpenAI-style JSON body in tokens. A callable flow is
always a function: to use a callable object itself as the flow, wrap it in a lambda.

On a limit with an upstream budget, `tokens` (the same forms as `weight`; None: the weight
itself) is the call's estimate, reserved with its slot and never capped here (the budget caps
it at a minute's).

Each attempt takes its weight, capped at the limit's size then (a call heavier than the whole
limit could never be admitted): a capped attempt is counted, and the first is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

from .. import json_numbers, tokens
from ..flow import ROUTE_FLOW, request_flow
from ..limits import Limit
from ..safe_urls import safe_url
from . import bodies

__all__ = ["CallAsk", "RequestFlow", "RequestWeight"]

RequestWeight = int | Callable[[Any], int]
"""`weight=`: an int >= 1, or a function of the outgoing request returning one."""
RequestFlow = Hashable | Callable[[Any], Hashable]
"""`flow=`: a hashable (None: the default flow; ROUTE_FLOW: the request's), or a function of
the outgoing request."""

_log = logging.getLogger("gym_concurrency.clients")


class CallAsk:
    """The weight and flow of a client's calls, checked when the client is made; `of(request)`
    reads one call's, `capped_weight(weight)` caps an attempt's at the limit's size now."""

    __slots__ = ("_flow", "_flow_of", "_limit", "_tokens", "_weight", "_weight_of", "capped")

    def __init__(
        self,
        limit: Limit,
        weight: RequestWeight = 1,
        flow: RequestFlow = ROUTE_FLOW,
        tokens: RequestWeight | None = None,
    ) -> None:
        self._limit = limit
        weight = _pricer(weight)
        self._tokens = None if tokens is None else _pricer(tokens)
        if self._tokens is not None and not callable(self._tokens):
            _checked_weight(self._tokens)
        self._weight_of: Callable[[Any], int] | None = None
        self._weight = 1
        if callable(weight):
            self._weight_of = weight
        else:
            self._weight = _checked_weight(weight)
        self._flow_of: Callable[[Any], Hashable] | None = None
        self._flow: Hashable = None
        if callable(flow):
            self._flow_of = flow
        else:
            self._flow = _checked_flow(flow)
        self.capped = 0  # attempts whose weight was more than the limit, capped at it

    def of(self, request: Any) -> tuple[int, Hashable]:
        """(weight, flow) of the call sending `request` (ROUTE_FLOW: the flow of the request
        being handled now); TypeError / ValueError naming the function if one returns
        something that is not a weight (an int >= 1) or a flow (a hashable). What a function
        raises reaches the caller as it raised it."""
        weight, flow = self._weight, self._flow
        if self._weight_of is not None:
            weight = _checked_weight(self._weight_of(request), self._weight_of, request)
        if self._flow_of is not None:
            flow = _checked_flow(self._flow_of(request), self._flow_of, request)
        elif flow is ROUTE_FLOW:
            flow = request_flow()
        return weight, flow

    def tokens_of(self, request: Any, weight: int) -> int:
        """The token estimate of the call sending `request`, whose weight is `weight` (its
        own, before any cap): the `tokens` rule's, else the weight."""
        rule = self._tokens
        if rule is None:
            return weight
        if callable(rule):
            return _checked_weight(rule(request), rule, request)
        return rule

    def capped_weight(self, weight: int) -> int:
        """`weight`, or the limit's size now if it is less (at least 1): counted, and the
        first capped attempt of this client is logged."""
        if weight == 1:
            return 1  # fits any limit (a limit of 0 makes it wait, as ever)
        ceiling = max(1, self._limit.limit)
        if weight <= ceiling:
            return weight
        if not self.capped:
            _log.warning(
                "gym_concurrency: limit %r: an outbound call asked for weight %s, more than the "
                "limit %d; capped at the limit (counted, and logged only this once)",
                self._limit.limit_name or self._limit,
                json_numbers.shown(weight),
                ceiling,
            )
        self.capped += 1
        return ceiling

    def __repr__(self) -> str:
        weight = self._weight_of or self._weight
        flow = self._flow_of or self._flow
        return f"<CallAsk weight={weight!r} flow={flow!r}>"


def _pricer(weight: RequestWeight) -> RequestWeight:
    """`weight`, or for gym_concurrency.tokens.openai_tokens (which prices a parsed body) the
    pricer of a request's body."""
    return bodies.openai_tokens if weight is tokens.openai_tokens else weight


def _checked_weight(
    value: object, function: Callable[[Any], int] | None = None, request: Any = None
) -> int:
    error: type[Exception]
    if isinstance(value, bool) or not isinstance(value, int):
        error = TypeError
    elif value < 1:
        error = ValueError
    else:
        return value
    if function is None:
        raise error(
            f"weight= must be an int >= 1 or a function of the request, got {_shown(value)}"
        )
    raise error(f"{_returned('weight', function, request, value)}: a weight is an int >= 1")


def _checked_flow(
    value: object, function: Callable[[Any], Hashable] | None = None, request: Any = None
) -> Hashable:
    try:
        hash(value)
    except TypeError:
        if function is None:
            message = f"flow= must be hashable or a function of the request, got {value!r}"
        else:
            message = f"{_returned('flow', function, request, value)}: a flow is hashable"
        raise TypeError(message) from None
    return value


def _returned(what: str, function: Callable[[Any], object], request: Any, value: object) -> str:
    name = getattr(function, "__qualname__", None) or repr(function)
    method, url = getattr(request, "method", "?"), getattr(request, "url", "?")
    return f"the {what} function {name} returned {_shown(value)} for {method} {safe_url(str(url))}"


def _shown(value: object) -> str:
    """`value` in a message; an int of any length (Python will not write out 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return json_numbers.shown(value)
    return repr(value)
