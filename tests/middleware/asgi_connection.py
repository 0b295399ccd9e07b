"""A connection as an ASGI server drives it, with the client's side in the test's hands:
messages are delivered when the test puts them, and what the app sends is kept."""

from __future__ import annotations

import asyncio
from typing import Any

Message = dict[str, Any]


class Connection:
    """One HTTP request or websocket: `put()` what the client sends, read `sent`.

    With `checkpoint=True`, receive() takes a message and then yields to the loop once before
    returning it, as receives wrapped by an outer middleware do (Starlette's
    BaseHTTPMiddleware): cancelling it at that point would lose the message.
    """

    def __init__(self, scope: dict[str, Any], *, checkpoint: bool = False) -> None:
        self.scope = scope
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.sent: list[Message] = []
        self.receives = 0  # receive() calls that returned a message
        self.lost = 0  # messages taken by a receive that was cancelled before returning them
        self._checkpoint = checkpoint
        self.done = asyncio.Event()

    def put(self, message: Message) -> None:
        self.inbox.put_nowait(message)

    async def receive(self) -> Message:
        message = await self.inbox.get()
        if self._checkpoint:
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                self.lost += 1
                raise
        self.receives += 1
        return message

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.done.set()

    @property
    def status(self) -> int | None:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def headers(self) -> dict[bytes, bytes]:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        return dict(starts[0]["headers"]) if starts else {}


def http_scope(path: str = "/run", method: str = "POST") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"test"), (b"content-type", b"application/json")],
        "server": ("test", 80),
        "client": ("127.0.0.1", 1),
    }


def websocket_scope(path: str = "/ws") -> dict[str, Any]:
    scope = http_scope(path)
    scope.update(type="websocket", scheme="ws", subprotocols=[])
    del scope["method"]
    return scope


async def loop_steps(n: int) -> None:
    """Let the event loop run `n` passes."""
    for _ in range(n):
        await asyncio.sleep(0)
