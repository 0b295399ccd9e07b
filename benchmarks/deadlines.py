"""Deadlines under a flood (issue 26): does a route limit that knows each caller's deadline
(`RouteLimit(deadline="header:x-deadline-ms")`) keep the work it admits useful, and refuse at
once what it cannot serve in time?

uvicorn (httptools, uvloop, one process pinned to CPU 0) serves benchmarks/_deadlines_server.py:
`GET /work` sleeps 100 ms, limited to 16 at a time, `queue_timeout_seconds=2`: a capacity of
16 / 0.1 s = 160 requests/s. benchmarks/_deadlines_load.py (pinned to CPU 1) sends an open loop
of Poisson arrivals at N x 160/s (N = 4 and 16, the "Nx flood"), each carrying a caller's
deadline of 2 s, and gives up on it after 2.2 s. Three configurations, interleaved in rounds
(the order rotates), one fresh server per cell, the same seeded arrivals in every
configuration of a round:

    deadline               the route reads `x-deadline-ms`; the caller sends 2000
    deadline-less-service  the same server; the caller sends 1900: its 2 s less the 100 ms the
                           work takes (what a caller, or a proxy, that knows the service time
                           would send), its own deadline still 2 s
    no-deadline            the baseline: the same route without `deadline`; a queued request
                           waits its whole 2 s queue timeout

Per cell (requests sent in the window, after the warm-up): completed within the caller's 2 s
deadline per second and as a fraction of the best possible (160/s); refusals (503) and their
time-to-refusal at the client (send to the whole answer) and in the server (reaching the app
to the response's start); requests the app started after their deadline, in the server's
view (loop time on entry vs the deadline the middleware left in request.state) and the
caller's (time.monotonic() on entry vs send time + 2 s), over the whole run, warm-up included;
and CPU. Figures are medians over rounds, the late counts sums.

    .venvs/3.11/bin/python -m benchmarks.deadlines [--rounds 3] [--warmup 4] [--seconds 10]
        [--floods 4,16] [--configs deadline,deadline-less-service,no-deadline]
        [--source TREE] [--label NAME] [--quick]

Writes benchmarks/results/deadlines-LABEL.json (raw: every cell) and
deadlines-LABEL.summary.json, prints a Markdown table. Traffic goes to 127.0.0.1 only; every
cell is bounded: rate x (warm-up + window) requests, then at most the client timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._deadlines_server import LIMIT, QUEUE_TIMEOUT_S, SERVICE_S
from benchmarks._loadgen import percentile
from benchmarks._source import PROJECT_ROOT, describe_tree
from benchmarks.overload import Server as _OverloadServer
from benchmarks.overload import free_port, load_average, pinned, wait_until_quiet

RESULTS = PROJECT_ROOT / "benchmarks" / "results"
SERVER_CPU, CLIENT_CPU = "0", "1"
CAPACITY = LIMIT / SERVICE_S  # requests a second
DEADLINE_S = 2.0
CLIENT_TIMEOUT_S = 2.2
REFUSAL_GOAL_S = 0.050
# configuration: (server configuration, x-deadline-ms the caller sends)
CONFIGS: dict[str, tuple[str, float]] = {
    "deadline": ("deadline", DEADLINE_S * 1000),
    "deadline-less-service": ("deadline", (DEADLINE_S - SERVICE_S) * 1000),
    "deadline-keepalive": ("deadline-keepalive", DEADLINE_S * 1000),
    "no-deadline": ("no-deadline", DEADLINE_S * 1000),
}
GOALS = {
    "admitted_after_deadline": 0,
    "in_deadline_fraction_of_best": 0.95,
    "refusal_p99_ms": REFUSAL_GOAL_S * 1000,
}


class DeadlinesServer(_OverloadServer):
    """benchmarks/_deadlines_server.py in one configuration, pinned to CPU 0."""

    def __init__(self, python: str, config: str, source: Path, info: Path) -> None:
        self.port = free_port()
        command = [python, "-m", "benchmarks._deadlines_server", "--config", config]
        command += ["--port", str(self.port), "--source", str(source), "--info", str(info)]
        self.process = subprocess.Popen(pinned(SERVER_CPU, command), cwd=PROJECT_ROOT)
        self.info_path = info
        self._wait_ready()

    def records(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}/stats"
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.loads(response.read())


def loadgen(
    args: argparse.Namespace, server: DeadlinesServer, rate: float, header_ms: float, seed: int
) -> dict[str, Any]:
    command = [args.python, "-m", "benchmarks._deadlines_load", "--port", str(server.port)]
    command += ["--rate", str(rate), "--header-ms", str(header_ms)]
    command += ["--deadline-s", str(DEADLINE_S), "--client-timeout", str(CLIENT_TIMEOUT_S)]
    command += ["--warmup", str(args.warmup), "--seconds", str(args.seconds)]
    command += ["--seed", str(seed), "--server-pid", str(server.process.pid)]
    done = subprocess.run(
        pinned(CLIENT_CPU, command),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=args.warmup + args.seconds + 60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)


def server_figures(records: dict[str, Any], window: list[float]) -> dict[str, Any]:
    """What the app saw: requests started after their deadline (the whole run; the window),
    a refusal's time in the server, and the service time."""
    start, end = window
    admitted = [r for r in records["admitted"] if r[0] is not None]
    in_window = [r for r in admitted if start <= r[0] < end]

    def late(rows: list[list[Any]]) -> dict[str, Any]:
        # rows: sent, caller deadline, entry (monotonic), entry (loop time), state deadline
        server = [r[3] - r[4] for r in rows if r[4] is not None and r[3] > r[4]]
        caller = [r[2] - r[1] for r in rows if r[2] > r[1]]
        too_late = sum(1 for r in rows if r[1] - r[2] < SERVICE_S)
        return {
            "admitted": len(rows),
            "late_server_view": len(server),
            "late_server_view_max_ms": max(server, default=0.0) * 1000,
            "late_caller_view": len(caller),
            "late_caller_view_max_ms": max(caller, default=0.0) * 1000,
            "too_late_to_finish": too_late,  # started with less than the service time left
            "has_state_deadline": any(r[4] is not None for r in rows),
        }

    responses = [r for r in records["responses"] if r[0] is not None and start <= r[0] < end]
    refused = sorted(r[2] - r[1] for r in responses if r[3] == 503)
    reach = sorted(r[1] - r[0] for r in responses)
    services = [r[5] for r in in_window]
    waits = sorted(r[2] - r[0] for r in in_window)
    return {
        "run": late(admitted),
        "window": late(in_window),
        "wait_p50_ms": percentile(waits, 0.50) * 1000,
        "wait_p99_ms": percentile(waits, 0.99) * 1000,
        "service_mean_ms": statistics.fmean(services) * 1000 if services else float("nan"),
        "refused": len(refused),
        "refused_p50_ms": percentile(refused, 0.50) * 1000,
        "refused_p99_ms": percentile(refused, 0.99) * 1000,
        "refused_within_50ms": sum(1 for x in refused if x <= REFUSAL_GOAL_S),
        "reach_app_p50_ms": percentile(reach, 0.50) * 1000,  # send to reaching the app
        "reach_app_p99_ms": percentile(reach, 0.99) * 1000,
    }


