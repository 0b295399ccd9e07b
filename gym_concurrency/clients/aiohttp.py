"""limited_middleware: an aiohttp client middleware whose every attempt holds a slot of a limit,
retried as a RetryPolicy says: `aiohttp.ClientSession(middlewares=(limited_middleware(...),))`.

Only translation lives here; the call loop is gym_concurrency.clients.calls. Needs aiohttp
>= 3.12 (client middlewares; the `[aiohttp]` extra).
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from opentelemetry.metrics import MeterProvider

from ._extras import missing_library

try:
    import aiohttp
    from aiohttp import ClientHandlerType, ClientRequest, ClientResponse
except ImportError as error:  # absent, or older than client middlewares (3.12)
    raise missing_library(error, "aiohttp", "limited_middleware", "3.12") from error

from ..limits import Limit
from ..limits.adaptive import AdaptiveController
from .adaptive import AdaptiveConfig
from .calls import BodyDeadline, CallsView, DeadlineExceeded, LimitedCalls, Slot
from .retry import RetryPolicy, RetryReason
from .weights import ROUTE_FLOW, RequestFlow, RequestWeight

__all__ = ["LimitedMiddleware", "limited_middleware"]

DRAIN_BYTES = 64 * 1024  # as in the httpx transport: a short discarded body is read first


class _Call(NamedTuple):
    request: ClientRequest
    handler: ClientHandlerType


def limited_middleware(
    limit: Limit,
    *,
    retry: RetryPolicy | None = None,
    adaptive: AdaptiveConfig | AdaptiveController | None = None,
    meter_provider: MeterProvider | None = None,
    weight: RequestWeight = 1,
    flow: RequestFlow = ROUTE_FLOW,
) -> LimitedMiddleware:
    """A client middleware: each attempt takes one slot of `limit` and holds it until the
    response is read in full, released or closed; `retry` (None: one attempt) retries it;
    `adaptive` (an AdaptiveLimit or a controller) moves the limit. Each call asks for `weight`
    of the limit in `flow`: constants, or functions of the `aiohttp.ClientRequest`
    (`weight=openai_tokens` prices an OpenAI-style body); a weight over the limit is capped.
    The default flow, ROUTE_FLOW, is that of the request being handled when the call is made."""
    return LimitedMiddleware(
        limit,
        retry=retry,
        adaptive=adaptive,
        meter_provider=meter_provider,
        weight=weight,
        flow=flow,
    )


class LimitedMiddleware(CallsView):
    """The middleware `limited_middleware` returns; one per limit, shared by every request
    (and session) it is given to."""

    __slots__ = ("calls",)

    def __init__(
        self,
        limit: Limit,
        *,
        retry: RetryPolicy | None = None,
        adaptive: AdaptiveConfig | AdaptiveController | None = None,
        meter_provider: MeterProvider | None = None,
        weight: RequestWeight = 1,
        flow: RequestFlow = ROUTE_FLOW,
    ) -> None:
        self.calls: LimitedCalls[_Call, ClientResponse] = LimitedCalls(
            limit,
            _AiohttpExchange(),
            retry=retry,
            adaptive=adaptive,
            meter_provider=meter_provider,
            weight=weight,
            flow=flow,
        )

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        """Send `request` through the limit, retried; the last response, unchanged."""
        return await self.calls.call(_Call(request, handler))


class _AiohttpExchange:
    """The call loop's view of aiohttp."""

    __slots__ = ()

    def method(self, request: _Call) -> str:
        return request.request.method

    def subject(self, request: _Call) -> ClientRequest:
        return request.request

    async def send(self, request: _Call) -> ClientResponse:
        return await request.handler(request.request)

    def status(self, response: ClientResponse) -> int:
        return response.status

    def header(self, response: ClientResponse, name: str) -> str | None:
        return response.headers.get(name)

    def failure(self, error: Exception) -> RetryReason | None:
        if isinstance(error, aiohttp.ConnectionTimeoutError):
            return "connection"  # never sent
        if isinstance(error, aiohttp.ServerTimeoutError):
            return "timeout"  # sent, perhaps acted on: no answer in time
        if isinstance(error, aiohttp.ClientConnectionError):
            return "connection"  # raised before the response's headers: nothing answered
        return None

    def replayable(self, request: _Call) -> bool:
        body = request.request.body  # a stream or an unseekable file is sent only once
        return not getattr(body, "consumed", False)

    async def discard(self, response: ClientResponse) -> None:
        length = response.content_length
        try:
            if length is not None and length <= DRAIN_BYTES:
                await response.read()
        except aiohttp.ClientError:
            pass  # a retry follows anyway
        finally:
            response.release()

    def hand_over(
        self, response: ClientResponse, slot: Slot, deadline: BodyDeadline | None
    ) -> ClientResponse:
        connection = response.connection
        if connection is None:  # no body to read (or it was read already): nothing to hold
            slot.release()
            return response
        # Called when the body has been read, or the response released or closed (also by
        # aiohttp's own finalizer when the response is dropped unreleased).
        connection.add_callback(slot.release)
        if deadline is not None:
            cut = asyncio.get_running_loop().call_at(deadline.at, _cut_off, response, deadline)
            connection.add_callback(cut.cancel)
        return response

    def deadline_exceeded(
        self, request: _Call, seconds: float, part: str = "response"
    ) -> DeadlineExceeded:
        req = request.request
        return DeadlineExceeded(
            f"{req.method} {req.url}: no {part} within the call's deadline of {seconds:g} s"
        )


def _cut_off(response: ClientResponse, deadline: BodyDeadline) -> None:
    """The call's deadline passed with the body still unread: a read waiting (or to come)
    raises the deadline's error, and the connection is closed (giving the slot back)."""
    if response.connection is None:
        return  # read in full, released or closed meanwhile
    response.content.set_exception(deadline.error())
    response.close()
