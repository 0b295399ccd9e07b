"""The upstream of benchmarks/tokens.py: a fake OpenAI-compatible model whose capacity is in
tokens (its "KV cache"), not in requests.

`POST /v1/chat/completions` prices the call as a server reserving its KV cache would: the
prompt's characters / 4, rounded up (every string under `messages`), plus `max_tokens`. If the
tokens in flight plus that would pass `--capacity`, it answers 429 at once; else it holds them
for `--base-ms` + `--us-per-token` a token (by default 20 ms + 4 µs: a 100-token call ~20 ms, a
16k-token call ~84 ms; 100 ms + 40 µs, closer to a real model, makes them 0.1 s and 0.74 s) and
answers a completion. It integrates the tokens in flight over time exactly (at every change),
so the time-averaged tokens in flight between two reads of `GET /stats` is the difference of
their `token_seconds` over the difference of their `t`. `GET /stats` also says how many calls
were served and refused and the most tokens ever in flight.

    taskset -c 0 python -m benchmarks._tokens_upstream --port P [--capacity 64000]
        [--base-ms 20] [--us-per-token 4]

Plain ASGI on uvicorn (httptools, uvloop), 127.0.0.1 only. It does not import
gym_concurrency: its pricing is its own (the same rule as `openai_tokens`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from typing import Any

from benchmarks._asgi import read_body

BASE_S = 0.020
PER_TOKEN_S = 4e-6
_JSON = [(b"content-type", b"application/json")]
_REFUSED = b'{"error":{"message":"over token capacity","type":"rate_limit","code":null}}'


def strings(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(strings(v) for v in value.values())
    if isinstance(value, list):
        return sum(strings(v) for v in value)
    return 0


def price(body: dict[str, Any]) -> int:
    """Prompt characters / 4, rounded up, + max_tokens: the KV cache a call may take."""
    return math.ceil(strings(body.get("messages")) / 4) + int(body.get("max_tokens") or 0)


class Upstream:
    def __init__(self, capacity: int, base_s: float = BASE_S, per_token_s: float = PER_TOKEN_S):
        self.capacity = capacity
        self.base_s, self.per_token_s = base_s, per_token_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.token_seconds = 0.0
        self.last = time.perf_counter()
        self.served = 0
        self.served_tokens = 0
        self.refused = 0
        self.malformed = 0

    def _advance(self) -> float:
        now = time.perf_counter()
        self.token_seconds += self.in_flight * (now - self.last)
        self.last = now
        return now

    def stats(self) -> dict[str, Any]:
        now = self._advance()
        return {
            "t": now,
            "token_seconds": self.token_seconds,
            "capacity": self.capacity,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "served": self.served,
            "served_tokens": self.served_tokens,
            "refused": self.refused,
            "malformed": self.malformed,
        }

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        path = scope["path"]
        if path == "/stats":
            await _reply(send, 200, json.dumps(self.stats()).encode())
            return
        if path != "/v1/chat/completions":
            await _reply(send, 404, b"{}")
            return
        try:
            tokens = price(json.loads(body))
        except (ValueError, TypeError, AttributeError):
            self.malformed += 1
            await _reply(send, 400, b"{}")
            return
        if self.in_flight + tokens > self.capacity:
            self.refused += 1
            await _reply(send, 429, _REFUSED)
            return
        self._advance()
        self.in_flight += tokens
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.base_s + self.per_token_s * tokens)
        finally:
            self._advance()
            self.in_flight -= tokens
        self.served += 1
        self.served_tokens += tokens
        completion = {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"total_tokens": tokens},
        }
        await _reply(send, 200, json.dumps(completion).encode())


async def _reply(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _JSON})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--capacity", type=int, default=64_000)
    parser.add_argument("--base-ms", type=float, default=BASE_S * 1e3, help="service time")
    parser.add_argument("--us-per-token", type=float, default=PER_TOKEN_S * 1e6, help="and more")
    args = parser.parse_args()
    if not (0 <= args.base_ms <= 10_000 and 0 <= args.us_per_token <= 1_000):
        parser.error("--base-ms must be in [0, 10000] and --us-per-token in [0, 1000]")
    import uvicorn

    uvicorn.run(
        Upstream(args.capacity, args.base_ms / 1e3, args.us_per_token / 1e6),
        host="127.0.0.1",
        port=args.port,
        loop="auto",  # uvloop and httptools when installed (the `bench` extra)
        http="auto",
        lifespan="off",
        log_level="error",
        access_log=False,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
