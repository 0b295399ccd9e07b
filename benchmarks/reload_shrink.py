"""Issue 33's reload-shrink run: a flood of weighted requests through a real uvicorn server, a
settings reload mid-flood that shrinks the route's limit below the heaviest requests, and how
the queue drains.

Server: uvicorn (a thread of this process) serving POST /run, which sleeps 10 ms, behind the
middleware: weight `json:cost`, flows by `x-tenant`, max_concurrent 16; `global` runs the
route's limit with scope "global" on a redis-server of the run's own. Load: 48 closed-loop
clients (httpx), each request's cost drawn from 1, 2, 4, 8, 16 (seeded), tenants t0..t3. At
`--shrink-at` s the settings are reloaded with max_concurrent 4 (POST /reload, which runs
`reload_settings` on the server's loop); at `--seconds` the clients stop sending, and the run
waits at most `--bound` s for the requests still in flight. Reported per scope: requests
answered before and after the reload (and per second after it), requests unanswered at the
bound, the drain (seconds from the clients' stop to the last answer; the bound if some never
came) and the limit's `admission_capped`.

    .venvs/3.11/bin/python -m benchmarks.reload_shrink [--source TREE] [--scopes process,global]

`--source` measures another checkout's library (benchmarks/_source.py); the "before" figures
in docs/performance.md are from `git archive eb16860 | tar -x -C /tmp/before`, then
`--source /tmp/before --label before`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._source import describe_tree, loaded_files, use_source_tree

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SIZE, SHRUNK = 16, 4
CLIENTS = 48
COSTS = (1, 2, 4, 8, 16)
TENANTS = 4


def make_app(scope: str, redis_url: str | None) -> Any:
    """The served app: POST /run (10 ms) limited by weight and flow; POST /reload?size=N."""
    from fastapi import FastAPI
    from gym_concurrency.middleware import (
        ConcurrencyLimitMiddleware,
        ConcurrencySettings,
        RouteLimit,
        reload_settings,
    )

    def settings(size: int) -> Any:
        route = RouteLimit(
            path="/run",
            limit_name="runs",
            max_concurrent=size,
            weight="json:cost",
            flow="header:x-tenant",
            scope=scope,
        )
        key = f"reload-shrink-{time.monotonic_ns()}" if scope == "global" else "reload_shrink"
        return ConcurrencySettings(component=key, routes=[route], redis_url=redis_url)

    first = settings(SIZE)
    app = FastAPI()

    @app.post("/run")
    async def run() -> dict[str, bool]:
        await asyncio.sleep(0.01)
        return {"ok": True}

    @app.post("/reload")
    async def reload(size: int) -> dict[str, list[str]]:
        again = settings(size).model_copy(update={"component": first.component})
        return {"changes": reload_settings(app, again)}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=first)
    return app


class Server:
    """uvicorn serving `app` on 127.0.0.1 in a thread."""

    def __init__(self, app: Any) -> None:
        import socket

        import uvicorn

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise SystemExit("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


async def flood(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The load, the reload and the drain against the server at `url`."""
    import httpx

    rng = random.Random(33)
    answers: list[tuple[float, int]] = []  # (when, status)
    started = time.monotonic()
    stop_at = started + args.seconds
    shrink_at = started + args.shrink_at

    async def client(n: int, http: httpx.AsyncClient) -> None:
        while time.monotonic() < stop_at:
            cost = rng.choice(COSTS)
            headers = {"x-tenant": f"t{n % TENANTS}"}
            response = await http.post(url + "/run", json={"cost": cost}, headers=headers)
            answers.append((time.monotonic(), response.status_code))

    limits = httpx.Limits(max_connections=CLIENTS + 4, max_keepalive_connections=CLIENTS + 4)
    async with httpx.AsyncClient(timeout=args.bound + 60, limits=limits) as http:
        clients = [asyncio.ensure_future(client(n, http)) for n in range(CLIENTS)]
        await asyncio.sleep(max(0.0, shrink_at - time.monotonic()))
        reloaded = await http.post(url + "/reload", params={"size": SHRUNK})
        reloaded.raise_for_status()
        reload_at = time.monotonic()
        await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
        _, pending = await asyncio.wait(clients, timeout=args.bound)
        for task in pending:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    before = [a for a in answers if a[0] <= reload_at]
    after = [a for a in answers if a[0] > reload_at]
    last = max((when for when, _ in answers), default=stop_at)
    return {
        "changes": reloaded.json()["changes"],
        "answered_before_reload": len(before),
        "answered_after_reload": len(after),
        "after_reload_per_s": round(len(after) / max(1e-9, stop_at - reload_at), 1),
        "statuses": sorted({status for _, status in answers}),
        "unanswered_at_bound": len(pending),
        "drain_s": round(args.bound if pending else max(0.0, last - stop_at), 3),
    }


def run_scope(scope: str, args: argparse.Namespace) -> dict[str, Any]:
    redis = None
    if scope == "global":
        from benchmarks._shared_cost_redis import LocalRedis

        redis = LocalRedis(None)
        redis.wait_older_than(4)  # (a limit's first state on a young Redis starts a grace)
    try:
        app = make_app(scope, None if redis is None else redis.url)
        with Server(app) as server:
            row = asyncio.run(flood(server.url, args))
            middleware = app.state.gym_concurrency
            limit = middleware.limits.routes[0].limit
            row["admission_capped"] = getattr(limit, "admission_capped", None)
            row["limit_after"] = limit.limit
    finally:
        if redis is not None:
            redis.stop()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", help="a source tree to measure instead of this one")
    parser.add_argument("--scopes", default="process,global")
    parser.add_argument("--seconds", type=float, default=5.0, help="clients send until then")
    parser.add_argument("--shrink-at", type=float, default=2.0)
    parser.add_argument("--bound", type=float, default=15.0, help="wait at most this for the rest")
    parser.add_argument("--label", default="after")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the summary goes")
    args = parser.parse_args()
    root = use_source_tree(args.source) if args.source else ROOT
    rows = {scope: run_scope(scope, args) for scope in args.scopes.split(",")}
    loaded_files(root)  # fails if any module came from elsewhere
    result = {"label": args.label, "tree": describe_tree(root), "scopes": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    summary = args.out / f"reload-shrink-{args.label}.summary.json"
    summary.write_text(json.dumps(result, indent=2) + "\n")
    tree = result["tree"]["commit"][:7] or root  # type: ignore[index]
    print(f"reload-shrink ({args.label}, {tree}): limit {SIZE} -> {SHRUNK} at {args.shrink_at} s, "
          f"{CLIENTS} clients until {args.seconds} s")  # fmt: skip
    print("| scope | answered before / after reload | after, /s | unanswered at bound | drain s "
          "| capped |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for scope, row in rows.items():
        print(
            f"| {scope} | {row['answered_before_reload']} / {row['answered_after_reload']} | "
            f"{row['after_reload_per_s']} | {row['unanswered_at_bound']} | {row['drain_s']} | "
            f"{row['admission_capped']} |"
        )


if __name__ == "__main__":
    main()
