"""What a queued connection sends while it waits, read to notice the client leaving.

Everything read is buffered and replayed to the app once the connection is admitted: an HTTP
request's body (up to a bound), or a websocket's connect message.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from starlette.types import Message, Receive

__all__ = ["QueuedRequest", "QueuedWebsocket"]


class QueuedRequest:
    """The messages read from `receive` while queued, and whether the client disconnected.

    Reading stops once `max_body_bytes` of body are buffered (the client is then held back by
    flow control, and a disconnect is noticed only when the app reads).
    """

    __slots__ = (
        "_buffered",
        "_max_body_bytes",
        "_receive",
        "body_bytes",
        "body_complete",
        "disconnected",
    )

    def __init__(self, receive: Receive, max_body_bytes: int) -> None:
        self._receive = receive
        self._max_body_bytes = max_body_bytes
        self._buffered: deque[Message] = deque()
        self.body_bytes = 0
        self.body_complete = False
        self.disconnected = False

    async def watch(self, on_disconnect: Callable[[], object]) -> None:
        """Read until the client disconnects (then call `on_disconnect`) or the bound is hit."""
        while await self._read_one():
            pass
        if self.disconnected:
            on_disconnect()

    async def read_body(self) -> bytes:
        """Read on until the body is complete, the bound is hit or the client leaves; the body
        if it was read in full within `max_body_bytes`, else empty."""
        while not self.body_complete and await self._read_one():
            pass
        if not self.body_complete or self.body_bytes > self._max_body_bytes:
            return b""  # incomplete, or complete only by crossing the bound: not read in full
        return b"".join(m.get("body", b"") for m in self._buffered if m["type"] == "http.request")

    async def receive(self) -> Message:
        """The app's receive: the buffered messages first, then the server's."""
        if self._buffered:
            return self._buffered.popleft()
        return await self._receive()

    async def _read_one(self) -> bool:
        """Read one message if allowed; False once reading must stop."""
        at_bound = not self.body_complete and self.body_bytes >= self._max_body_bytes
        if self.disconnected or at_bound:
            return False
        message = await self._receive()
        self._buffered.append(message)
        if message["type"] == "http.disconnect":
            self.disconnected = True
            return False
        if message["type"] == "http.request":
            self.body_bytes += len(message.get("body", b""))
            self.body_complete = not message.get("more_body", False)
        return True


class QueuedWebsocket:
    """The messages a queued websocket sent before it was accepted (its connect, perhaps its
    disconnect), and whether the client disconnected."""

    __slots__ = ("_buffered", "_receive", "disconnected")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._buffered: deque[Message] = deque()
        self.disconnected = False

    async def watch(self, on_disconnect: Callable[[], object]) -> None:
        """Read until the client disconnects, then call `on_disconnect`."""
        while not self.disconnected:
            message = await self._receive()
            self._buffered.append(message)
            self.disconnected = message["type"] == "websocket.disconnect"
        on_disconnect()

    async def receive(self) -> Message:
        """The app's receive: the buffered messages first, then the server's."""
        if self._buffered:
            return self._buffered.popleft()
        return await self._receive()
