"""A Fetch that answers what the test says (a /metrics body, or an error to raise), counts its
calls and can be held so that a scrape stays in flight: for the signal's own logic, which
the real fetch's tests (test_fetch.py) and the fake engine's (test_engine_burst.py) do not
reach as precisely."""

from __future__ import annotations

import asyncio
import itertools

_URLS = itertools.count()


def engine_url() -> str:
    """A URL no other test follows (a process has one poller per URL)."""
    return f"http://engine-{next(_URLS)}.test/metrics"


def vllm(waiting: float, cache: float | None = None, running: float | None = None) -> str:
    """A vLLM /metrics body with these gauges (None: left out)."""
    labels = '{engine="0",model_name="m"}'
    body = f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{labels} {waiting}\n"
    if cache is not None:
        body += f"vllm:kv_cache_usage_perc{labels} {cache}\n"
    if running is not None:
        body += f"vllm:num_requests_running{labels} {running}\n"
    return body


class Bodies:
    """fetch(url, timeout_seconds, max_bytes): `body`, or raises `error`; while `held` is
    set, each call waits until it is cleared (`release()`)."""

    def __init__(self, body: str | bytes = vllm(0)) -> None:
        self.body = body
        self.error: BaseException | None = None
        self.calls = 0
        self.in_flight = 0
        self._gate = asyncio.Event()
        self._gate.set()

    def hold(self) -> None:
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    async def __call__(self, url: str, timeout_seconds: float, max_bytes: int) -> bytes:
        self.calls += 1
        self.in_flight += 1
        try:
            await self._gate.wait()
        finally:
            self.in_flight -= 1
        if self.error is not None:
            raise self.error
        return self.body.encode() if isinstance(self.body, str) else self.body
