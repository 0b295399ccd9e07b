"""CPU per request of the middleware's refusing and queued paths, in process, through the ASGI
interface (no network), on benchmarks/overload_app.py's FastAPI app (10 ms `POST /run`,
`max_concurrent=64`), under uvloop like the overload server.

    .venvs/3.11/bin/python -m benchmarks.queued_inprocess [--quick] [--source /tmp/before]
        [--json benchmarks/results/queued-inprocess-LABEL.json]

Two comparisons, each run without and with an SDK MeterProvider exporting (every 1 s, to an
exporter that drops the data; set as the global provider as well, as in the overload server,
so FastAPI's own request metrics are recorded too), cases interleaved in rounds by
benchmarks/_timing.py; every figure is CPU time (`time.process_time_ns`), so the 10 ms the
handler sleeps costs only what the event loop spends on it:

1. Refused vs served. *served 200*: 64 clients each sending its requests one after another on
   the `max_queue=0` app with free slots (every request admitted at once and run, 64 at a
   time). *refused*: the same app with its 64 slots held by requests whose body has not
   arrived yet, so each request is answered at once with the queue-full response (the
   `problem` profile's 503, or the `episode` profile's 200 failure row that echoes the
   request's ids), sent one after another. Target: refused <= 0.2x served (median of
   per-round ratios).
2. Queued then admitted vs direct, on the queue-for-everyone app (`max_queue=None`, 600 s
   timeout). Both cases first hold the 64 slots with 64 requests whose body is late, then
   release them (the body arrives). *queued*: N requests are sent while the slots are held,
   so every one waits in the queue, and is admitted as the holders and then the others
   finish. *direct*: once the holders are done, the same N requests go through 64 clients one
   after another, every one admitted at once. Extra CPU of a queued request = (queued -
   direct) / N, the median over rounds of the per-round difference. Target: <= 25 us.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._source import PROJECT_ROOT, describe_tree, loaded_files, use_source_tree
from benchmarks._timing import Case, Comparison, Settings, compare, format_ns

REFUSED_TARGET = 0.2
QUEUED_EXTRA_TARGET_NS = 25_000
CLIENTS = 64  # = MAX_CONCURRENT: the served cases never wait
MIN_QUEUED = 20 * CLIENTS  # requests per run of the queued / direct cases

Result = tuple[int, bytes]


def scope_for(body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/run",
        "raw_path": b"/run",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"bench"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "server": ("bench", 80),
        "client": ("127.0.0.1", 1),
    }


class Driver:
    """Sends ASGI requests to one app; `gate` (if given) holds back a request's body."""

    def __init__(self, app: Any, body: bytes) -> None:
        self.app = app
        self.body = body
        self.scope = scope_for(body)
        self.never = asyncio.Event()  # a client that stays connected and sends nothing more

    async def call(self, out: list[Result], gate: asyncio.Event | None = None) -> None:
        delivered = False
        body = self.body
        never = self.never

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if delivered:
                await never.wait()
            if gate is not None:
                await gate.wait()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        status = 0
        chunks: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(dict(self.scope), receive, send)
        out.append((status, b"".join(chunks)))

    async def clients(self, n: int, out: list[Result], task_each: bool = False) -> None:
        """n requests through CLIENTS clients, each sending one after another."""

        async def client(count: int) -> None:
            for _ in range(count):
                if task_each:
                    await asyncio.create_task(self.call(out))
                else:
                    await self.call(out)

        share, extra = divmod(n, CLIENTS)
        await asyncio.gather(*(client(share + (i < extra)) for i in range(CLIENTS)))

    async def hold(self, out: list[Result]) -> tuple[asyncio.Event, list[asyncio.Task[None]]]:
        """Take every slot with CLIENTS requests whose body waits for the returned gate."""
        gate = asyncio.Event()
        holders = [asyncio.create_task(self.call(out, gate)) for _ in range(CLIENTS)]
        for _ in range(5):  # each reaches the handler's body read, holding its slot
            await asyncio.sleep(0)
        return gate, holders


def expect(results: list[Result], n: int, kind: str) -> None:
    if len(results) != n:
        raise AssertionError(f"{kind}: {len(results)} responses for {n} requests")
    for status, body in results:
        if kind == "ok":
            good = status == 200 and b'"failure":null' in body
        elif kind == "problem":
            good = status == 503 and b"queue-full" in body
        else:  # episode: a 200 failure row echoing the request's ids
            good = status == 200 and b'"failure":{' in body and b'"episode_id":"e1"' in body
        if not good:
            raise AssertionError(f"{kind}: unexpected response {status} {body[:300]!r}")


