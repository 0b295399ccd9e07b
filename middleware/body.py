"""What a queued connection sends while it waits, read so that a client that leaves is noticed.

Everything read is handed to the app once the connection is admitted, in order: an HTTP
request's body as one message of its bytes (bounded per request and over every queued
request), or a websocket's connect message. A read still in flight at admission is never
cancelled: its message is what the app's first receive() after the buffered ones returns.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.types import Message, Receive

__all__ = ["QueuedBodies", "QueuedRequest", "QueuedWebsocket"]


def _cancel_if_running(pending: asyncio.Future[Any]) -> None:
    if not pending.done():
        pending.cancel()


def _start(reads: Coroutine[Any, Any, Message | None]) -> asyncio.Task[Message | None]:
    """The reader task; where Python has eager tasks (3.12), run at once up to its first wait,
    so a message the server already has costs no loop pass."""
    loop = asyncio.get_running_loop()
    if _EAGER:
        # eager_start is new in 3.12; mypy checks against 3.11's signature.
        return asyncio.Task(reads, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
    return loop.create_task(reads)


_EAGER = sys.version_info >= (3, 12)


class QueuedBodies:
    """The body bytes held for every queued request of one middleware, and their bound: past
    it, queued requests stop reading (flow control holds their clients back)."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.held = 0
        self.limit = limit


class _Queued:
    """A connection's reads while it waits: one reader task at most, one read in flight in it,
    its message handed on to the app, never cancelled while anyone may still want it."""

    __slots__ = ("_on_stop", "_reader", "_receive", "disconnected", "failure")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._reader: asyncio.Future[Message | None] | None = None
        self._on_stop: Callable[[], object] | None = None
        self.disconnected = False
        self.failure: BaseException | None = None  # a read that raised

    @property
    def stopped(self) -> bool:
        """True once the client disconnected or reading it failed."""
        return self.disconnected or self.failure is not None

    def watch(self, on_stop: Callable[[], object]) -> None:
        """Read the client until `stop_watching()`; call `on_stop` if it disconnects or a read
        fails first."""
        self._on_stop = on_stop
        if self._may_read():
            self._reader = _start(self._read_while_watching())

    def stop_watching(self) -> None:
        """Keep no more of what is read; a read in flight stays, its message for the app."""
        self._on_stop = None

    async def receive(self) -> Message:
        """The app's receive: what was buffered, then the read in flight, then the server's."""
        message = self._replay()
        if message is not None:
            return message
        reader = self._reader
        if reader is None:
            return await self._receive()
        self._reader = None  # its message is this call's now
        try:
            message = await asyncio.shield(reader)  # cancelling the app's receive keeps the read
        except asyncio.CancelledError:
            # The next receive() gets its message, also one that ended in this same pass.
            if self._reader is None and not reader.cancelled():
                self._reader = reader
            raise
        if message is None:  # it kept all it read (or failed): buffered, or the server's next
            message = self._replay()
        return message if message is not None else await self._receive()

    def close(self) -> None:
        """Drop a read nobody can take any more (the app returned, or the request ended)."""
        self._on_stop = None
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            # Most servers end it themselves as the response completes (uvicorn answers it
            # with http.disconnect in the next loop pass); cancel it only if still running then.
            asyncio.get_running_loop().call_soon(_cancel_if_running, reader)

    async def _read_while_watching(self) -> Message | None:
        """Read and keep while watching, up to a disconnect, a failure or a bound; a read that
        ends after `stop_watching()` is returned instead, for the app."""
        while True:
            try:
                message = await self._receive()
            except Exception as error:  # kept, and raised to the app (or the wait)
                self.failure = error
                self._stop()
                return None
            except BaseException:  # a cancel (closed, or the loop ending): not the client's
                self._stop()  # (kept, its traceback would hold this object in a cycle)
                raise
            if self._on_stop is None:
                return message
            self._keep(message)
            if self.disconnected:
                self._stop()
                return None
            if not self._may_read():
                return None

    def _stop(self) -> None:
        on_stop, self._on_stop = self._on_stop, None
        if on_stop is not None:
            on_stop()

    def _may_read(self) -> bool:
        raise NotImplementedError

    def _keep(self, message: Message) -> None:
        raise NotImplementedError

    def _replay(self) -> Message | None:
        raise NotImplementedError


