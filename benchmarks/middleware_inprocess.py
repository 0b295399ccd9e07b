"""Per-request cost in process of a limited (never binding) route vs the same app without the
middleware, through the ASGI interface (no network). Cases run interleaved in rounds; each
figure is the median of per-round ratios to the bare app (see benchmarks/_timing.py).

    .venv/bin/python benchmarks/middleware_inprocess.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from benchmarks._timing import Case, Settings, compare, format_ns, now_ns

TARGET = 1.05
SETTINGS = ConcurrencySettings(
    component="benchmark",
    routes=[
        RouteLimit(
            path="/run",
            limit_name="episodes",
            max_concurrent=1_000_000,
            queue_timeout_seconds=30,
        )
    ],
)
SCOPE = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/run",
    "raw_path": b"/run",
    "root_path": "",
    "query_string": b"",
    "headers": [(b"host", b"bench")],
    "server": ("bench", 80),
    "client": ("127.0.0.1", 1),
}


def make_app(limited: bool, meter_provider: Any = None) -> FastAPI:
    """The same app with or without the middleware; /run comes after 20 other routes."""
    app = FastAPI()

    async def run() -> dict[str, bool]:
        return {"ok": True}

    for n in range(20):
        app.add_api_route(f"/other/{n}/{{item}}", run, methods=["GET"], name=f"other{n}")
    app.add_api_route("/run", run, methods=["POST"])
    if limited:
        app.add_middleware(
            ConcurrencyLimitMiddleware, settings=SETTINGS, meter_provider=meter_provider
        )
    return app


def driver(app: Any, scope: dict[str, Any] = SCOPE, body: bytes = b"") -> Any:
    """run(n): n sequential calls of `scope` (POST /run) with `body` through `app`; returns
    the ns they took. Every one must answer 200."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def run(n: int) -> int:
        statuses.clear()
        started = now_ns()
        for _ in range(n):
            await app(dict(scope), receive, send)
        elapsed = now_ns() - started
        assert statuses == [200] * n, "every request must succeed"
        return elapsed

    return run


async def main(quick: bool) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    cases = [
        Case("without middleware", driver(make_app(False))),
        Case("limited, not binding", driver(make_app(True))),
        Case("limited, recording to an SDK provider", driver(make_app(True, provider))),
    ]
    settings = Settings.quick() if quick else Settings()
    comparison = await compare(
        "Middleware per-request cost in process", cases, settings, unit="request"
    )
    for case in cases:
        name = case.name
        ratios = comparison.ratios[name]
        print(
            f"{name:40s} {format_ns(comparison.median_ns(name)):>10s}/request  "
            f"ratio {comparison.ratio(name):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        )
    verdict = "met" if comparison.ratio("limited, not binding") <= TARGET else "NOT met"
    print(f"target <= {TARGET}x for 'limited, not binding': {verdict}")
    provider.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few short rounds (smoke test)")
    asyncio.run(main(parser.parse_args().quick))
