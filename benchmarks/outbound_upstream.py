"""The upstream of benchmarks/outbound.py: a fake OpenAI-compatible model that serves at most
CAPACITY requests at once, each for uniform(20, 50) ms, and answers every request above that
at once with 429 and `Retry-After: 1`. While "down" it answers everything at once with 503 (no
Retry-After: a gateway in front of a dead model).

It records every request (arrival time, status, whether its call id was new) and every 429's
Retry-After per call id, so that it can count attempts made before the Retry-After they were
given. `GET /stats` answers the record; `POST /reset` clears it; `POST /down?seconds=S`
takes it down for S seconds. The call id is the request body's "user" field (every client in
the benchmark sends a chat completion body with one).

    taskset -c 0 python -m uvicorn benchmarks.outbound_upstream:app --port P --loop uvloop \
        --http httptools --no-access-log
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

from benchmarks._asgi import read_body

CAPACITY = 32
SERVICE_SECONDS = (0.020, 0.050)
RETRY_AFTER_SECONDS = 1

_COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()
_JSON = [(b"content-type", b"application/json")]
_REFUSED = b'{"error":{"message":"over capacity","type":"rate_limit","param":null,"code":null}}'
_DOWN = b'{"error":{"message":"upstream down","type":"server_error","param":null,"code":null}}'


class Upstream:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.inside = 0
        self.max_inside = 0
        self.down_until = 0.0
        self.started = time.monotonic()
        # one row per request: (arrival - started, status, first attempt of its call?)
        self.requests: list[tuple[float, int, bool]] = []
        self.service: list[float] = []  # seconds of each request served, as drawn
        self.held: list[float] = []  # ... and as it took (the loop's own delays included)
        self.seen: set[str] = set()
        self.not_before: dict[str, float] = {}  # call id -> earliest retry its 429 allowed
        self.early = 0  # attempts that came before their Retry-After
        self.early_by: list[float] = []  # how early (seconds)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await read_body(receive)
        path = scope["path"]
        if path.endswith("/chat/completions"):
            await self._completion(body, send)
        elif path == "/stats":
            await _reply(send, 200, json.dumps(self._stats()).encode())
        elif path == "/reset":
            self.reset()
            await _reply(send, 200, b"{}")
        elif path == "/down":
            seconds = float(scope["query_string"].decode().partition("=")[2] or 20)
            self.down_until = time.monotonic() + seconds
            await _reply(send, 200, b"{}")
        else:
            await _reply(send, 404, b"{}")

    async def _completion(self, body: bytes, send: Any) -> None:
        now = time.monotonic()
        call = _call_id(body)
        first = call not in self.seen
        if first:
            self.seen.add(call)
        allowed = self.not_before.pop(call, None)
        if allowed is not None and now < allowed:
            self.early += 1
            self.early_by.append(allowed - now)
        if now < self.down_until:
            self.requests.append((now - self.started, 503, first))
            await _reply(send, 503, _DOWN)
            return
        if self.inside >= CAPACITY:
            self.requests.append((now - self.started, 429, first))
            self.not_before[call] = now + RETRY_AFTER_SECONDS
            headers = [(b"retry-after", b"%d" % RETRY_AFTER_SECONDS)]
            await _reply(send, 429, _REFUSED, headers)
            return
        self.inside += 1
        self.max_inside = max(self.max_inside, self.inside)
        seconds = random.uniform(*SERVICE_SECONDS)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.inside -= 1
        self.service.append(seconds)
        self.held.append(time.monotonic() - now)
        self.requests.append((now - self.started, 200, first))
        await _reply(send, 200, _COMPLETION)

    def _stats(self) -> dict[str, Any]:
        return {
            "capacity": CAPACITY,
            "max_inside": self.max_inside,
            "inside": self.inside,
            "mean_service_seconds": (sum(self.service) / len(self.service)) if self.service else 0,
            "mean_held_seconds": (sum(self.held) / len(self.held)) if self.held else 0,
            "early": self.early,
            "early_max_seconds": max(self.early_by, default=0.0),
            "requests": self.requests,
        }


def _call_id(body: bytes) -> str:
    try:
        return str(json.loads(body).get("user", ""))
    except (ValueError, AttributeError):
        return ""


async def _reply(
    send: Any, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [*_JSON, (b"content-length", b"%d" % len(body)), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


app = Upstream()
