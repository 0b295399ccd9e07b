"""CPU the middleware adds to a request that waits in the queue, over one admitted at once, with
nothing else in the way: a bare ASGI app behind ConcurrencyLimitMiddleware (limit 64, queue for
everyone), a receive that behaves as uvicorn's does (the body at once, then a read that parks
until the response is complete), under uvloop (the standard loop without the bench extra).

    .venvs/3.11/bin/python -m benchmarks.queued_bare [--baseline /tmp/before] [--rounds 8]
        [--queued 960] [--json benchmarks/results/queued-bare-LABEL.json]

*direct*: N requests through 64 clients one after another, each admitted at once. *queued*: 64
requests hold the slots, N more arrive and wait, then all are served. Extra CPU of a queued
request = (queued - direct) / N, per round; each round runs both cases in a fresh process, once
with the cyclic garbage collector off (the code's own cost) and once on (what it adds to the
collector's work, which grows with the live objects a waiting request keeps). With
`--baseline`, every round runs the baseline tree's library too, in the same round, and the
figures come with their ratio to it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._source import PROJECT_ROOT, describe_tree, use_source_tree
from benchmarks.queued_inprocess import scope_for

LIMIT = 64
BODY = b'{"episode_id":"e1","task":{"task_id":"t1","prompt":"The answer is 42"}}'
SCOPE = scope_for(BODY)  # the overload app's request, as queued_inprocess.py sends it


class Cycle:
    """uvicorn's RequestResponseCycle, its receive and send only: the body at once, then a
    read that parks until the response is complete and then answers http.disconnect."""

    __slots__ = ("complete", "event", "read")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.complete = False
        self.read = False

    async def receive(self) -> dict[str, Any]:
        if not self.read:
            self.read = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        if not self.complete:
            await self.event.wait()
            self.event.clear()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
            self.event.set()


async def bare_app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await scope["gate"]
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def middleware() -> tuple[Any, Any]:
    """The middleware around the bare app, and the app whose routes it compiles."""
    from fastapi import FastAPI
    from gym_concurrency.middleware import (
        ConcurrencyLimitMiddleware,
        ConcurrencySettings,
        RouteLimit,
    )

    routes = FastAPI()
    routes.add_api_route("/run", lambda: None, methods=["POST"])
    route = RouteLimit(
        path="/run", methods=("POST",), limit_name="episodes", max_concurrent=LIMIT,
        queue_timeout_seconds=600.0, max_queue=None,
    )  # fmt: skip
    settings = ConcurrencySettings(component="bench", routes=[route])
    return ConcurrencyLimitMiddleware(bare_app, settings=settings), routes


async def one(app: Any, routes: Any, gate: asyncio.Future[None]) -> None:
    cycle = Cycle()
    await app({**SCOPE, "app": routes, "gate": gate}, cycle.receive, cycle.send)
    if not cycle.complete:
        raise AssertionError("a request ended without its response")


async def direct(app: Any, routes: Any, n: int) -> float:
    """CPU ns per request, every one admitted at once."""
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)
    per_client = n // LIMIT

    async def client() -> None:
        for _ in range(per_client):
            await asyncio.ensure_future(one(app, routes, done))

    started = time.process_time_ns()
    await asyncio.gather(*(client() for _ in range(LIMIT)))
    return (time.process_time_ns() - started) / (per_client * LIMIT)


async def queued(app: Any, routes: Any, n: int) -> float:
    """CPU ns of the LIMIT holders and the n requests waiting behind them, together."""
    loop = asyncio.get_running_loop()
    hold = loop.create_future()
    started = time.process_time_ns()
    holders = [asyncio.ensure_future(one(app, routes, hold)) for _ in range(LIMIT)]
    for _ in range(5):
        await asyncio.sleep(0)
    done = loop.create_future()
    done.set_result(None)
    waiting = [asyncio.ensure_future(one(app, routes, done)) for _ in range(n)]
    for _ in range(5):
        await asyncio.sleep(0)
    hold.set_result(None)
    await asyncio.gather(*holders, *waiting)
    return time.process_time_ns() - started


async def measure(n: int, repeats: int) -> dict[str, float]:
    app, routes = middleware()
    await direct(app, routes, 640)  # warm: routes compiled, code paths run
    await queued(app, routes, 640)
    result: dict[str, float] = {}
    for collector in ("off", "on"):
        gc.collect()
        (gc.disable if collector == "off" else gc.enable)()
        extras = []
        for _ in range(repeats):
            together = await queued(app, routes, n)
            each = await direct(app, routes, n)
            extras.append((together - LIMIT * each) / n - each)  # the holders ran as direct
        result[f"extra_ns_gc_{collector}"] = statistics.median(extras)
    gc.enable()
    return result


def worker(source: str, n: int, repeats: int) -> None:
    use_source_tree(source)
    try:
        import uvloop
    except ImportError:  # without the bench extra: the standard loop, and the JSON says so
        figures, loop = asyncio.run(measure(n, repeats)), "asyncio"
    else:
        figures, loop = uvloop.run(measure(n, repeats)), "uvloop"
    print(json.dumps({"loop": loop, **figures}))


def run_round(source: Path, n: int, repeats: int, python: str) -> dict[str, Any]:
    command = [python, "-m", "benchmarks.queued_bare", "--worker", str(source)]
    command += ["--queued", str(n), "--repeats", str(repeats)]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the worker for {source} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", default=str(PROJECT_ROOT))
    parser.add_argument("--baseline", default=None, help="another source tree, same rounds")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="measurements per round")
    parser.add_argument("--queued", type=int, default=960, help="requests waiting at once")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.queued, args.repeats)
        return
    trees = {"this": Path(args.source).resolve()}
    if args.baseline:
        trees["baseline"] = Path(args.baseline).resolve()
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    loops = set()
    for _ in range(args.rounds):
        for name, tree in trees.items():
            figures = run_round(tree, args.queued, args.repeats, args.python)
            loops.add(figures.pop("loop"))
            rounds[name].append(figures)
    summary = summarize(rounds)
    for line in report(summary, args.queued):
        print(line)
    if args.json:
        record = {
            "benchmark": "queued_bare",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": python_version(args.python),
            "queued": args.queued,
            "loop": sorted(loops),
            "trees": {name: describe_tree(tree) for name, tree in trees.items()},
            "summary": summary,
            "rounds": rounds,
        }
        Path(args.json).write_text(json.dumps(record, indent=1))


def python_version(python: str) -> str:
    command = [python, "-c", "import sys; print(sys.version.split()[0])"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def summarize(rounds: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Medians per tree; with a baseline, the median of the per-round ratios to it."""
    summary: dict[str, Any] = {}
    for name, results in rounds.items():
        summary[name] = {k: statistics.median(r[k] for r in results) for k in results[0]}
    if "baseline" in rounds:
        pairs = list(zip(rounds["this"], rounds["baseline"], strict=True))
        summary["ratio"] = {
            k: statistics.median(this[k] / base[k] for this, base in pairs) for k in pairs[0][0]
        }
    return summary


def report(summary: dict[str, Any], n: int) -> list[str]:
    lines = [f"Extra CPU of a queued request over a direct one ({n} waiting), median of rounds:"]
    for name in ("baseline", "this"):
        if name in summary:
            s = summary[name]
            lines.append(
                f"  {name:8}  collector off {s['extra_ns_gc_off'] / 1000:5.1f} us   "
                f"on {s['extra_ns_gc_on'] / 1000:5.1f} us"
            )
    if "ratio" in summary:
        r = summary["ratio"]
        lines.append(
            f"  this / baseline: off {r['extra_ns_gc_off']:.2f}x   on {r['extra_ns_gc_on']:.2f}x"
        )
    return lines


if __name__ == "__main__":
    main()
