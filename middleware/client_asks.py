"""What the calls of a configured client ask of its limit: `ClientLimit.weight` and
`ClientLimit.flow` as the `weight=` / `flow=` of a transport or middleware made from it, unless
the code that makes it gives its own.

Flows: `route` (ROUTE_FLOW: the flow of the request being handled when the call is made),
`none` (the default flow), `process` (this process's own flow, `process_flow()`, read at each
call) or `header:<name>` (that header of the outgoing request, cut to MAX_FLOW_CHARACTERS).
Weights: an int, or `openai_tokens` (the outgoing body, in tokens); a token estimate
(`ClientLimit.tokens`, on a limit with a budget) the same (None: the weight).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final

from gym_concurrency.clients import openai_tokens
from gym_concurrency.clients.weights import RequestFlow, RequestWeight
from gym_concurrency.flow import ROUTE_FLOW, process_flow

from .asks import MAX_FLOW_CHARACTERS
from .settings import ClientLimit

__all__ = ["CONFIGURED", "HeaderFlow", "configured_ask"]


class _Configured:
    """The type of CONFIGURED: one instance, named in reprs."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CONFIGURED"


CONFIGURED: Final = _Configured()
"""`flow=CONFIGURED` (the default of `transport()` / `middleware()`): what the settings say."""


def configured_ask(
    config: ClientLimit,
    weight: RequestWeight | None,
    flow: RequestFlow,
    tokens: RequestWeight | None = None,
) -> tuple[RequestWeight, RequestFlow, RequestWeight | None]:
    """The (weight, flow, token estimate) a client made with `weight` (None: the settings'),
    `flow` (CONFIGURED: the settings') and `tokens` (None: the settings') asks for."""
    if weight is None:
        weight = _pricer(config.weight)
    if tokens is None and config.tokens is not None:
        tokens = _pricer(config.tokens)
    if flow is CONFIGURED:
        source = config.flow
        if source == "route":
            flow = ROUTE_FLOW
        elif source == "none":
            flow = None
        elif source == "process":
            flow = _this_process
        else:
            flow = HeaderFlow(source.removeprefix("header:"))
    return weight, flow, tokens


def _this_process(request: Any) -> Hashable:
    """`flow: process`: the calling process's flow, whatever the request (a transport made
    before a fork queues each child's calls in the child's own)."""
    return process_flow()


def _pricer(setting: int | str) -> RequestWeight:
    return openai_tokens if setting == "openai_tokens" else int(setting)


class HeaderFlow:
    """`flow: header:<name>`: that header of the outgoing request (httpx or aiohttp), cut to
    MAX_FLOW_CHARACTERS with NUL replaced (as a global limit needs); None without it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, request: Any) -> Hashable:
        value = request.headers.get(self.name)
        if not isinstance(value, str) or not value:
            return None
        return value[:MAX_FLOW_CHARACTERS].replace("\0", "\ufffd")

    def __repr__(self) -> str:
        return f"header:{self.name}"