def measure(
    args: argparse.Namespace, config: str, flood: int, seed: int, source: Path, workdir: Path
) -> dict[str, Any]:
    server_config, header_ms = CONFIGS[config]
    info = workdir / f"info-{server_config}.json"
    server = DeadlinesServer(args.python, server_config, source, info)
    try:
        client = loadgen(args, server, flood * CAPACITY, header_ms, seed)
        records = server.records()
    finally:
        server.stop()
    cell: dict[str, Any] = {"config": config, "flood": flood, "seed": seed, **client}
    cell["server"] = server_figures(records, client["window"])
    cell["in_deadline_fraction_of_best"] = client["ok_in_deadline_per_second"] / CAPACITY
    return cell


def run_rounds(args: argparse.Namespace, source: Path, workdir: Path) -> list[dict[str, Any]]:
    pairs = [(flood, config) for flood in args.floods for config in args.configs]
    cells: list[dict[str, Any]] = []
    for index in range(args.rounds):
        seed = index + 1
        shift = (index * len(args.configs)) // max(1, args.rounds) if args.rounds > 1 else 0
        order = [
            (flood, config)
            for flood in (args.floods if index % 2 == 0 else args.floods[::-1])
            for config in args.configs[shift:] + args.configs[:shift]
        ]
        assert sorted(order) == sorted(pairs)
        busy = wait_until_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
        print(f"round {index + 1}/{args.rounds}: load {load_average()}, {busy} cores busy")
        for flood, config in order:
            tries = [measure(args, config, flood, seed, source, workdir)]
            # Measured again if the rest of the machine took more than --max-other cores
            # meanwhile (it shares the cores with the server and the client); quietest kept.
            while tries[-1].get("other_cpu", 0.0) > args.max_other and len(tries) <= args.retries:
                print(f"  (other processes used {tries[-1]['other_cpu']:.2f} cores: again)")
                if args.wait_quiet > 0:
                    wait_until_quiet(min(args.wait_quiet, 10.0))
                tries.append(measure(args, config, flood, seed, source, workdir))
            cell = min(tries, key=lambda t: t.get("other_cpu", 0.0))
            cell["tries_other_cpu"] = [round(t.get("other_cpu", 0.0), 2) for t in tries]
            cell.update(round=index, load=load_average())
            cells.append(cell)
            report(cell)
    return cells