def served(driver: Driver) -> Callable[[int], Awaitable[int]]:
    async def run(n: int) -> int:
        out: list[Result] = []
        started = time.process_time_ns()
        await driver.clients(n, out)
        elapsed = time.process_time_ns() - started
        expect(out, n, "ok")
        return elapsed

    return run


def refused(driver: Driver, kind: str) -> Callable[[int], Awaitable[int]]:
    async def run(n: int) -> int:
        held: list[Result] = []
        gate, holders = await driver.hold(held)
        out: list[Result] = []
        started = time.process_time_ns()
        for _ in range(n):
            await driver.call(out)
        elapsed = time.process_time_ns() - started
        gate.set()
        await asyncio.gather(*holders)
        expect(held, CLIENTS, "ok")
        expect(out, n, kind)
        return elapsed

    return run


def at_least(run: Callable[[int], Awaitable[int]], minimum: int) -> Callable[[int], Awaitable[int]]:
    """`run` with at least `minimum` requests, its time scaled back to n: the 64 holders' fixed
    cost then stays a small share of every round, even while the harness calibrates n."""

    async def scaled(n: int) -> int:
        requests = max(n, minimum)
        return round(await run(requests) * n / requests)

    return scaled


def queued(driver: Driver) -> Callable[[int], Awaitable[int]]:
    async def run(n: int) -> int:
        held: list[Result] = []
        out: list[Result] = []
        started = time.process_time_ns()
        gate, holders = await driver.hold(held)
        # The holders keep every slot for at least 10 ms after the gate opens, so each of
        # these takes the waiting path.
        waiting = [asyncio.create_task(driver.call(out)) for _ in range(n)]
        gate.set()
        await asyncio.gather(*holders, *waiting)
        elapsed = time.process_time_ns() - started
        expect(held, CLIENTS, "ok")
        expect(out, n, "ok")
        return elapsed

    return run


def direct(driver: Driver) -> Callable[[int], Awaitable[int]]:
    async def run(n: int) -> int:
        held: list[Result] = []
        out: list[Result] = []
        started = time.process_time_ns()
        gate, holders = await driver.hold(held)
        gate.set()
        await asyncio.gather(*holders)
        await driver.clients(n, out, task_each=True)
        elapsed = time.process_time_ns() - started
        expect(held, CLIENTS, "ok")
        expect(out, n, "ok")
        return elapsed

    return run


async def check_queued_path(driver: Driver) -> int:
    """Once, outside the timing: requests sent while the slots are held really queue."""
    from gym_concurrency.middleware import status_snapshot

    held: list[Result] = []
    out: list[Result] = []
    gate, holders = await driver.hold(held)
    waiting = [asyncio.create_task(driver.call(out)) for _ in range(100)]
    for _ in range(20):
        await asyncio.sleep(0)
    depth = sum(row["queue_depth"] for row in status_snapshot()["limits"])
    gate.set()
    await asyncio.gather(*holders, *waiting)
    expect(out, 100, "ok")
    if depth != 100:
        raise AssertionError(f"expected 100 queued requests, the status snapshot says {depth}")
    return depth


def summary_of(refusals: Comparison, queueing: Comparison) -> dict[str, Any]:
    extra = [
        q - d
        for q, d in zip(
            queueing.per_op_ns["queued then admitted"], queueing.per_op_ns["direct"], strict=True
        )
    ]
    out: dict[str, Any] = {
        "served_ns": refusals.median_ns("served 200"),
        "direct_ns": queueing.median_ns("direct"),
        "queued_ns": queueing.median_ns("queued then admitted"),
        "queued_extra_ns": statistics.median(extra),
        "queued_extra_ns_range": [min(extra), max(extra)],
        "queued_extra_target_ns": QUEUED_EXTRA_TARGET_NS,
        "queued_extra_met": statistics.median(extra) <= QUEUED_EXTRA_TARGET_NS,
        "refused": {},
    }
    for name in refusals.per_op_ns:
        if name == "served 200":
            continue
        ratios = refusals.ratios[name]
        out["refused"][name] = {
            "ns": refusals.median_ns(name),
            "ratio": refusals.ratio(name),
            "ratio_range": [min(ratios), max(ratios)],
            "target": REFUSED_TARGET,
            "met": refusals.ratio(name) <= REFUSED_TARGET,
        }
    return out


