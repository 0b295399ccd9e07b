"""Configured client limits (`ConcurrencySettings.clients`): each is a limit, its retry policy
and, if adaptive, the controller moving it, for every httpx transport or aiohttp middleware
the app builds from it. A reload reaches them all: the limit is resized and the retry policy
replaced in every transport made so far (and the weight and flow its calls ask for, where its
code left them to the settings).

    judge = limited_client(app, "judge")
    client = httpx.AsyncClient(base_url=JUDGE_URL, transport=judge.transport())
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import MeterProvider

from gym_concurrency.clients import RetryPolicy
from gym_concurrency.clients.weights import CallAsk, RequestFlow, RequestWeight
from gym_concurrency.limits import Limit
from gym_concurrency.limits.adaptive import AdaptiveController, make_controller

from .client_asks import CONFIGURED, configured_ask
from .settings import ClientLimit

if TYPE_CHECKING:
    import httpx

    from gym_concurrency.clients import LimitedMiddleware, LimitedTransport
    from gym_concurrency.clients.calls import LimitedCalls

__all__ = ["LimitedClient"]


class LimitedClient:
    """One configured client limit: `transport()` (httpx, and so the openai client) and
    `middleware()` (aiohttp) send every attempt through `limit`, retried by `retry`."""

    __slots__ = ("_calls", "config", "controller", "limit", "meter_provider", "retry")

    def __init__(
        self, config: ClientLimit, limit: Limit, meter_provider: MeterProvider | None = None
    ) -> None:
        self.config = config
        self.limit = limit
        self.meter_provider = meter_provider
        self.retry: RetryPolicy | None = config.retry.policy() if config.retry else None
        self.controller: AdaptiveController | None = None
        adaptive = config.adaptive
        if adaptive is not None:  # one controller for every transport: they share the limit
            self.controller = make_controller(
                adaptive.algorithm,
                adaptive.min_concurrent,
                adaptive.max_concurrent,
                config.max_concurrent,
                tolerance=adaptive.latency_tolerance,
            )
        # Every transport's calls, with the weight, flow and tokens its code gave (None,
        # CONFIGURED: the settings', which a reload changes).
        self._calls: weakref.WeakKeyDictionary[LimitedCalls[Any, Any], tuple[Any, ...]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def limit_name(self) -> str:
        return self.config.limit_name

    def transport(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        weight: RequestWeight | None = None,
        flow: RequestFlow = CONFIGURED,
        tokens: RequestWeight | None = None,
    ) -> LimitedTransport:
        """A LimitedTransport (needs httpx) around `transport` (default: a new
        `httpx.AsyncHTTPTransport()`) for `httpx.AsyncClient(transport=...)`; each call asks
        for `weight` in `flow` (and `tokens` of a budget), by default the settings'
        (docs/clients.md)."""
        from gym_concurrency.clients.httpx import LimitedTransport

        asked = configured_ask(self.config, weight, flow, tokens)
        made = LimitedTransport(
            self.limit,
            retry=self.retry,
            adaptive=self.controller,
            transport=transport,
            meter_provider=self.meter_provider,
            weight=asked[0],
            flow=asked[1],
            deadline_header=self.config.deadline_header,
            tokens=asked[2],
        )
        self._calls[made.calls] = (weight, flow, tokens)
        return made

    def middleware(
        self,
        *,
        weight: RequestWeight | None = None,
        flow: RequestFlow = CONFIGURED,
        tokens: RequestWeight | None = None,
    ) -> LimitedMiddleware:
        """An aiohttp client middleware (needs aiohttp) for `ClientSession(middlewares=...)`;
        each call asks for `weight` in `flow` (and `tokens` of a budget), by default the
        settings'."""
        from gym_concurrency.clients.aiohttp import LimitedMiddleware

        asked = configured_ask(self.config, weight, flow, tokens)
        made = LimitedMiddleware(
            self.limit,
            retry=self.retry,
            adaptive=self.controller,
            meter_provider=self.meter_provider,
            weight=asked[0],
            flow=asked[1],
            deadline_header=self.config.deadline_header,
            tokens=asked[2],
        )
        self._calls[made.calls] = (weight, flow, tokens)
        return made

    def reconfigure(self, config: ClientLimit) -> None:
        """Take new settings of this limit (a reload): later calls of every transport and
        middleware made from it are retried by the new policy, send the new deadline header,
        and ask for the new weight and flow where its code left them to the settings."""
        asks_changed = (config.weight, config.flow, config.tokens) != (
            self.config.weight,
            self.config.flow,
            self.config.tokens,
        )
        self.config = config
        self.retry = config.retry.policy() if config.retry else None
        for calls, given in list(self._calls.items()):
            calls.set_retry(self.retry)
            calls.deadline_header = config.deadline_header
            if asks_changed:
                capped = calls.ask.capped
                calls.ask = CallAsk(self.limit, *configured_ask(config, *given))
                calls.ask.capped = capped

    def __repr__(self) -> str:
        return f"<LimitedClient {self.limit_name!r} limit={self.limit!r} retry={self.retry!r}>"
