"""LimitedTransport: an httpx transport whose every attempt holds a slot of a limit, retried as
a RetryPolicy says. `httpx.AsyncClient(transport=LimitedTransport(...))`, and so the openai
client: `openai.AsyncOpenAI(http_client=that_client, max_retries=0)`.

Only translation lives here; the call loop is gym_concurrency.clients.calls. Needs httpx
(the `[httpx]` extra).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Mapping

from opentelemetry.metrics import MeterProvider

from ._extras import missing_library

try:
    import httpx
except ImportError as error:
    raise missing_library(error, "httpx", "LimitedTransport", "0.27") from error

from ..flow import ROUTE_FLOW
from ..limits import Limit
from ..limits.adaptive import AdaptiveController
from ..safe_urls import safe_url
from .adaptive import AdaptiveConfig
from .calls import BodyDeadline, CallsView, DeadlineExceeded, LimitedCalls, Slot
from .leaks import guard_slot
from .retry import RetryPolicy, RetryReason
from .weights import RequestFlow, RequestWeight

__all__ = ["DeadlineTimeout", "LimitedTransport"]

# A response thrown away before a retry is read first when it says it is this short or
# shorter, so its connection goes back to the pool; a longer one closes its connection.
DISCARD_READ_BYTES = 64 * 1024


class DeadlineTimeout(httpx.TimeoutException, DeadlineExceeded):
    """The call's `deadline_seconds` ran out (an httpx timeout, so the openai client reports
    APITimeoutError; also a DeadlineExceeded and a TimeoutError)."""


class LimitedTransport(CallsView, httpx.AsyncBaseTransport):
    """An httpx transport around `transport` (default `httpx.AsyncHTTPTransport()`): each
    attempt takes one slot of `limit` and holds it until the response body has been read in
    full or the response closed (a streamed body keeps it); `retry` (None: one attempt)
    retries it; `adaptive` (an AdaptiveLimit or a controller) moves the limit. Each call asks
    for `weight` of the limit in `flow`: constants, or functions of the `httpx.Request`
    (`weight=openai_tokens` prices an OpenAI-style body); a weight over the limit is capped.
    `deadline_header` (None: off) sends what is left of a call's deadline, in milliseconds,
    on each attempt (e.g. "x-envoy-expected-rq-timeout-ms"). The default flow, ROUTE_FLOW,
    is that of the request being handled when the call is made. On a limit with a rate budget
    or an engine signal, each call also reserves `tokens` (None: its weight; as `weight`,
    `openai_tokens` prices the body), settled from the usage its response body reports."""

    def __init__(
        self,
        limit: Limit,
        *,
        retry: RetryPolicy | None = None,
        adaptive: AdaptiveConfig | AdaptiveController | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        meter_provider: MeterProvider | None = None,
        weight: RequestWeight = 1,
        flow: RequestFlow = ROUTE_FLOW,
        deadline_header: str | None = None,
        tokens: RequestWeight | None = None,
    ) -> None:
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()
        self._exchange = _HttpxExchange(self.transport)
        self.calls: LimitedCalls[httpx.Request, httpx.Response] = LimitedCalls(
            limit,
            self._exchange,
            retry=retry,
            adaptive=adaptive,
            meter_provider=meter_provider,
            weight=weight,
            flow=flow,
            deadline_header=deadline_header,
            tokens=tokens,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` through the limit, retried; the last response, unchanged."""
        return await self.calls.call(request)

    async def aclose(self) -> None:
        """Close the wrapped transport; slots still held by responses not closed (a stream
        abandoned unread) come back now, each the weight and flow it took."""
        for stream in list(self._exchange.streams):
            stream.give_back()
        await self.transport.aclose()


