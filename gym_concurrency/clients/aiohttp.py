"""limited_middleware: an aiohttp client middleware whose every attempt holds a slot of a limit,
retried as a RetryPolicy says: `aiohttp.ClientSession(middlewares=(limited_middleware(...),))`.

Only translation lives here; the call loop is gym_concurrency.clients.calls. Needs aiohttp
>= 3.12 (client middlewares; the `[aiohttp]` extra).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Mapping
from typing import NamedTuple

from opentelemetry.metrics import MeterProvider

from ._extras import missing_library

try:
    import aiohttp
    from aiohttp import ClientHandlerType, ClientRequest, ClientResponse
    from aiohttp.connector import Connection
    from aiohttp.streams import StreamReader
except ImportError as error:  # absent, or older than client middlewares (3.12)
    raise missing_library(error, "aiohttp", "limited_middleware", "3.12") from error

from ..flow import ROUTE_FLOW
from ..limits import Limit
from ..limits.adaptive import AdaptiveController
from ..safe_urls import safe_url
from ..settlement import Settlement
from .adaptive import AdaptiveConfig
from .calls import BodyDeadline, CallsView, DeadlineExceeded, LimitedCalls, Slot
from .leaks import guard_slot
from .retry import RetryPolicy, RetryReason
from .weights import RequestFlow, RequestWeight

__all__ = ["LimitedMiddleware", "limited_middleware"]

DISCARD_READ_BYTES = 64 * 1024  # as in the httpx transport: a short discarded body is read first


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
    deadline_header: str | None = None,
    tokens: RequestWeight | None = None,
) -> LimitedMiddleware:
    """A client middleware: each attempt takes one slot of `limit` and holds it until the
    response is read in full, released or closed; `retry` (None: one attempt) retries it;
    `adaptive` (an AdaptiveLimit or a controller) moves the limit. Each call asks for `weight`
    of the limit in `flow`: constants, or functions of the `aiohttp.ClientRequest`
    (`weight=openai_tokens` prices an OpenAI-style body); a weight over the limit is capped.
    `deadline_header` (None: off) sends what is left of a call's deadline, in milliseconds,
    on each attempt (e.g. "x-envoy-expected-rq-timeout-ms"). The default flow, ROUTE_FLOW,
    is that of the request being handled when the call is made. On a limit with a rate budget
    or an engine signal, each call also reserves `tokens` (None: its weight; as `weight`,
    `openai_tokens` prices the body), settled from the usage its response body reports."""
    return LimitedMiddleware(
        limit,
        retry=retry,
        adaptive=adaptive,
        meter_provider=meter_provider,
        weight=weight,
        flow=flow,
        deadline_header=deadline_header,
        tokens=tokens,
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
        deadline_header: str | None = None,
        tokens: RequestWeight | None = None,
    ) -> None:
        self.calls: LimitedCalls[_Call, ClientResponse] = LimitedCalls(
            limit,
            _AiohttpExchange(),
            retry=retry,
            adaptive=adaptive,
            meter_provider=meter_provider,
            weight=weight,
            flow=flow,
            deadline_header=deadline_header,
            tokens=tokens,
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

    def headers(self, response: ClientResponse) -> Mapping[str, str]:
        return response.headers

    def set_header(self, request: _Call, name: str, value: str) -> None:
        request.request.headers[name] = value

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
            if length is not None and length <= DISCARD_READ_BYTES:
                await response.read()
        except aiohttp.ClientError:
            pass  # a retry follows anyway
        finally:
            response.release()

    def hand_over(
        self, response: ClientResponse, slot: Slot, deadline: BodyDeadline | None
    ) -> ClientResponse:
        connection = response.connection
        if slot.settlement is not None:
            _meter_body(response, slot.settlement)
        if connection is None:  # no body to read (or it was read already): nothing to hold
            if slot.settlement is not None and response.content.is_eof():
                slot.settlement.end()  # the whole body came with the headers
            slot.release()
            return response
        _HeldSlot(response, slot, connection)
        _unpin(response)
        # Dropped unclosed: aiohttp's own finalizer frees the connection; this gives the slot
        # back and logs the leak.
        guard_slot(response, slot)
        if deadline is not None:
            held = weakref.ref(response)  # a dropped response is not kept until the deadline
            cut = asyncio.get_running_loop().call_at(deadline.at, _cut_off, held, deadline)
            connection.add_callback(cut.cancel)
        return response

    def deadline_exceeded(
        self, request: _Call, seconds: float, part: str = "response"
    ) -> DeadlineExceeded:
        req = request.request
        return DeadlineExceeded(
            f"{req.method} {safe_url(str(req.url))}: no {part} within the call's deadline of "
            f"{seconds:g} s"
        )


class _HeldSlot:
    """The slot of a response handed to the caller, given back when its connection is
    released (the body read in full, or the response released or closed) or lost (its
    session closed, the upstream gone); a response dropped unclosed is the leak guard's."""

    __slots__ = ("_closed", "_response", "_slot")

    def __init__(self, response: ClientResponse, slot: Slot, connection: Connection) -> None:
        self._response = weakref.ref(response)
        self._slot = slot
        protocol = connection.protocol
        self._closed = None if protocol is None else protocol.closed
        connection.add_callback(self._released)
        if self._closed is not None:
            self._closed.add_done_callback(self._lost)

    def _released(self) -> None:
        if self._closed is not None:
            self._closed.remove_done_callback(self._lost)
        response = self._response()
        settlement = self._slot.settlement
        if settlement is not None and response is not None:
            _METERED.pop(id(response.content), None)
            if response.content.is_eof():  # read in full: its usage settles it
                settlement.end()
        # Released by aiohttp's finalizer (the response dropped, not closed): left to the leak
        # guard, which gives it back unmeasured and says where the response was made.
        if response is not None and response.closed:
            self._slot.release()

    def _lost(self, _closed: asyncio.Future[None]) -> None:
        self._slot.release(measured=False)


