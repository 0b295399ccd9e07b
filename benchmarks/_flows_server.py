"""The server of benchmarks/flows.py's middleware part: uvicorn (httptools, uvloop, one
process) on 127.0.0.1, a plain Starlette app whose `GET /work?ms=N` sleeps N ms, limited by
ConcurrencyLimitMiddleware to 16 at a time (queue unbounded, 60 s queue timeout).

    python -m benchmarks._flows_server --config flows|fifo --port P [--source TREE] [--info F]

`flows`: the route limit takes each request's flow from its `x-flow` header
(`RouteLimit(flow="header:x-flow")`); `fifo`: the same route limit without `flow` (one FIFO).
benchmarks/flows.py starts it under `taskset -c 0`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
from pathlib import Path
from typing import Any

from benchmarks._source import PROJECT_ROOT, loaded_files, use_source_tree

LIMIT = 16
CONFIGS = ("flows", "fifo")
FLOW_SETTING = "header:x-flow"


def make_app(config: str, limit: int = LIMIT) -> Any:
    from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings
    from gym_concurrency.middleware.settings import RouteLimit
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    async def work(request: Request) -> Response:
        await asyncio.sleep(int(request.query_params.get("ms", "0")) / 1000)
        return PlainTextResponse("ok")

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[Route("/work", work, methods=["GET"]), Route("/healthz", healthz)],
    )
    route: dict[str, Any] = {
        "path": "/work",
        "limit_name": "work",
        "max_concurrent": limit,
        "queue_timeout_seconds": 60,
    }
    if config == "flows":
        if "flow" not in RouteLimit.model_fields:
            raise SystemExit("this tree's RouteLimit has no `flow` field yet")
        route["flow"] = FLOW_SETTING
    settings = ConcurrencySettings(routes=[RouteLimit(**route)])
    return ConcurrencyLimitMiddleware(app, settings=settings)


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

    import uvicorn

    app = make_app(args.config)
    if args.info:
        info = {
            "config": args.config,
            "python": sys.version.split()[0],
            "uvicorn": uvicorn.__version__,
            "gym_concurrency_files": loaded_files(root),
        }
        Path(args.info).write_text(json.dumps(info, indent=1))
    uvicorn.run(
        app,
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
