"""A fake self-hosted engine, for engine signals (gym_concurrency.engines): batch capacity B,
a waiting queue beyond it, a KV cache, and a real `/metrics` in vLLM's exposition.

`POST /v1/chat/completions` is priced in tokens as `_tokens_upstream.price` prices it (prompt
characters / 4 + `max_tokens`). It runs at once if fewer than `--batch` requests run and its
tokens fit the KV cache (`--kv-tokens`; a request alone always fits), else it waits, FIFO, as
vLLM's scheduler holds it in its waiting queue; it runs for `--service-ms`, then answers a
chat completion with its usage. With `--service-spread S` each run lasts the service time x
U(1 - S, 1 + S) (seeded draws), so that runs end apart as a real engine's do. KV-cache
usage is the running requests' tokens / the cache.

`GET /metrics` is vLLM's exposition, rendered by prometheus_client as vLLM renders it, with the
same names, TYPE lines and labels (`model_name`, `engine`): `vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (with `--legacy-names`,
`vllm:gpu_cache_usage_perc` instead, as vLLM up to 0.8), the counter `vllm:request_success`
and the histogram `vllm:e2e_request_latency_seconds`. Each scrape is recorded (its time,
waiting, running, batch utilisation = running / B, cache usage).

`GET /stats` (JSON): `t` (time.monotonic(), the clock of every process here), the batch size,
requests served, the most ever waiting and running, `busy_seconds` (running / B integrated
over time, exactly: at every change) and the scrapes (the last 100,000).

    python -m benchmarks._fake_engine --port P [--batch 64] [--service-ms 200]
        [--service-spread 0] [--kv-tokens 131072] [--model-name fake] [--legacy-names]

Plain ASGI on uvicorn, 127.0.0.1 only. It does not import gym_concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import random
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from benchmarks._asgi import read_body
from benchmarks._tokens_upstream import price

_JSON = [(b"content-type", b"application/json")]
_TEXT = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0)
LABELS = ["model_name", "engine"]  # vLLM's, in its order
SCRAPES_KEPT = 100_000


class FakeEngine(Collector):
    """The engine's state, its ASGI app (`__call__`) and its /metrics collector."""

    def __init__(
        self,
        batch: int = 64,
        service_seconds: float = 0.2,
        kv_tokens: int = 131_072,
        model_name: str = "fake",
        legacy_names: bool = False,
        service_spread: float = 0.0,
    ) -> None:
        self.batch, self.service_seconds, self.kv_tokens = batch, service_seconds, kv_tokens
        # Each run lasts service_seconds x U(1 - spread, 1 + spread), the draws seeded: as a
        # real engine's do with their output lengths, runs end apart (0: all alike).
        self.service_spread = service_spread
        self._draws = random.Random(0)
        self.model_name, self.legacy_names = model_name, legacy_names
        self.running = 0
        self.running_tokens = 0
        self.waiting: deque[tuple[asyncio.Future[None], int]] = deque()
        self.served = 0
        self.max_waiting = 0
        self.max_running = 0
        self.busy_seconds = 0.0
        self.last = time.monotonic()
        self.scrapes: deque[dict[str, float]] = deque(maxlen=SCRAPES_KEPT)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        ).labels(model_name, "0")

    # --- the engine ------------------------------------------------------------------

    def _advance(self) -> None:
        now = time.monotonic()
        self.busy_seconds += self.running / self.batch * (now - self.last)
        self.last = now

    def _fits(self, tokens: int) -> bool:
        if self.running >= self.batch:
            return False
        return self.running == 0 or self.running_tokens + tokens <= self.kv_tokens

    def _start(self, tokens: int) -> None:
        self._advance()
        self.running += 1
        self.running_tokens += tokens
        self.max_running = max(self.max_running, self.running)

    def _finish(self, tokens: int) -> None:
        self._advance()
        self.running -= 1
        self.running_tokens -= tokens
        while self.waiting and self._fits(self.waiting[0][1]):
            future, waiting_tokens = self.waiting.popleft()
            if not future.done():  # (a cancelled waiter is skipped)
                self._start(waiting_tokens)  # counted before it resumes: counts stay exact
                future.set_result(None)

    def _service(self) -> float:
        """How long the next run lasts (see `service_spread`)."""
        return run_seconds(self._draws, self.service_seconds, self.service_spread)

    async def run(self, tokens: int) -> None:
        """Run one request of `tokens`: wait for a batch slot and cache, then the service time."""
        if self.waiting or not self._fits(tokens):
            future = asyncio.get_running_loop().create_future()
            self.waiting.append((future, tokens))
            self.max_waiting = max(self.max_waiting, len(self.waiting))
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._finish(tokens)  # started in the same moment: give the slot on
                elif (future, tokens) in self.waiting:
                    self.waiting.remove((future, tokens))
                raise
        else:
            self._start(tokens)
        started = time.monotonic()
        try:
            await asyncio.sleep(self._service())
        finally:
            self._finish(tokens)
        self.served += 1
        self.latency.observe(time.monotonic() - started)

    # --- /metrics --------------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        labels = [self.model_name, "0"]
        cache = self.running_tokens / self.kv_tokens
        self.scrapes.append(
            {
                "t": time.monotonic(),
                "waiting": len(self.waiting),
                "running": self.running,
                "utilisation": self.running / self.batch,
                "cache_usage": cache,
            }
        )
        yield _gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            self.running,
        )
        yield _gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels,
            len(self.waiting),
        )
        if self.legacy_names:
            name, doc = (
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage.",
            )
        else:
            name, doc = "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        yield _gauge(name, doc, labels, cache)
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*LABELS, "finished_reason"],
        )
        success.add_metric([*labels, "length"], self.served)
        yield success

    def stats(self) -> dict[str, Any]:
        self._advance()
        return {
            "t": self.last,
            "batch": self.batch,
            "served": self.served,
            "running": self.running,
            "waiting": len(self.waiting),
            "max_waiting": self.max_waiting,
            "max_running": self.max_running,
            "busy_seconds": self.busy_seconds,
            "scrapes": list(self.scrapes),
        }

    # --- the app ---------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        path = scope["path"]
        if path == "/metrics":
            await _reply(send, 200, generate_latest(self.registry), _TEXT)
        elif path == "/stats":
            await _reply(send, 200, json.dumps(self.stats()).encode())
        elif path == "/v1/chat/completions" and scope["method"] == "POST":
            await self._complete(send, body)
        else:
            await _reply(send, 404, b"{}")

    async def _complete(self, send: Any, body: bytes) -> None:
        try:
            request = json.loads(body)
            tokens = price(request)
        except (ValueError, TypeError, AttributeError):
            await _reply(send, 400, b'{"error":{"message":"malformed request"}}')
            return
        await self.run(tokens)
        completion = {
            "id": "chatcmpl-fake-engine",
            "object": "chat.completion",
            "model": self.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
        }
        await _reply(send, 200, json.dumps(completion).encode())


