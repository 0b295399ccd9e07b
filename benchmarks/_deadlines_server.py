"""One benchmark server for benchmarks/deadlines.py: uvicorn (httptools, uvloop, one process)
on 127.0.0.1, a Starlette app whose `GET /work` sleeps 100 ms, limited by
ConcurrencyLimitMiddleware to 16 at a time with `queue_timeout_seconds=2`.

    python -m benchmarks._deadlines_server --config deadline|no-deadline --port P \
        [--source TREE] [--info F]

`deadline`: the route limit reads the caller's milliseconds left from `x-deadline-ms`
(`RouteLimit(deadline="header:x-deadline-ms")`); `no-deadline`: the same route without it
(a queued request waits up to its 2 s queue timeout). Everything else is the middleware's
defaults (a refusal is a 503 problem with `Connection: close`).

What the app records, for benchmarks/deadlines.py to read from `GET /stats` (not limited)
once the load has ended:

- every request the handler ran: the caller's send time and deadline (headers `x-sent-at`,
  `x-caller-deadline`: `time.monotonic()` of the load generator, the same clock as this
  process's on Linux), `time.monotonic()` on entry, the loop time on entry and the deadline
  the middleware left in `request.state` (loop time; None without a deadline), and how long
  the handler took;
- every response of `/work`, from an ASGI wrapper outside the middleware: the send time,
  when the request reached the app (the wrapper) and when its response started, and the
  status: a refusal's time in the server.

benchmarks/deadlines.py starts it under `taskset -c 0`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import resource
import sys
from pathlib import Path
from time import monotonic
from typing import Any

from benchmarks._source import PROJECT_ROOT, loaded_files, use_source_tree

LIMIT = 16
SERVICE_S = 0.100
QUEUE_TIMEOUT_S = 2.0
DEADLINE_HEADER = "x-deadline-ms"
# "deadline-keepalive": refusals keep the connection (close_connection_on_refusal=False), so
# a refused caller's next request needs no new connection (at 16x, accepting them is the bound)
CONFIGS = ("deadline", "deadline-keepalive", "no-deadline")
STATE_KEY = "gym_concurrency.deadline"  # middleware.admission.DEADLINE_STATE_KEY


def _header(scope: dict[str, Any], name: bytes) -> float | None:
    for key, value in scope["headers"]:
        if key == name:
            try:
                return float(value)
            except ValueError:
                return None
    return None


class Records:
    """What the app saw, kept in memory until `GET /stats` reads it."""

    def __init__(self) -> None:
        # (sent, caller_deadline, entry monotonic, entry loop time, state deadline, service)
        self.admitted: list[tuple[float | None, ...]] = []
        # (sent, reached the app, response started, status)
        self.responses: list[tuple[float | None, float, float, int]] = []

    def as_json(self) -> bytes:
        return json.dumps({"admitted": self.admitted, "responses": self.responses}).encode()


def make_app(config: str, records: Records) -> Any:
    from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings
    from gym_concurrency.middleware.settings import RouteLimit
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    async def work(request: Request) -> Response:
        entry = monotonic()
        entry_loop = asyncio.get_running_loop().time()
        state = request.scope.get("state") or {}
        await asyncio.sleep(SERVICE_S)
        scope: dict[str, Any] = request.scope  # type: ignore[assignment]
        records.admitted.append(
            (
                _header(scope, b"x-sent-at"),
                _header(scope, b"x-caller-deadline"),
                entry,
                entry_loop,
                state.get(STATE_KEY),
                monotonic() - entry,
            )
        )
        return PlainTextResponse("ok")

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def stats(request: Request) -> Response:
        return Response(records.as_json(), media_type="application/json")

    app = Starlette(
        routes=[
            Route("/work", work, methods=["GET"]),
            Route("/healthz", healthz),
            Route("/stats", stats),
        ],
    )
    route: dict[str, Any] = {
        "path": "/work",
        "limit_name": "work",
        "max_concurrent": LIMIT,
        "queue_timeout_seconds": QUEUE_TIMEOUT_S,
    }
    if config in ("deadline", "deadline-keepalive"):
        if "deadline" not in RouteLimit.model_fields:
            raise SystemExit("this tree's RouteLimit has no `deadline` field yet")
        route["deadline"] = f"header:{DEADLINE_HEADER}"
    settings = ConcurrencySettings(
        component="benchmark",
        routes=[RouteLimit(**route)],
        close_connection_on_refusal=config != "deadline-keepalive",
    )
    limited = ConcurrencyLimitMiddleware(app, settings=settings)

    async def recorded(scope: Any, receive: Any, send: Any) -> None:
        """Outside the middleware: when each /work request reached the app, and when and
        with which status its response started."""
        if scope["type"] != "http" or scope["path"] != "/work":
            await limited(scope, receive, send)
            return
        arrived = monotonic()
        sent = _header(scope, b"x-sent-at")

        async def send_recording(message: Any) -> None:
            if message["type"] == "http.response.start":
                records.responses.append((sent, arrived, monotonic(), message["status"]))
            await send(message)

        await limited(scope, receive, send_recording)

    return recorded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", choices=CONFIGS, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--source", default=str(PROJECT_ROOT))
    parser.add_argument("--info", default=None)
    args = parser.parse_args()
    root = use_source_tree(args.source)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    import starlette
    import uvicorn

    app = make_app(args.config, Records())
    if args.info:
        info = {
            "config": args.config,
            "python": sys.version.split()[0],
            "uvicorn": uvicorn.__version__,
            "uvloop": _version("uvloop"),
            "httptools": _version("httptools"),
            "starlette": starlette.__version__,
            "gym_concurrency_files": loaded_files(root),
        }
        Path(args.info).write_text(json.dumps(info, indent=1))
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="auto",  # uvloop and httptools where installed (the `bench` extra)
        http="auto",
        lifespan="on",
        log_level="error",
        access_log=False,
        backlog=4096,
    )


def _version(name: str) -> str | None:
    """The installed version of `name`, or None (the recorded runs had it)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