class QueuedRequest(_Queued):
    """A queued HTTP request: its body bytes so far, whether it is complete, and whether the
    client disconnected. Reading stops at `max_body_bytes` of this body or when `bodies` is
    full; once the body is complete, the next read only notices a disconnect."""

    __slots__ = ("_bodies", "_body", "_disconnect", "_max_body_bytes", "complete", "size")

    def __init__(self, receive: Receive, max_body_bytes: int, bodies: QueuedBodies) -> None:
        super().__init__(receive)
        self._max_body_bytes = max_body_bytes
        self._bodies = bodies
        self._body: bytes | bytearray | None = None  # None: nothing read, or handed to the app
        self._disconnect: Message | None = None  # replayed after the body
        self.size = 0
        self.complete = False

    def body(self) -> bytes | None:
        """The whole body if it was read in full within `max_body_bytes`, else None."""
        if not self.complete or self.size > self._max_body_bytes:
            return None
        return bytes(self._body or b"")

    async def read_ahead(self) -> bytes | None:
        """Read the body before admission, within the same bounds as a queued one: `body()`
        (None if a bound stopped the reading or the client left). Every byte read is handed
        to the app by `receive()`, the rest of a body cut off by a bound after it."""
        while not self.complete and not self.disconnected and self._may_read():
            self._keep(await self._receive())
        return self.body()

    async def read_body(self, seconds: float) -> bytes | None:
        """Read on until the body is complete, within `seconds`; `body()` then (None if the
        client left, a bound stopped the reading, or the time ran out). For a refusal only:
        a read cut off by the deadline is wanted by nobody."""
        self.stop_watching()
        try:
            async with asyncio.timeout(seconds):
                while not self.complete and not self.disconnected:
                    reader, self._reader = self._reader, None
                    if reader is not None:
                        message = await reader
                        if self.failure is not None:
                            raise self.failure
                        if message is not None:
                            self._keep(message)
                    elif self._may_read():
                        self._keep(await self._receive())
                    else:
                        return None
        except TimeoutError:
            return None
        return None if self.disconnected else self.body()

    def close(self) -> None:
        super().close()
        self._release_bytes()

    def _may_read(self) -> bool:
        if self.disconnected:
            return False
        if self.complete:
            return True  # to notice the client leaving
        return self.size < self._max_body_bytes and self._bodies.held < self._bodies.limit

    def _keep(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.disconnect":
            self.disconnected = True
            self._disconnect = message
        elif kind == "http.request" and not self.complete:
            self._append(message.get("body", b""))
            self.complete = not message.get("more_body", False)

    def _append(self, chunk: bytes) -> None:
        body = self._body
        if body is None:
            self._body = chunk
        elif chunk:
            if isinstance(body, bytes):  # a second chunk: grow one buffer, not a list of them
                body = self._body = bytearray(body)
            body += chunk
        self.size += len(chunk)
        self._bodies.held += len(chunk)

    def _replay(self) -> Message | None:
        body = self._body
        if body is not None:
            self._release_bytes()
            return {"type": "http.request", "body": bytes(body), "more_body": not self.complete}
        if self.failure is not None:
            raise self.failure
        message, self._disconnect = self._disconnect, None
        return message

    def _release_bytes(self) -> None:
        if self._body is not None:
            self._bodies.held -= len(self._body)
            self._body = None


class QueuedWebsocket(_Queued):
    """A queued websocket: the messages it sent before it was accepted (its connect, perhaps
    its disconnect), and whether the client disconnected."""

    __slots__ = ("_buffered",)

    def __init__(self, receive: Receive) -> None:
        super().__init__(receive)
        self._buffered: deque[Message] = deque()

    def _may_read(self) -> bool:
        return not self.disconnected

    def _keep(self, message: Message) -> None:
        self._buffered.append(message)
        self.disconnected = message["type"] == "websocket.disconnect"

    def _replay(self) -> Message | None:
        if self._buffered:
            return self._buffered.popleft()
        if self.failure is not None:
            raise self.failure
        return None