def report(cell: dict[str, Any]) -> None:
    server = cell["server"]
    print(
        f"  {cell['flood']:2d}x {cell['config']:22s} sent {cell['sent_per_second']:6.0f}/s  "
        f"in deadline {cell['ok_in_deadline_per_second']:6.1f}/s "
        f"({cell['in_deadline_fraction_of_best']:.3f} of best)  late 200 {cell['ok_late']:5d}  "
        f"refused {cell['refused_per_second']:6.0f}/s p50 {cell['refused_p50_ms']:6.1f} "
        f"p99 {cell['refused_p99_ms']:7.1f} ms  started late (server/caller) "
        f"{server['run']['late_server_view']}/{server['run']['late_caller_view']}  "
        f"client timeouts {cell['outcomes'].get('client timeout', 0)}  "
        f"cpu server {cell.get('server_cpu', 0):.2f} client {cell['loadgen_cpu']:.2f} "
        f"other {cell.get('other_cpu', 0):.2f}",
        flush=True,
    )


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(cells: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per flood and configuration: medians over rounds, the late counts summed."""
    out: dict[str, Any] = {}
    for flood in args.floods:
        for config in args.configs:
            mine = [c for c in cells if (c["flood"], c["config"]) == (flood, config)]
            if not mine:
                continue
            run_late = [c["server"]["run"] for c in mine]
            refused = sum(c["refused"] for c in mine)
            outcomes: dict[str, int] = {}
            for cell in mine:
                for kind, n in cell["outcomes"].items():
                    outcomes[kind] = outcomes.get(kind, 0) + n
            row: dict[str, Any] = {
                "flood": flood,
                "config": config,
                "header_ms": CONFIGS[config][1],
                "rounds": len(mine),
                "offered_per_second": _median([c["sent_per_second"] for c in mine]),
                "in_deadline_per_second": _median([c["ok_in_deadline_per_second"] for c in mine]),
                "in_deadline_fraction_of_best": _median(
                    [c["in_deadline_fraction_of_best"] for c in mine]
                ),
                "in_deadline_fraction_rounds": [
                    round(c["in_deadline_fraction_of_best"], 3) for c in mine
                ],
                "ok_late_per_second": _median([c["ok_late"] / c["window_s"] for c in mine]),
                "ok_p50_ms": _median([c["ok_p50_ms"] for c in mine]),
                "ok_p99_ms": _median([c["ok_p99_ms"] for c in mine]),
                "refused_per_second": _median([c["refused_per_second"] for c in mine]),
                "refused_p50_ms": _median([c["refused_p50_ms"] for c in mine]),
                "refused_p99_ms": _median([c["refused_p99_ms"] for c in mine]),
                "refused_p99_ms_rounds": [round(c["refused_p99_ms"], 1) for c in mine],
                "refused_within_50ms_fraction": (
                    sum(c["refused_within_50ms"] for c in mine) / refused if refused else None
                ),
                "refused_after_1s": sum(c["refused_after_1s"] for c in mine),
                "server_refused_p50_ms": _median([c["server"]["refused_p50_ms"] for c in mine]),
                "server_refused_p99_ms": _median([c["server"]["refused_p99_ms"] for c in mine]),
                "wait_p50_ms": _median([c["server"]["wait_p50_ms"] for c in mine]),
                "wait_p99_ms": _median([c["server"]["wait_p99_ms"] for c in mine]),
                "service_mean_ms": _median([c["server"]["service_mean_ms"] for c in mine]),
                "reach_app_p99_ms": _median([c["server"]["reach_app_p99_ms"] for c in mine]),
                "admitted": sum(r["admitted"] for r in run_late),
                "started_late_server_view": (
                    sum(r["late_server_view"] for r in run_late)
                    if all(r["has_state_deadline"] for r in run_late)
                    else None
                ),
                "started_late_server_view_max_ms": max(
                    r["late_server_view_max_ms"] for r in run_late
                ),
                "started_late_caller_view": sum(r["late_caller_view"] for r in run_late),
                "started_late_caller_view_max_ms": max(
                    r["late_caller_view_max_ms"] for r in run_late
                ),
                "started_too_late_to_finish": sum(r["too_late_to_finish"] for r in run_late),
                "outcomes": outcomes,
                "unanswered_at_end": sum(c["run"]["unanswered_at_end"] for c in mine),
                "dropped_no_connection": sum(c["run"]["dropped_no_connection"] for c in mine),
                "send_lag_p99_ms_max": max(c["send_lag_p99_ms"] for c in mine),
            }
            for key in ("server_cpu", "loadgen_cpu", "other_cpu"):
                if all(key in c for c in mine):
                    row[key + "_max"] = round(max(c[key] for c in mine), 3)
            row["other_cpu_rounds"] = [round(c.get("other_cpu", 0.0), 2) for c in mine]
            out[f"{flood}x {config}"] = row
    return out


def _finite(value: Any) -> Any:
    """`value` with every NaN (a percentile of nothing) made None: the JSON stays standard."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _ms(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.1f}"


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| flood | configuration | in deadline /s | / best (160/s) | late 200 /s | "
        "refused /s | time to refusal p50 / p99 (client) | refused within 50 ms | "
        "started after deadline (server / caller view) | client timeouts |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in summary.values():
        within = row["refused_within_50ms_fraction"]
        server_late = row["started_late_server_view"]
        lines.append(
            f"| {row['flood']}x | {row['config']} | {row['in_deadline_per_second']:.1f} | "
            f"{row['in_deadline_fraction_of_best']:.3f} | {row['ok_late_per_second']:.1f} | "
            f"{row['refused_per_second']:.0f} | {_ms(row['refused_p50_ms'])} / "
            f"{_ms(row['refused_p99_ms'])} ms | "
            f"{'-' if within is None else f'{within:.3f}'} | "
            f"{'n/a' if server_late is None else server_late} / "
            f"{row['started_late_caller_view']} (of {row['admitted']}) | "
            f"{row['outcomes'].get('client timeout', 0)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", default=str(PROJECT_ROOT), help="the tree to measure")
    parser.add_argument("--label", default="run", help="names the JSON files")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per cell")
    parser.add_argument("--warmup", type=float, default=4.0, help="s of the flood before it")
    parser.add_argument("--floods", default="4,16", help="offered load, times capacity")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--wait-quiet", type=float, default=20.0, help="s, before each round")
    parser.add_argument(
        "--max-other",
        type=float,
        default=0.5,
        help="measure a cell again if other processes used more cores meanwhile",
    )
    parser.add_argument("--retries", type=int, default=1, help="at most this many again")
    parser.add_argument(
        "--quick", action="store_true", help="1 round, 2 configurations, short cells: smoke run"
    )
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", default=None, help="default: results/deadlines-LABEL.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.warmup, args.wait_quiet, args.retries = 1, 1.5, 1.0, 0, 0
        args.configs = "deadline,no-deadline"
    args.floods = [int(f) for f in args.floods.split(",") if f]
    args.configs = [c for c in args.configs.split(",") if c]
    if not args.floods or any(not 1 <= f <= 30 for f in args.floods):
        sys.exit("--floods: comma-separated loads in [1, 30] times capacity")
    if not args.configs or any(c not in CONFIGS for c in args.configs):
        sys.exit(f"--configs: a comma-separated subset of {list(CONFIGS)}")
    if not 1 <= args.rounds <= 20 or not 0 < args.seconds <= 60 or not 0 <= args.warmup <= 30:
        sys.exit("--rounds must be in [1, 20], --seconds in (0, 60], --warmup in [0, 30]")
    source = Path(args.source).resolve()
    cells_per_round = len(args.floods) * len(args.configs)
    estimate = args.rounds * cells_per_round * (args.warmup + args.seconds + CLIENT_TIMEOUT_S + 3)
    print(
        f"source {source}; {cells_per_round} cells x {args.rounds} rounds, about "
        f"{estimate / 60:.1f} min",
        flush=True,
    )
    workdir = Path("/tmp/gym_concurrency_deadlines")
    workdir.mkdir(exist_ok=True)
    started, load_start = time.monotonic(), load_average()
    cells = run_rounds(args, source, workdir)
    summary = summarize(cells, args)
    info = workdir / "info-deadline.json"
    result: dict[str, Any] = {
        "benchmark": "deadlines",
        "label": args.label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "python": sys.version.split()[0],
        "source": describe_tree(source),
        "server": json.loads(info.read_text()) if info.exists() else None,
        "settings": {
            "limit": LIMIT,
            "service_ms": SERVICE_S * 1000,
            "capacity_per_second": CAPACITY,
            "queue_timeout_s": QUEUE_TIMEOUT_S,
            "deadline_s": DEADLINE_S,
            "client_timeout_s": CLIENT_TIMEOUT_S,
            "arrivals": "Poisson, seeded by round",
            "floods": args.floods,
            "configs": {
                c: {"server": CONFIGS[c][0], "header_ms": CONFIGS[c][1]} for c in args.configs
            },
            "rounds": args.rounds,
            "warmup_s": args.warmup,
            "seconds": args.seconds,
            "max_other": args.max_other,
            "retries": args.retries,
        },
        "pinning": {
            "server_cpu": SERVER_CPU,
            "client_cpu": CLIENT_CPU,
            "taskset": bool(pinned("0", [])),
        },
        "goals": GOALS,
        "load_average_start": load_start,
    }
    result.update(
        load_average_end=load_average(),
        seconds=round(time.monotonic() - started, 1),
        summary=summary,
    )
    path = Path(args.json) if args.json else RESULTS / f"deadlines-{args.label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite({**result, "cells": cells}), indent=1) + "\n")
    summary_path = path.with_name(path.name.removesuffix(".json") + ".summary.json")
    summary_path.write_text(json.dumps(_finite(result), indent=1) + "\n")
    print()
    print(
        f"source {result['source']['commit'][:12]} ({result['source']['subject'][:60]}); "
        f"load {load_start} -> {result['load_average_end']}; {result['seconds'] / 60:.1f} min"
    )
    print()
    print(table(summary))
    print(f"\nraw: {path}\nsummary: {summary_path}")


if __name__ == "__main__":
    main()
