"""A quiet tenant beside a noisy one when the outbound limit is the bottleneck (issue 33: "a
route's flow goes with its outbound calls").

benchmarks/_outbound_flows_app.py is the scenario: a resources server (uvicorn, one process,
`taskset -c 0`) whose `POST /run` reads each request's flow from `x-tenant` and calls a slow
upstream (uvicorn, `taskset -c 1`; `--service-ms`, 100 by default) once through a configured
client limit of `--slots` (4): 40 calls a second at most. Two configurations of that client
limit, interleaved in rounds (the order alternates), a fresh resources server per cell:

    route   `flow: route` (the default now): each call goes in its request's flow
    none    `flow: none`: every call in the default flow, one FIFO queue (main's behaviour
            before this change)

Per cell, from this process (httpx): the quiet tenant alone (`--alone` requests, one at a
time), then a noisy tenant (a child process, `taskset -c 1`, httpx) keeping `--noisy` (64)
requests in flight, each sent again when answered; after `--warmup` s, the quiet tenant sends
one request at a time for `--seconds` s. Reported: the quiet tenant's p50 / p95 alone and
under the flood, the p50's ratio to alone, and the noisy tenant's calls a second in the
window, and all calls (the limit stays full).
Figures are medians over rounds.

    .venvs/3.11/bin/python -m benchmarks.outbound_flows [--rounds 3] [--seconds 10]
        [--noisy 64] [--slots 4] [--service-ms 100] [--label NAME] [--json PATH] [--quick]

Writes benchmarks/results/outbound-flows[-LABEL].json (raw: every latency) and
outbound-flows[-LABEL].summary.json; prints a Markdown table. 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import socket
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from benchmarks._loadgen import percentile
from benchmarks._outbound_flows_app import TENANT_HEADER
from benchmarks._source import PROJECT_ROOT, describe_tree
from benchmarks.overload import free_port, load_average, pinned, wait_until_quiet

RESULTS = PROJECT_ROOT / "benchmarks" / "results"
SERVER_CPU, OTHER_CPU = "0", "1"
CONFIGS = ("route", "none")


class Process:
    """One uvicorn of _outbound_flows_app, pinned, on a free port of 127.0.0.1."""

    def __init__(self, cpu: str, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "benchmarks._outbound_flows_app", *args]
        command += ["--port", str(self.port)]
        self.process = subprocess.Popen(pinned(cpu, command), cwd=PROJECT_ROOT)
        deadline = time.monotonic() + 30
        while not self._listening():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{' '.join(args)} did not start")
            time.sleep(0.05)

    def _listening(self) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


async def quiet_calls(url: str, count: int | None, until: float | None = None) -> list[float]:
    """Latencies (s) of the quiet tenant's requests, one at a time: `count` of them, or as
    many as start before `until` (perf_counter)."""
    seconds: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        while (count is None or len(seconds) < count) and (
            until is None or time.perf_counter() < until
        ):
            started = time.perf_counter()
            response = await client.post("/run", headers={TENANT_HEADER: "quiet"})
            response.raise_for_status()
            seconds.append(time.perf_counter() - started)
    return seconds


async def flood(url: str, noisy: int) -> list[float]:
    """The noisy tenant (a process of its own): `noisy` requests in flight, each sent again
    when answered, until its stdin has input or closes; when each ended (time.monotonic())."""
    stop = asyncio.Event()
    loop, stdin = asyncio.get_running_loop(), sys.stdin.fileno()

    def stopping() -> None:
        loop.remove_reader(stdin)
        stop.set()

    loop.add_reader(stdin, stopping)
    done: list[float] = []
    limits = httpx.Limits(max_connections=noisy)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def caller() -> None:
            while not stop.is_set():
                response = await client.post("/run", headers={TENANT_HEADER: "noisy"})
                response.raise_for_status()
                done.append(time.monotonic())

        await asyncio.gather(*(caller() for _ in range(noisy)))
    return done


async def cell(url: str, args: argparse.Namespace) -> dict[str, Any]:
    alone = await quiet_calls(url, args.alone)
    command = [sys.executable, "-m", "benchmarks.outbound_flows", "--flood", url]
    flooding = await asyncio.create_subprocess_exec(
        *pinned(OTHER_CPU, [*command, "--noisy", str(args.noisy)]),
        cwd=PROJECT_ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        await asyncio.sleep(args.warmup)
        started = time.monotonic()
        flooded = await quiet_calls(url, None, time.perf_counter() + args.seconds)
        ended = time.monotonic()
    finally:  # its stdin closed: it stops, and says when each of its requests ended
        output, _ = await asyncio.wait_for(flooding.communicate(b"stop\n"), 300)
    if flooding.returncode != 0:
        raise RuntimeError(f"the noisy tenant failed ({flooding.returncode})")
    noisy_done = json.loads(output)
    in_window = sum(1 for t in noisy_done if started <= t <= ended)
    return {
        "alone_s": alone,
        "flooded_s": flooded,
        "window_s": ended - started,
        "noisy_per_second": in_window / (ended - started),
    }


def figures(result: dict[str, Any]) -> dict[str, float]:
    alone, flooded = sorted(result["alone_s"]), sorted(result["flooded_s"])
    return {
        "alone_p50_ms": 1000 * statistics.median(alone),
        "alone_p95_ms": 1000 * percentile(alone, 0.95),
        "flooded_p50_ms": 1000 * statistics.median(flooded),
        "flooded_p95_ms": 1000 * percentile(flooded, 0.95),
        "p50_ratio": statistics.median(flooded) / statistics.median(alone),
        "quiet_calls": len(flooded),
        "noisy_per_second": result["noisy_per_second"],
        "calls_per_second": result["noisy_per_second"] + len(flooded) / result["window_s"],
    }


def summarize(cells: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    summary = {}
    for config in CONFIGS:
        rows = [c["figures"] for c in cells if c["config"] == config]
        if rows:
            summary[config] = {
                key: round(statistics.median(row[key] for row in rows), 3) for key in rows[0]
            }
    return summary


def table(summary: dict[str, dict[str, float]]) -> str:
    lines = [
        "| client `flow` | quiet alone p50 / p95 | quiet under flood p50 / p95 | p50 x alone "
        "| noisy / all calls/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for config, row in summary.items():
        lines.append(
            f"| `{config}` | {row['alone_p50_ms']:.0f} / {row['alone_p95_ms']:.0f} ms "
            f"| {row['flooded_p50_ms']:.0f} / {row['flooded_p95_ms']:.0f} ms "
            f"| {row['p50_ratio']:.2f} "
            f"| {row['noisy_per_second']:.1f} / {row['calls_per_second']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--alone", type=int, default=20)
    parser.add_argument("--noisy", type=int, default=64)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--service-ms", type=float, default=100.0)
    parser.add_argument("--label", default=None)
    parser.add_argument("--json", default=None, help="raw results here (summary beside)")
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s: that it runs")
    parser.add_argument("--flood", metavar="URL", help=argparse.SUPPRESS)  # the noisy tenant
    args = parser.parse_args()
    if args.flood:
        print(json.dumps(asyncio.run(flood(args.flood, args.noisy))))
        return
    if args.quick:
        args.rounds, args.seconds, args.warmup, args.alone = 1, 3.0, 2.0, 5
    upstream = Process(OTHER_CPU, "upstream", "--service-ms", str(args.service_ms))
    cells: list[dict[str, Any]] = []
    try:
        for number in range(args.rounds):
            order = CONFIGS if number % 2 == 0 else CONFIGS[::-1]
            for config in order:
                busy = wait_until_quiet(20)
                server = Process(
                    SERVER_CPU,
                    *("resources", "--upstream", upstream.url, "--client-flow", config),
                    *("--slots", str(args.slots)),
                )
                try:
                    result = asyncio.run(cell(server.url, args))
                finally:
                    server.stop()
                result.update(config=config, round=number, busy_before=busy)
                result.update(figures=figures(result), load_average=load_average())
                cells.append(result)
                print(f"round {number} {config}: {result['figures']}", flush=True)
    finally:
        upstream.stop()
    summary = summarize(cells)
    name = "outbound-flows" + (f"-{args.label}" if args.label else "")
    raw = Path(args.json) if args.json else RESULTS / f"{name}.json"
    meta = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "tree": describe_tree(PROJECT_ROOT),
        "args": vars(args),
    }
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps({**meta, "cells": cells}, indent=1))
    raw.with_suffix(".summary.json").write_text(json.dumps({**meta, "summary": summary}, indent=1))
    print(table(summary))


if __name__ == "__main__":
    main()
