"""The upstream the outbound-client tests call: a pure ASGI app served by real uvicorn (in a
thread of the test process, so the test reads what it saw directly). Each path answers from
its script of replies, one per attempt, then 200; every attempt's arrival is recorded."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHAT_COMPLETION", "Attempt", "Reply", "Upstream"]

CHAT_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ok"},
            "finish_reason": "stop",
        }
    ],
}


@dataclass(frozen=True)
class Reply:
    """One answer: after `delay` seconds, `status` with `headers`, then `body` in `chunks`
    pieces `chunk_delay` apart (a streamed body when chunks > 1); `endless`: a streamed body
    that never ends (a piece every `chunk_delay`, until the caller goes)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    delay: float = 0.0
    chunks: int = 1
    chunk_delay: float = 0.0
    endless: bool = False


@dataclass
class Attempt:
    """One request as the upstream saw it: when it arrived, when its answer started (None
    while it has not) and its headers (names lowercase)."""

    path: str
    method: str
    arrived: float  # time.monotonic()
    answered: float | None = None
    headers: dict[str, str] = field(default_factory=dict)


class Upstream:
    """The ASGI app. `script(path, *replies)` queues answers for `path`; `attempts(path)` lists
    what arrived. `active` / `max_active`: requests inside the app now / at most."""

    def __init__(self, url: str = "") -> None:
        self.url = url  # where it is served
        self._scripts: dict[str, list[Reply]] = {}
        self._attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self.active = 0
        self.max_active = 0

    def script(self, path: str, *replies: Reply) -> None:
        with self._lock:
            self._scripts.setdefault(path, []).extend(replies)

    def attempts(self, path: str | None = None) -> list[Attempt]:
        with self._lock:
            return [a for a in self._attempts if path is None or a.path == path]

    def answering(self, number: int) -> bool:
        """Whether attempt `number` (1 for the first, on any path) has arrived and its answer
        not started yet: its caller holds its slot (`active` may still count one just done)."""
        seen = self.attempts()
        return len(seen) >= number and seen[number - 1].answered is None

    def gaps(self, path: str) -> list[float]:
        """Seconds from each answer on `path` to the next attempt's arrival."""
        seen = self.attempts(path)
        return [b.arrived - a.answered for a, b in itertools.pairwise(seen) if a.answered]

    def _next(self, path: str) -> Reply:
        with self._lock:
            replies = self._scripts.get(path)
            return replies.pop(0) if replies else Reply()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        arrived = time.monotonic()
        path = scope["path"]
        while (await receive()).get("more_body", False):
            pass
        reply = self._next(path)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        attempt = Attempt(path, scope["method"], arrived, headers=headers)
        with self._lock:
            self._attempts.append(attempt)
            number = sum(1 for a in self._attempts if a.path == path)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await asyncio.sleep(reply.delay)
            attempt.answered = time.monotonic()
            await self._answer(receive, send, reply, path, number)
        finally:
            self.active -= 1

    async def _answer(self, receive: Any, send: Any, reply: Reply, path: str, number: int) -> None:
        body = reply.body
        if body is None:
            default = CHAT_COMPLETION if path.endswith("/chat/completions") else {}
            body = json.dumps({**default, "attempt": number}).encode()
        headers = [(b"content-type", b"application/json"), (b"x-attempt", b"%d" % number)]
        headers += [(k.encode(), v.encode()) for k, v in reply.headers.items()]
        if reply.chunks <= 1 and not reply.endless:
            headers.append((b"content-length", b"%d" % len(body)))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        if reply.endless:
            await self._endless(receive, send, body, reply.chunk_delay)
            return
        if reply.chunks <= 1:
            await send({"type": "http.response.body", "body": body})
            return
        size = max(1, len(body) // reply.chunks)
        pieces = [body[i : i + size] for i in range(0, len(body), size)]
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            await asyncio.sleep(reply.chunk_delay)
        await send({"type": "http.response.body", "body": b""})

    async def _endless(self, receive: Any, send: Any, piece: bytes, every: float) -> None:
        """`piece` every `every` seconds until the caller disconnects (uvicorn's send says
        nothing of it: the disconnect comes from receive)."""
        gone = asyncio.ensure_future(receive())
        try:
            while not gone.done():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                await asyncio.sleep(every)
        finally:
            if not gone.done():  # the server stopping
                gone.cancel()