class _HttpxExchange:
    """The call loop's view of httpx; `streams`: the response bodies that still hold a slot."""

    __slots__ = ("streams", "transport")

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self.transport = transport
        self.streams: weakref.WeakSet[_SlotStream] = weakref.WeakSet()

    def method(self, request: httpx.Request) -> str:
        return request.method

    def subject(self, request: httpx.Request) -> httpx.Request:
        return request

    async def send(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)

    def status(self, response: httpx.Response) -> int:
        return response.status_code

    def header(self, response: httpx.Response, name: str) -> str | None:
        value: str | None = response.headers.get(name)
        return value

    def headers(self, response: httpx.Response) -> Mapping[str, str]:
        return response.headers

    def set_header(self, request: httpx.Request, name: str, value: str) -> None:
        request.headers[name] = value

    def failure(self, error: Exception) -> RetryReason | None:
        if isinstance(error, httpx.ConnectTimeout | httpx.PoolTimeout):
            return "connection"  # never sent
        if isinstance(error, httpx.TimeoutException):
            return "timeout"  # sent, perhaps acted on: no answer in time
        if isinstance(error, httpx.NetworkError | httpx.RemoteProtocolError):
            return "connection"  # raised before the response's headers: nothing answered
        return None

    def replayable(self, request: httpx.Request) -> bool:
        stream = request.stream  # a generator body can be sent only once
        consumed = getattr(stream, "_is_stream_consumed", False)
        return not (consumed and getattr(stream, "_is_generator", False))

    async def discard(self, response: httpx.Response) -> None:
        length = response.headers.get("content-length", "")
        try:
            if length.isdigit() and int(length) <= DISCARD_READ_BYTES:
                await response.aread()
        except httpx.TransportError:
            pass  # a retry follows anyway; the connection is closed below
        finally:
            await response.aclose()

    def hand_over(
        self, response: httpx.Response, slot: Slot, deadline: BodyDeadline | None
    ) -> httpx.Response:
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream), "an async transport's response"
        if slot.settlement is not None:
            headers = response.headers
            slot.settlement.start(headers.get("content-type"), headers.get("content-encoding"))
        response.stream = held = _SlotStream(stream, slot, deadline)
        self.streams.add(held)
        # Dropped unclosed: the slot and the pooled connection come back when it is collected.
        guard_slot(held, slot, stream.aclose)
        return response

    def deadline_exceeded(
        self, request: httpx.Request, seconds: float, part: str = "response"
    ) -> DeadlineExceeded:
        return DeadlineTimeout(
            f"{request.method} {safe_url(str(request.url))}: no {part} within the call's "
            f"deadline of {seconds:g} s",
            request=request,
        )


class _SlotStream(httpx.AsyncByteStream):
    """A response body that gives its slot back once read in full, closed, or broken off; a
    read still going at the call's deadline raises DeadlineTimeout."""

    __slots__ = ("_deadline", "_slot", "_stream")

    def __init__(
        self, stream: httpx.AsyncByteStream, slot: Slot, deadline: BodyDeadline | None
    ) -> None:
        self._stream = stream
        self._slot = slot
        self._deadline = deadline

    async def __aiter__(self) -> AsyncIterator[bytes]:
        deadline = self._deadline
        chunks = self._stream if deadline is None else _within(self._stream, deadline)
        settlement = self._slot.settlement
        try:
            async for chunk in chunks:
                if settlement is not None:
                    settlement.feed(chunk)
                yield chunk
        except BaseException:  # a broken or cancelled read: the caller may never close it
            self._slot.release(measured=False)  # charged in full if it had a budget
            raise
        if settlement is not None:  # read in full: its usage settles it
            settlement.end()
        self._slot.release()

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._slot.release()

    def give_back(self) -> None:
        """Its client is closing: the slot comes back, unread or not (no latency sample)."""
        self._slot.release(measured=False)


async def _within(stream: httpx.AsyncByteStream, deadline: BodyDeadline) -> AsyncIterator[bytes]:
    """`stream`'s chunks, each read before the call's deadline, else its DeadlineTimeout."""
    chunks = aiter(stream)
    while True:
        timeout = asyncio.timeout_at(deadline.at)
        try:
            async with timeout:
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError:
            if timeout.expired():
                raise deadline.error() from None
            raise
        yield chunk