class _MeteredReader(StreamReader):
    """A response body reader that shows each piece arriving to the attempt's settlement: a
    response's own reader gets this class once handed over (the same layout, no new slot)."""

    __slots__ = ()

    def feed_data(self, data: bytes, *args: int) -> bool:
        settlement = _METERED.get(id(self))
        if settlement is not None:
            settlement.feed(data)
        return super().feed_data(data, *args)


# The settlement each metered reader feeds, by the reader's id (a reader has no __weakref__):
# removed when the response's connection is released; a response dropped unclosed leaves a
# closed settlement here, which reads nothing more.
_METERED: dict[int, Settlement] = {}


def _meter_body(response: ClientResponse, settlement: Settlement) -> None:
    """Feed `settlement` the body of `response` as it arrives: what came with the headers now,
    the rest as aiohttp receives it. A reader of another kind (none: no body) is left alone
    (the call is charged in full unless it ends at once)."""
    settlement.start(response.headers.get("content-type"))
    content = response.content
    if type(content) is not StreamReader:
        return
    for piece in getattr(content, "_buffer", ()):  # aiohttp's own, as of 3.12 to 3.14
        settlement.feed(bytes(piece))
    if not content.is_eof():
        _METERED[id(content)] = settlement
        content.__class__ = _MeteredReader


def _unpin(response: ClientResponse) -> None:
    """aiohttp's body reader keeps the response alive until the body ends (its end-of-body
    callback is a method of the response): held weakly instead, a response dropped unread is
    collected, and its slot given back, before a body that may never end does."""
    callbacks = getattr(response.content, "_eof_callbacks", None)
    if isinstance(callbacks, list):  # aiohttp's own, as of 3.12 to 3.14
        callbacks[:] = [
            _weakly(callback) if getattr(callback, "__self__", None) is response else callback
            for callback in callbacks
        ]


def _weakly(method: Callable[[], None]) -> Callable[[], None]:
    held = weakref.WeakMethod(method)

    def call() -> None:
        bound = held()
        if bound is not None:
            bound()

    return call


def _cut_off(held: weakref.ref[ClientResponse], deadline: BodyDeadline) -> None:
    """The call's deadline passed with the body still unread: a read waiting (or to come)
    raises the deadline's error, and the connection is closed (giving the slot back)."""
    response = held()
    if response is None or response.connection is None:
        return  # collected, read in full, released or closed meanwhile
    response.content.set_exception(deadline.error())
    response.close()
