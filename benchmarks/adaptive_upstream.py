"""A fake OpenAI-compatible model with a capacity knee, for benchmarks/adaptive.py only.

Up to K requests in flight each takes the base latency; past K the model thrashes: a request
arriving with c in flight takes base * (c / K) ** 2 (so goodput, c / latency, falls past K),
and one arriving with more than 2K in flight is answered 503 at once (after 2 ms). Each
latency carries lognormal noise (sigma 0.1). `POST /knee?k=N` moves the knee (the benchmark
halves it mid-run); `GET /stats` reports what it saw. Plain asyncio, HTTP/1.1 keep-alive,
127.0.0.1 only:

    python -m benchmarks.adaptive_upstream --port 8301 --knee 32 --base 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

HOST = "127.0.0.1"
_COMPLETION = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"fake-model",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,'
    b'"total_tokens":2}}'
)
_OVERLOADED = (
    b'{"error":{"message":"the model is overloaded","type":"server_error","param":null,'
    b'"code":"overloaded"}}'
)


class Knee:
    """The model's state: its knee, what is in flight, what it answered."""

    def __init__(self, knee: float, base: float, refuse_factor: float, noise: float) -> None:
        self.knee = knee
        self.base = base
        self.refuse_factor = refuse_factor
        self.noise = noise
        self.inflight = 0
        self.max_inflight = 0
        self.answered = {"200": 0, "503": 0}
        self.rng = random.Random(12345)

    def latency(self) -> tuple[float, int]:
        """(seconds, status) for a request arriving now (counted in flight already)."""
        c = self.inflight
        if c > self.refuse_factor * self.knee:
            return 0.002, 503
        x = c / self.knee
        slowdown = x * x if x > 1 else 1.0
        return self.base * slowdown * self.rng.lognormvariate(0.0, self.noise), 200


def _response(status: int, body: bytes) -> bytes:
    reason = b"OK" if status == 200 else b"Service Unavailable"
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        reason,
        len(body),
        body,
    )


async def serve_connection(
    knee: Knee, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if length:
                await reader.readexactly(length)
            if target.startswith("/v1/chat/completions"):
                knee.inflight += 1
                knee.max_inflight = max(knee.max_inflight, knee.inflight)
                try:
                    seconds, status = knee.latency()
                    await asyncio.sleep(seconds)
                finally:
                    knee.inflight -= 1
                knee.answered[str(status)] += 1
                writer.write(_response(status, _COMPLETION if status == 200 else _OVERLOADED))
            elif target.startswith("/knee") and method == "POST":
                knee.knee = float(target.split("k=", 1)[1])
                writer.write(_response(200, json.dumps({"knee": knee.knee}).encode()))
            else:  # GET /stats, anything else
                stats = {
                    "knee": knee.knee,
                    "inflight": knee.inflight,
                    "answered": knee.answered,
                    "max_inflight": knee.max_inflight,
                    "time": time.time(),
                }
                writer.write(_response(200, json.dumps(stats).encode()))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main(port: int, knee: Knee) -> None:
    server = await asyncio.start_server(
        lambda r, w: serve_connection(knee, r, w), HOST, port, backlog=1024
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--knee", type=float, default=32)
    parser.add_argument("--base", type=float, default=0.1, help="seconds below the knee")
    parser.add_argument("--refuse-factor", type=float, default=2.0)
    parser.add_argument("--noise", type=float, default=0.1)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(args.port, Knee(args.knee, args.base, args.refuse_factor, args.noise)))
