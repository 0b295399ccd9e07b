"""A fake hosted model provider, metered as OpenAI and Anthropic meter theirs: tokens and
requests per minute, enforced over a real sliding one-minute window (or token buckets).

`POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic) price a call as the
provider would: prompt tokens = the characters of every string in `messages` (and `system`) /
4, rounded up; completion tokens = `--completion-share` x its `max_completion_tokens` /
`max_tokens` (else `--default-max-tokens`), rounded up. A call fits if, with it, the tokens
and requests of the last `--window-seconds` (60) stay within `--tpm` / `--rpm` (and `--itpm`
/ `--otpm` for input / output tokens, when given); or, with `--meter bucket`, if token
buckets of those sizes, refilled continuously over the window (as OpenAI and Anthropic
describe theirs), hold it. A call that fits is charged at once, answered after
`--base-ms` + `--us-per-token` per token, with its `usage`, streamed when `"stream": true`
(OpenAI's final usage chunk when `stream_options.include_usage`; Anthropic's `message_start`
and `message_delta`). Over the window it answers 429 at once, charged nothing, with
`Retry-After` (whole seconds, rounded up) and `retry-after-ms` saying when it would fit; a
call larger than a whole window is refused with `x-should-retry: false`.

Every answer carries the provider's headers: OpenAI's `x-ratelimit-{limit,remaining,reset}-
{requests,tokens}` (reset as Go durations: `6m0s`, `20ms`) or
Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,
reset}` (reset an RFC 3339 time): the reset is when the window will be empty (a bucket: full)
again. `GET /stats` says what was served and refused (by reason), the tokens and requests in
the window (a bucket: taken and not yet refilled) now and at most, and the tokens served in
each whole window since the start. `GET /calls` lists the calls served, each as its moment (the
provider's clock, `time.monotonic()`) and its tokens, the newest `CALLS_KEPT` (100,000): any
window's served tokens and requests, exactly (a benchmark's sliding-minute maximum).

    python -m benchmarks._fake_provider --port P [--tpm 60000] [--rpm 500] [--itpm N]
        [--otpm N] [--completion-share 1.0] [--base-ms 20] [--us-per-token 0]
        [--meter sliding|bucket]

Plain ASGI on uvicorn, 127.0.0.1 only. It does not import gym_concurrency: its pricing is its
own (the same rule as `openai_tokens`), so that a test of the library against it is a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from benchmarks._asgi import read_body
from benchmarks._tokens_upstream import strings

__all__ = [
    "CALLS_KEPT",
    "FakeProvider",
    "SlidingWindow",
    "TokenBucket",
    "go_duration",
    "prompt_tokens",
]

_JSON = (b"content-type", b"application/json")
_SSE = (b"content-type", b"text/event-stream")
CALLS_KEPT = 100_000  # the newest calls served that `GET /calls` lists (memory bounded)


class SlidingWindow:
    """The amounts charged in the last `seconds`, each counted for exactly `seconds`."""

    def __init__(self, limit: int, seconds: float) -> None:
        self.limit, self.seconds = limit, seconds
        self._charges: deque[tuple[float, int]] = deque()
        self.total = 0
        self.most = 0  # the most ever counted at once

    def _forget(self, now: float) -> None:
        while self._charges and self._charges[0][0] + self.seconds <= now:
            self.total -= self._charges.popleft()[1]

    def wait(self, amount: int, now: float) -> float | None:
        """Seconds until `amount` fits (0.0: now); None if it never can."""
        if amount > self.limit:
            return None
        self._forget(now)
        excess = self.total + amount - self.limit
        for at, charged in self._charges:
            if excess <= 0:
                break
            excess -= charged
            if excess <= 0:
                return at + self.seconds - now
        return 0.0

    def charge(self, amount: int, now: float) -> None:
        self._forget(now)
        self._charges.append((now, amount))
        self.total += amount
        self.most = max(self.most, self.total)

    def remaining(self, now: float) -> int:
        self._forget(now)
        return max(0, self.limit - self.total)

    def reset(self, now: float) -> float:
        """Seconds until the window is empty again (its state "initial")."""
        self._forget(now)
        return self._charges[-1][0] + self.seconds - now if self._charges else 0.0


class TokenBucket:
    """A bucket of `limit` tokens refilled continuously at `limit` per `seconds`, starting full:
    how OpenAI and Anthropic describe their own limits. The same face as SlidingWindow."""

    def __init__(self, limit: int, seconds: float) -> None:
        self.limit, self.seconds = limit, seconds
        self._level = float(limit)
        self._at: float | None = None
        self.total = 0  # taken and not yet refilled: limit - level
        self.most = 0

    def _refill(self, now: float) -> None:
        if self._at is not None and now > self._at:
            self._level = min(
                self.limit, self._level + (now - self._at) * self.limit / self.seconds
            )
        self._at = now if self._at is None else max(now, self._at)
        self.total = self.limit - math.floor(self._level)

    def wait(self, amount: int, now: float) -> float | None:
        if amount > self.limit:
            return None
        self._refill(now)
        short = amount - self._level
        return 0.0 if short <= 0 else short * self.seconds / self.limit

    def charge(self, amount: int, now: float) -> None:
        self._refill(now)
        self._level -= amount
        self.total = self.limit - math.floor(self._level)
        self.most = max(self.most, self.total)

    def remaining(self, now: float) -> int:
        self._refill(now)
        return max(0, math.floor(self._level))

    def reset(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        self._refill(now)
        return (self.limit - self._level) * self.seconds / self.limit


def prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt's characters (every string under `messages` and `system`) / 4, rounded up."""
    return math.ceil((strings(body.get("messages")) + strings(body.get("system"))) / 4)


