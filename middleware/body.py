"""What a queued connection sends while it waits, read so that a client that leaves is noticed.

Everything read is handed to the app once the connection is admitted, in order: an HTTP
request's body as one message of its bytes (bounded per request and over every queued
request), or a websocket's connect message. A read still in flight at admission is never
cancelled: its message is what the app's first receive() after the buffered ones returns.
"""

from __future__ import annotations

import asyncio
from collections import deque

from starlette.types import Message, Receive

__all__ = ["QueuedBodies", "QueuedRequest", "QueuedWebsocket"]


class QueuedBodies:
    """The body bytes held for every queued request of one middleware, and their bound: past
    it, queued requests stop reading (flow control holds their clients back)."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.held = 0
        self.limit = limit


class _Queued:
    """A connection's reads while it waits: at most one in flight, handed on, never cancelled
    while anyone may still want its message."""

    __slots__ = ("_pending", "_receive", "disconnected")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._pending: asyncio.Future[Message] | None = None
        self.disconnected = False

    def reading(self) -> asyncio.Future[Message] | None:
        """The read in flight, started if reading may go on; None once reading must stop."""
        pending = self._pending
        if pending is None and self._may_read():
            pending = self._pending = asyncio.ensure_future(self._receive())
        return pending

    def take(self) -> None:
        """Keep the message of the finished read in flight (its exception is raised)."""
        pending = self._pending
        assert pending is not None, "take() with no read in flight"
        self._pending = None
        self._keep(pending.result())

    async def receive(self) -> Message:
        """The app's receive: what was buffered, then the read in flight, then the server's."""
        message = self._replay()
        if message is not None:
            return message
        pending = self._pending
        if pending is None:
            return await self._receive()
        self._pending = None
        try:
            return await asyncio.shield(pending)  # cancelling the app's receive keeps the read
        except asyncio.CancelledError:
            if not pending.done() and self._pending is None:
                self._pending = pending  # the next receive() gets its message
            raise

    def close(self) -> None:
        """Stop a read nobody can take any more (the app returned, or the request ended)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.done():
            if not pending.cancelled():
                pending.exception()  # retrieved: nobody is left to raise it to
        else:
            pending.cancel()

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

    __slots__ = ("_bodies", "_body", "_max_body_bytes", "complete", "size")

    def __init__(self, receive: Receive, max_body_bytes: int, bodies: QueuedBodies) -> None:
        super().__init__(receive)
        self._max_body_bytes = max_body_bytes
        self._bodies = bodies
        self._body: bytes | bytearray | None = None  # None: nothing read, or handed to the app
        self.size = 0
        self.complete = False

    def body(self) -> bytes | None:
        """The whole body if it was read in full within `max_body_bytes`, else None."""
        if not self.complete or self.size > self._max_body_bytes:
            return None
        return bytes(self._body or b"")

    async def read_body(self, seconds: float) -> bytes | None:
        """Read on until the body is complete, within `seconds`; `body()` then (None if the
        client left, a bound stopped the reading, or the time ran out)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self.complete and not self.disconnected:
            pending = self.reading()
            if pending is None:
                return None
            if not pending.done():
                await asyncio.wait((pending,), timeout=deadline - loop.time())
                if not pending.done():
                    return None
            self.take()
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
        if body is None:
            return None
        message = {"type": "http.request", "body": bytes(body), "more_body": not self.complete}
        self._release_bytes()
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
        return self._buffered.popleft() if self._buffered else None