def run_seconds(draws: random.Random, service_seconds: float, spread: float) -> float:
    """One run's time: `service_seconds` x U(1 - spread, 1 + spread) from `draws` (a spread
    of 0 draws nothing)."""
    if not spread:
        return service_seconds
    return service_seconds * draws.uniform(1 - spread, 1 + spread)


def ceiling(requests: int, batch: int, service_seconds: float, spread: float) -> float:
    """The batch utilisation no admission can pass for a burst of `requests` (all there at
    once): each run starts the moment a batch slot frees (no hand-off time at all), in FIFO
    order, lasting what the engine would draw for it (the KV cache not binding). Below 1: the
    burst's last runs leave slots idle while they end."""
    draws, free, busy = random.Random(0), [0.0] * batch, 0.0
    for _ in range(requests):
        start = heapq.heappop(free)
        seconds = run_seconds(draws, service_seconds, spread)
        busy += seconds
        heapq.heappush(free, start + seconds)
    end = max(free)
    return busy / (batch * end) if end > 0 else 1.0


def _gauge(name: str, doc: str, labels: list[str], value: float) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, doc, labels=LABELS)
    gauge.add_metric(labels, value)
    return gauge


async def _reply(send: Any, status: int, body: bytes, headers: Any = None) -> None:
    start = {"type": "http.response.start", "status": status, "headers": headers or _JSON}
    await send(start)
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--batch", type=int, default=64, help="requests run at once (B)")
    parser.add_argument("--service-ms", type=float, default=200.0, help="each request's run")
    parser.add_argument("--service-spread", type=float, default=0.0, help="fraction, [0, 1)")
    parser.add_argument("--kv-tokens", type=int, default=131_072, help="the KV cache, tokens")
    parser.add_argument("--model-name", default="fake")
    parser.add_argument("--legacy-names", action="store_true", help="vLLM <= 0.8's cache name")
    args = parser.parse_args()
    if args.batch < 1 or args.kv_tokens < 1 or not 0 <= args.service_ms <= 600_000:
        parser.error("--batch and --kv-tokens must be >= 1, --service-ms in [0, 600000]")
    if not 0 <= args.service_spread < 1:
        parser.error("--service-spread must be in [0, 1)")
    import uvicorn

    service, spread = args.service_ms / 1e3, args.service_spread
    engine = FakeEngine(
        args.batch,
        service,
        args.kv_tokens,
        args.model_name,
        args.legacy_names,
        service_spread=spread,
    )
    uvicorn.run(
        engine,
        host="127.0.0.1",
        port=args.port,
        lifespan="off",
        log_level="error",
        access_log=False,
        backlog=4096,
        # Longer than a test's pauses: a kept-alive connection closed by the server as a
        # client reuses it fails that call (a race no engine signal is about).
        timeout_keep_alive=75,
    )


if __name__ == "__main__":
    main()