def go_duration(seconds: float) -> str:
    """`seconds` as Go prints a duration, as OpenAI's reset headers are: `6m0s`, `1.5s`,
    `20ms`, `1h2m3.5s`; `0s`."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{_trim(seconds * 1000)}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{_trim(secs)}s"
    if hours or minutes:
        text = f"{int(minutes)}m{text}"
    return f"{int(hours)}h{text}" if hours else text


def _trim(number: float) -> str:
    return f"{number:.3f}".rstrip("0").rstrip(".")


class FakeProvider:
    """The ASGI app (see the module's docstring); `stats()` is what `GET /stats` answers."""

    def __init__(
        self,
        tokens_per_minute: int = 60_000,
        requests_per_minute: int = 500,
        *,
        input_tokens_per_minute: int | None = None,
        output_tokens_per_minute: int | None = None,
        completion_share: float = 1.0,
        default_max_tokens: int = 256,
        base_seconds: float = 0.0,
        seconds_per_token: float = 0.0,
        window_seconds: float = 60.0,
        meter: str = "sliding",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.clock, self.wall = clock, wall
        self.window_seconds = window_seconds
        sizes: dict[str, int | None] = {
            "tokens": tokens_per_minute,
            "requests": requests_per_minute,
            "input_tokens": input_tokens_per_minute,
            "output_tokens": output_tokens_per_minute,
        }
        if meter not in ("sliding", "bucket"):
            raise ValueError(f"meter must be 'sliding' or 'bucket', not {meter!r}")
        kind = SlidingWindow if meter == "sliding" else TokenBucket
        self.windows: dict[str, SlidingWindow | TokenBucket] = {
            name: kind(size, window_seconds) for name, size in sizes.items() if size is not None
        }
        self.completion_share, self.default_max_tokens = completion_share, default_max_tokens
        self.base_seconds, self.seconds_per_token = base_seconds, seconds_per_token
        self.started = clock()
        self.served = 0
        self.refused: dict[str, int] = {}
        self.tokens_served = 0
        self.per_window: dict[int, int] = {}  # whole windows since the start -> tokens served
        self.calls: deque[tuple[float, int]] = deque(maxlen=CALLS_KEPT)  # (moment, tokens) served
        self.malformed = 0

    def stats(self) -> dict[str, Any]:
        now = self.clock()
        for window in self.windows.values():
            window.remaining(now)  # forget what left the window
        return {
            "t": now,
            "served": self.served,
            "refused": sum(self.refused.values()),
            "refused_by": dict(self.refused),
            "tokens_served": self.tokens_served,
            "in_window": {name: w.total for name, w in self.windows.items()},
            "most_in_window": {name: w.most for name, w in self.windows.items()},
            "limits": {name: w.limit for name, w in self.windows.items()},
            "tokens_per_window": [self.per_window.get(i, 0) for i in range(self._index(now) + 1)],
            "malformed": self.malformed,
        }

    def calls_served(self) -> dict[str, Any]:
        """What `GET /calls` answers: the newest calls served, [moment, tokens] each, oldest
        first."""
        return {"kept": CALLS_KEPT, "calls": [[at, tokens] for at, tokens in self.calls]}

    def _index(self, now: float) -> int:
        return int((now - self.started) // self.window_seconds)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        path = scope["path"]
        if path == "/stats":
            await _send(send, 200, [_JSON], json.dumps(self.stats()).encode())
        elif path == "/calls":
            await _send(send, 200, [_JSON], json.dumps(self.calls_served()).encode())
        elif path in ("/v1/chat/completions", "/v1/messages"):
            await self._call(send, body, anthropic=path == "/v1/messages")
        else:
            await _send(send, 404, [_JSON], b'{"error":{"message":"not found"}}')

    async def _call(self, send: Any, body: bytes, *, anthropic: bool) -> None:
        try:
            request = json.loads(body)
            prompt = prompt_tokens(request)
        except (ValueError, AttributeError, RecursionError):
            self.malformed += 1
            await _send(send, 400, [_JSON], b'{"error":{"message":"not a JSON object"}}')
            return
        bounds = [request.get("max_completion_tokens"), request.get("max_tokens")]
        bound = next((n for n in bounds if _count(n)), self.default_max_tokens)
        completion = math.ceil(self.completion_share * bound)
        cost = {"tokens": prompt + completion, "requests": 1}
        cost |= {"input_tokens": prompt, "output_tokens": completion}
        now = self.clock()
        waits = [w.wait(cost[name], now) for name, w in self.windows.items()]
        if any(wait is None or wait > 0 for wait in waits):
            await self._refuse(send, waits, anthropic, now)
            return
        for name, window in self.windows.items():
            window.charge(cost[name], now)
        headers = self._headers(anthropic, now)
        self.served += 1
        self.tokens_served += cost["tokens"]
        index = self._index(now)
        self.per_window[index] = self.per_window.get(index, 0) + cost["tokens"]
        self.calls.append((now, cost["tokens"]))
        await asyncio.sleep(self.base_seconds + self.seconds_per_token * cost["tokens"])
        streamed = request.get("stream") is True
        if streamed:
            with_usage = anthropic or _include_usage(request)
            events = _events(anthropic, prompt, completion, with_usage)
            await _send(send, 200, [_SSE, *headers], b"".join(events))
        else:
            answer = _message(prompt, completion) if anthropic else _completion(prompt, completion)
            await _send(send, 200, [_JSON, *headers], json.dumps(answer).encode())

    async def _refuse(
        self, send: Any, waits: list[float | None], anthropic: bool, now: float
    ) -> None:
        headers = [_JSON, *self._headers(anthropic, now)]
        if any(wait is None for wait in waits):
            self.refused["too_large"] = self.refused.get("too_large", 0) + 1
            headers.append((b"x-should-retry", b"false"))
            reason = "request too large for the rate limit"
        else:
            wait = max(w for w in waits if w is not None)
            names = [n for n, w in zip(self.windows, waits, strict=True) if w and w > 0]
            self.refused[names[0]] = self.refused.get(names[0], 0) + 1
            headers.append((b"retry-after", str(math.ceil(wait)).encode()))
            headers.append((b"retry-after-ms", str(math.ceil(wait * 1000)).encode()))
            reason = f"rate limit reached for {names[0]}"
        error = {"type": "error", "error": {"type": "rate_limit_error", "message": reason}}
        await _send(send, 429, headers, json.dumps(error).encode())

    def _headers(self, anthropic: bool, now: float) -> list[tuple[bytes, bytes]]:
        found: list[tuple[str, str]] = []
        for name, window in self.windows.items():
            reset = window.reset(now)
            if anthropic:
                part = name.replace("_", "-")
                at = datetime.fromtimestamp(math.ceil(self.wall() + reset), UTC)
                values = (window.limit, window.remaining(now), at.strftime("%Y-%m-%dT%H:%M:%SZ"))
                found += [(f"anthropic-ratelimit-{part}-{f}", str(v)) for f, v in _zip3(values)]
            elif name in ("tokens", "requests"):
                values = (window.limit, window.remaining(now), go_duration(reset))
                found += [(f"x-ratelimit-{f}-{name}", str(v)) for f, v in _zip3(values)]
        return [(k.encode(), v.encode()) for k, v in found]


def _zip3(values: tuple[object, object, object]) -> zip[tuple[str, object]]:
    return zip(("limit", "remaining", "reset"), values, strict=True)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _include_usage(request: dict[str, Any]) -> bool:
    options = request.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _completion(prompt: int, completion: int) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {**usage, "total_tokens": prompt + completion},
    }


def _message(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "fake",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    }


def _events(anthropic: bool, prompt: int, completion: int, with_usage: bool) -> list[bytes]:
    if anthropic:
        start = {**_message(prompt, 1), "content": [], "stop_reason": None}
        steps = [
            ("message_start", {"type": "message_start", "message": start}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": "ok"}}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                               "usage": {"output_tokens": completion}}),
            ("message_stop", {"type": "message_stop"}),
        ]  # fmt: skip
        return [f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in steps]
    chunk: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk"}
    if with_usage:
        chunk["usage"] = None
    deltas = [{"role": "assistant", "content": ""}, {"content": "o"}, {"content": "k"}]
    chunks = [{**chunk, "choices": [{"index": 0, "delta": d}]} for d in deltas]
    chunks.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if with_usage:
        usage = _completion(prompt, completion)["usage"]
        chunks.append({**chunk, "choices": [], "usage": usage})
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


async def _send(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tpm", type=int, default=60_000, help="tokens a window")
    parser.add_argument("--rpm", type=int, default=500, help="requests a window")
    parser.add_argument("--itpm", type=int, default=None, help="input tokens a window")
    parser.add_argument("--otpm", type=int, default=None, help="output tokens a window")
    parser.add_argument("--completion-share", type=float, default=1.0)
    parser.add_argument("--default-max-tokens", type=int, default=256)
    parser.add_argument("--base-ms", type=float, default=20.0, help="service time")
    parser.add_argument("--us-per-token", type=float, default=0.0, help="and more a token")
    parser.add_argument("--window-seconds", type=float, default=60.0)
    parser.add_argument("--meter", choices=("sliding", "bucket"), default="sliding")
    args = parser.parse_args()
    if not (0 <= args.completion_share <= 1 and args.window_seconds > 0):
        parser.error("--completion-share must be in [0, 1] and --window-seconds > 0")
    import uvicorn

    app = FakeProvider(
        args.tpm,
        args.rpm,
        input_tokens_per_minute=args.itpm,
        output_tokens_per_minute=args.otpm,
        completion_share=args.completion_share,
        default_max_tokens=args.default_max_tokens,
        base_seconds=args.base_ms / 1e3,
        seconds_per_token=args.us_per_token / 1e6,
        window_seconds=args.window_seconds,
        meter=args.meter,
    )
    uvicorn.run(
        app, host="127.0.0.1", port=args.port, lifespan="off", log_level="error", access_log=False
    )


if __name__ == "__main__":
    main()
