"""Limits on the calls a server makes: one slot of a limit per attempt, retries that obey the
server called, a retry budget and a deadline, for httpx (and so the openai client) and aiohttp.
Each call may weigh more than one slot and belong to a flow (`weight=`, `flow=`;
`weight=openai_tokens` prices an OpenAI-style body); by default a call made while a request is
handled is in that request's flow (`ROUTE_FLOW`).

`RetryPolicy` needs nothing but this package. `LimitedTransport` (httpx) and
`limited_middleware` (aiohttp) import their library when first named here, so
`import gym_concurrency.clients` imports neither (extras `[httpx]`, `[aiohttp]`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..flow import ROUTE_FLOW
from .bodies import MAX_JSON_BODY_BYTES, json_body, openai_tokens
from .budget import RetryBudget
from .calls import DeadlineExceeded
from .retry import IDEMPOTENT_METHODS, RetryPolicy
from .weights import RequestFlow, RequestWeight

if TYPE_CHECKING:
    from .aiohttp import LimitedMiddleware, limited_middleware
    from .httpx import DeadlineTimeout, LimitedTransport

__all__ = [
    "IDEMPOTENT_METHODS",
    "MAX_JSON_BODY_BYTES",
    "ROUTE_FLOW",
    "DeadlineExceeded",
    "DeadlineTimeout",
    "LimitedMiddleware",
    "LimitedTransport",
    "RequestFlow",
    "RequestWeight",
    "RetryBudget",
    "RetryPolicy",
    "json_body",
    "limited_middleware",
    "openai_tokens",
]

_LAZY = {
    "LimitedTransport": "httpx",
    "DeadlineTimeout": "httpx",
    "limited_middleware": "aiohttp",
    "LimitedMiddleware": "aiohttp",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)