def report(title: str, s: dict[str, Any]) -> None:
    print(f"\n**{title}**\n")
    print("| case | CPU per request | ratio to served 200 (median, min-max) | target | met |")
    print("| --- | ---: | ---: | ---: | :---: |")
    print(f"| served 200 | {format_ns(s['served_ns'])} | 1.000x | | |")
    for name, r in s["refused"].items():
        print(
            f"| {name} | {format_ns(r['ns'])} | {r['ratio']:.3f}x "
            f"({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}) | <= {r['target']}x | "
            f"{'yes' if r['met'] else '**no**'} |"
        )
    low, high = s["queued_extra_ns_range"]
    print(f"| direct (after held slots) | {format_ns(s['direct_ns'])} | | | |")
    print(
        f"| queued then admitted | {format_ns(s['queued_ns'])} | extra over direct: "
        f"{format_ns(s['queued_extra_ns'])} ({format_ns(low)} to {format_ns(high)}) | "
        f"<= {format_ns(QUEUED_EXTRA_TARGET_NS)} | "
        f"{'yes' if s['queued_extra_met'] else '**no**'} |"
    )


async def main(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from benchmarks.overload_app import CONFIGS, make_app, make_sdk_provider, request_body

    body = request_body("e1")
    settings = Settings.quick() if args.quick else Settings(rounds=args.rounds)
    provider = make_sdk_provider()
    results: dict[str, Any] = {}
    for mode, meter_provider in (("no SDK", None), ("SDK provider exporting", provider)):
        if meter_provider is not None:
            if args.no_sdk:
                continue
            # As in the overload server: the global provider too, so FastAPI's own request
            # metrics (FastAPI >= 0.16x records them through the global) count in both cases.
            from opentelemetry import metrics

            metrics.set_meter_provider(meter_provider)

        def driver(config: str, mp: Any = meter_provider) -> Driver:
            return Driver(make_app(CONFIGS[config], meter_provider=mp), body)

        shed_problem = driver("q0-problem")
        deep = driver("queue-deep")
        await check_queued_path(deep)
        refusals = await compare(
            f"Refused vs served, {mode}",
            [
                Case("served 200", served(shed_problem)),
                Case("refused, queue full (problem 503)", refused(shed_problem, "problem")),
                Case(
                    "refused, queue full (episode 200 failure row)",
                    refused(driver("q0-episode"), "episode"),
                ),
            ],
            settings,
            unit="request",
        )
        queueing = await compare(
            f"Queued then admitted vs direct, {mode}",
            [
                Case("direct", at_least(direct(deep), MIN_QUEUED)),
                Case("queued then admitted", at_least(queued(deep), MIN_QUEUED)),
            ],
            settings,
            unit="request",
        )
        summary = summary_of(refusals, queueing)
        report(f"In process, {mode} (CPU per request, {settings.rounds} rounds)", summary)
        results[mode] = {
            "summary": summary,
            "refusals": refusals.to_json(),
            "queueing": queueing.to_json(),
        }
    provider.shutdown()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few short rounds (smoke test)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-sdk", action="store_true")
    parser.add_argument("--source", default=str(PROJECT_ROOT))
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--json", default=None)
    arguments = parser.parse_args()
    tree = use_source_tree(arguments.source)
    load_start = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    if arguments.loop == "uvloop":
        import uvloop

        figures = uvloop.run(main(arguments, tree))
    else:
        figures = asyncio.run(main(arguments, tree))
    print(
        f"\nsource {tree}; load average {load_start} at start, "
        f"{[round(x, 2) for x in os.getloadavg()]} at end; "
        f"{time.monotonic() - started:.0f} s"
    )
    if arguments.json:
        Path(arguments.json).write_text(
            json.dumps(
                {
                    "benchmark": "queued_inprocess",
                    "date": datetime.now(UTC).isoformat(timespec="seconds"),
                    "python": sys.version.split()[0],
                    "loop": arguments.loop,
                    "load_average_start": load_start,
                    "load_average_end": [round(x, 2) for x in os.getloadavg()],
                    "source": describe_tree(tree),
                    "gym_concurrency_files": loaded_files(tree),
                    "results": figures,
                },
                indent=1,
            )
            + "\n"
        )
        print(f"raw results: {arguments.json}")
