"""Goodput under overload: uvicorn (httptools, uvloop, one worker pinned to CPU 0) serving
benchmarks/overload_app.py's 10 ms `POST /run` limited to 64 at a time in each limiter
configuration, driven by the closed-loop keep-alive client benchmarks/_loadgen.py pinned to
CPU 1, at 64, 256 and 1024 connections, with and without an SDK MeterProvider exporting.

    .venvs/3.11/bin/python -m benchmarks.overload --label after            # the code in this tree
    .venvs/3.11/bin/python -m benchmarks.overload --label before --source /tmp/before
    .venvs/3.11/bin/python -m benchmarks.overload --quick                   # smoke pass, ~2 min

Configurations run interleaved in rounds (the order rotates every round), one fresh server
per configuration per round; every cell is a 1 s warm-up and a 4 s window. Figures are
medians over rounds; each ratio is the median of per-round ratios to the no-limiter server of
the same group (no SDK, or the same SDK provider) at the same connection count. Goodput
counts `200` responses whose body is an episode success (`"failure":null`); episode-failure
rows are 200s but not goodput. Then, unless --no-inprocess, runs
benchmarks/queued_inprocess.py on the same source tree. Writes
benchmarks/results/overload-<label>.json (and queued-inprocess-<label>.json) and prints
Markdown tables. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import shutil
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

from benchmarks._processes import stop_process
from benchmarks._source import PROJECT_ROOT, describe_tree
from benchmarks.overload_app import CONFIGS, request_body

RESULTS = PROJECT_ROOT / "benchmarks" / "results"
PLAIN_CONFIGS = [
    "none",
    "queue-deep",
    "q256-problem",
    "q256-episode",
    "q0-problem",
    "q0-episode",
    "depends",
    "uvicorn",
]
REFUSING_CONFIGS = ["q256-problem", "q256-episode", "q0-problem", "q0-episode"]
# The same with close_connection_on_refusal set either way (the plain ones take the default).
CLOSE_CONFIGS = [f"{c}-close" for c in REFUSING_CONFIGS]
KEEPALIVE_CONFIGS = [f"{c}-keepalive" for c in REFUSING_CONFIGS]
SDK_CONFIGS = ["none", "queue-deep", "q256-problem", "q0-problem"]
# Refusals only happen past 64 clients, so the variants that set the close skip 64.
CLOSE_MIN_CONNECTIONS = 65
SERVER_CPU, CLIENT_CPU = "0", "1"
CLIENT_CPU_WARNING = 0.7  # cores: past this the client may be what limits a cell


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pinned(cpu: str, command: list[str]) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", cpu, *command]
    return command


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def busy_cores(seconds: float = 1.0) -> float:
    """Cores busy over `seconds` (every process; /proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        return sum(fields[:8]), fields[3] + fields[4]

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    cores = os.cpu_count() or 1
    return cores * (1 - (idle1 - idle0) / max(1, total1 - total0))


def wait_until_quiet(limit_s: float, threshold: float = 0.3) -> float:
    """Wait up to `limit_s` for the machine to be nearly idle; returns the last reading."""
    deadline = time.monotonic() + limit_s
    busy = busy_cores()
    while busy > threshold and time.monotonic() < deadline:
        busy = busy_cores()
    return round(busy, 2)


def probe(python: str, source: Path) -> dict[str, Any]:
    """What the source tree and the venv offer: the close setting, Depends(max_concurrency)."""
    code = (
        "import json, sys; from benchmarks._source import use_source_tree; "
        "use_source_tree(sys.argv[1]); "
        "from benchmarks.overload_app import close_setting, depends_has_max_concurrency; "
        "print(json.dumps({'close_setting': close_setting(), "
        "'depends_max_concurrency': depends_has_max_concurrency()}))"
    )
    output = subprocess.run(
        [python, "-c", code, str(source)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return json.loads(output)


class Server:
    """One benchmark server process, pinned, on a free port of 127.0.0.1."""

    def __init__(self, python: str, config: str, sdk: bool, source: Path, info: Path) -> None:
        self.port = free_port()
        command = [
            python,
            "-m",
            "benchmarks._overload_server",
            "--config",
            config,
            "--port",
            str(self.port),
            "--source",
            str(source),
            "--info",
            str(info),
        ]
        if sdk:
            command.append("--sdk")
        self.process = subprocess.Popen(pinned(SERVER_CPU, command), cwd=PROJECT_ROOT)
        self.info_path = info
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.request("GET", "/healthz")[0] == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not start within 60 s")

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            headers = {"content-type": "application/json"} if body is not None else {}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def check(self) -> None:
        status, body = self.request("POST", "/run", request_body("check"))
        if status != 200 or b'"failure":null' not in body:
            raise RuntimeError(f"POST /run answered {status} {body[:200]!r}")

    def stop(self) -> None:
        stop_process(self.process)


def loadgen(
    python: str, port: int, connections: int, warmup: float, seconds: float, server_pid: int
) -> dict[str, Any]:
    command = [
        python,
        "-m",
        "benchmarks._loadgen",
        "--port",
        str(port),
        "--connections",
        str(connections),
        "--warmup",
        str(warmup),
        "--seconds",
        str(seconds),
        "--server-pid",
        str(server_pid),
    ]
    done = subprocess.run(
        pinned(CLIENT_CPU, command),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=warmup + seconds + 60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)


def plan(args: argparse.Namespace, offers: dict[str, Any]) -> list[tuple[str, str]]:
    """(group, config) pairs to run each round; group is "plain" or "sdk"."""
    plain = [c for c in args.configs if c in PLAIN_CONFIGS]
    if not offers["depends_max_concurrency"] and "depends" in plain:
        print("skipping depends: this FastAPI's Depends() has no max_concurrency")
        plain.remove("depends")
    variants = [("-close", CLOSE_CONFIGS)] if args.close else []
    variants += [("-keepalive", KEEPALIVE_CONFIGS)] if args.keepalive else []
    if variants and offers["close_setting"] is None:
        print(
            "skipping the Connection: close and keep-alive variants: the middleware has no "
            "close_connection_on_refusal setting"
        )
    elif variants:
        for suffix, configs in variants:
            plain += [c for c in configs if c.removesuffix(suffix) in args.configs]
    pairs = [("plain", c) for c in plain]
    if args.sdk:
        pairs += [("sdk", c) for c in args.sdk_configs]
    return pairs


def connections_for(config: str, connections: list[int]) -> list[int]:
    if CONFIGS[config].close_on_refusal is not None:
        return [c for c in connections if c >= CLOSE_MIN_CONNECTIONS]
    return connections


class Pace:
    """Spreads the retry budget over the run: a cell may be measured again only while the run
    is within 1.1x of the time the cells so far were estimated to take."""

    def __init__(self, estimate_s: float, cells: int) -> None:
        self.started = time.monotonic()
        self.per_cell = 1.1 * estimate_s / max(1, cells)
        self.done = 0

    def may_retry(self) -> bool:
        return time.monotonic() - self.started < self.per_cell * (self.done + 1)


def measure_cell(
    args: argparse.Namespace, server: Server, connections: int, pace: Pace
) -> dict[str, Any]:
    """One cell; measured again (up to --retries times, while the run keeps to its time
    budget) when other processes took more than --max-other cores meanwhile. Keeps the
    quietest try."""
    tries = []
    for attempt in range(1 + args.retries):
        if attempt:
            time.sleep(1.0)
        tries.append(
            loadgen(
                args.python, server.port, connections, args.warmup, args.seconds, server.process.pid
            )
        )
        if tries[-1].get("other_cpu", 0.0) <= args.max_other or not pace.may_retry():
            break
    pace.done += 1
    best = min(tries, key=lambda t: t.get("other_cpu", 0.0))
    best["tries_other_cpu"] = [round(t.get("other_cpu", 0.0), 2) for t in tries]
    return best


def run_rounds(
    args: argparse.Namespace, pairs: list[tuple[str, str]], source: Path, workdir: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict]:
    n_cells = sum(len(connections_for(c, args.connections)) for _, c in pairs) * args.rounds
    pace = Pace(args.estimate, n_cells)
    cells: list[dict[str, Any]] = []
    rounds: list[dict[str, Any]] = []
    server_info: dict[str, Any] = {}
    for index in range(args.rounds):
        shift = (index * len(pairs)) // max(1, args.rounds)
        order = pairs[shift:] + pairs[:shift]
        busy = wait_until_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
        started, load = time.monotonic(), load_average()
        quiet = "" if busy is None else f", {busy} cores busy just before"
        print(f"round {index + 1}/{args.rounds}: load average {load}{quiet}", flush=True)
        for group, config in order:
            info = workdir / f"info-{group}-{config}.json"
            server = Server(args.python, config, group == "sdk", source, info)
            try:
                server.check()
                if not server_info:
                    server_info = json.loads(info.read_text())
                for connections in connections_for(config, args.connections):
                    result = measure_cell(args, server, connections, pace)
                    cells.append({"round": index, "group": group, "config": config, **result})
                    kinds = ", ".join(
                        f"{k} {v['per_second']:.0f}/s" for k, v in result["kinds"].items()
                    )
                    print(
                        f"  {group:5s} {config:20s} c={connections:<5d} "
                        f"goodput {result['goodput']:7.0f}/s  [{kinds}]  "
                        f"cpu: server {result.get('server_cpu', 0):.2f} "
                        f"client {result['loadgen_cpu']:.2f} "
                        f"other {result.get('other_cpu', 0):.2f}"
                        + (
                            f" (tries: {result['tries_other_cpu']})"
                            if len(result["tries_other_cpu"]) > 1
                            else ""
                        ),
                        flush=True,
                    )
                    time.sleep(args.settle)
            finally:
                server.stop()
        rounds.append(
            {
                "round": index,
                "load_average_start": load,
                "busy_cores_before": busy,
                "load_average_end": load_average(),
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    return cells, rounds, server_info


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(cells: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> list[dict]:
    by_key: dict[tuple[str, str, int, int], dict[str, Any]] = {
        (c["group"], c["config"], c["connections"], c["round"]): c for c in cells
    }
    summary = []
    for group, config in pairs:
        for connections in sorted({c["connections"] for c in cells}):
            mine = [
                c
                for c in cells
                if (c["group"], c["config"], c["connections"]) == (group, config, connections)
            ]
            if not mine:
                continue
            ratios, p99_ratios, efficiency_ratios = [], [], []
            for cell in mine:
                base = by_key.get((group, "none", connections, cell["round"]))
                if base and base["goodput"] > 0:
                    ratios.append(cell["goodput"] / base["goodput"])
                    if cell.get("server_cpu") and base.get("server_cpu"):
                        efficiency_ratios.append(
                            (cell["goodput"] / cell["server_cpu"])
                            / (base["goodput"] / base["server_cpu"])
                        )
                    base_p99 = base["kinds"].get("200 ok", {}).get("p99_ms")
                    p99 = cell["kinds"].get("200 ok", {}).get("p99_ms")
                    if base_p99 and p99:
                        p99_ratios.append(p99 / base_p99)
            kinds = sorted({k for c in mine for k in c["kinds"]})
            summary.append(
                {
                    "group": group,
                    "config": config,
                    "label": CONFIGS[config].label,
                    "connections": connections,
                    "rounds": len(mine),
                    "goodput": _median([c["goodput"] for c in mine]),
                    "goodput_ratio": _median(ratios),
                    "goodput_ratio_range": [min(ratios), max(ratios)] if ratios else None,
                    "ok_p50_ms": _median(
                        [c["kinds"]["200 ok"]["p50_ms"] for c in mine if "200 ok" in c["kinds"]]
                    ),
                    "ok_p99_ms": _median(
                        [c["kinds"]["200 ok"]["p99_ms"] for c in mine if "200 ok" in c["kinds"]]
                    ),
                    "ok_p99_ratio": _median(p99_ratios),
                    "kinds": {
                        kind: {
                            "per_second": _median(
                                [c["kinds"].get(kind, {}).get("per_second", 0.0) for c in mine]
                            ),
                            "p50_ms": _median(
                                [c["kinds"][kind]["p50_ms"] for c in mine if kind in c["kinds"]]
                            ),
                            "p99_ms": _median(
                                [c["kinds"][kind]["p99_ms"] for c in mine if kind in c["kinds"]]
                            ),
                        }
                        for kind in kinds
                    },
                    "reconnects_per_second": _median(
                        [c["reconnects"] / c["window_s"] for c in mine]
                    ),
                    "errors": {
                        k: sum(c["errors"].get(k, 0) for c in mine)
                        for k in sorted({k for c in mine for k in c["errors"]})
                    },
                    "server_cpu": _median([c.get("server_cpu", float("nan")) for c in mine]),
                    "goodput_per_server_cpu_second": _median(
                        [c["goodput"] / c["server_cpu"] for c in mine if c.get("server_cpu")]
                    ),
                    "goodput_per_server_cpu_ratio": _median(efficiency_ratios),
                    "other_cpu": _median([c.get("other_cpu", float("nan")) for c in mine]),
                    "other_cpu_max": max(c.get("other_cpu", float("nan")) for c in mine),
                    "loadgen_cpu": _median([c["loadgen_cpu"] for c in mine]),
                    "loadgen_cpu_max": max(c["loadgen_cpu"] for c in mine),
                }
            )
    return summary


def _cell(row: dict[str, Any] | None, baseline: bool) -> str:
    if row is None:
        return "-"
    if baseline:
        return f"{row['goodput']:,.0f}"
    return f"{row['goodput']:,.0f} ({row['goodput_ratio']:.2f}x)"


def _p99(row: dict[str, Any] | None) -> str:
    if row is None or row["ok_p99_ms"] != row["ok_p99_ms"]:
        return "-"
    return f"{row['ok_p99_ms']:,.0f} ms"


def tables(summary: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> str:
    find = {(r["group"], r["config"], r["connections"]): r for r in summary}
    connections = sorted({r["connections"] for r in summary})
    out: list[str] = []
    for group, title in (
        ("plain", "no SDK provider"),
        (
            "sdk",
            "an SDK MeterProvider exporting every 1 s; baseline: the same provider, no limiter",
        ),
    ):
        configs = [c for g, c in pairs if g == group]
        if not configs:
            continue
        out += [
            f"**Goodput (200 ok per second), {title}.** Ratio to no limiter in the same "
            "round, median of rounds.",
            "",
        ]
        out.append("| connections | " + " | ".join(CONFIGS[c].label for c in configs) + " |")
        out.append("| --- |" + " ---: |" * len(configs))
        for n in connections:
            cells = [_cell(find.get((group, c, n)), c == "none") for c in configs]
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        out += ["", f"**p99 of the 200 ok responses, {title}.**", ""]
        out.append("| connections | " + " | ".join(CONFIGS[c].label for c in configs) + " |")
        out.append("| --- |" + " ---: |" * len(configs))
        for n in connections:
            out.append(
                f"| {n} | " + " | ".join(_p99(find.get((group, c, n))) for c in configs) + " |"
            )
        out += [
            "",
            f"**Goodput per server CPU-second, ratio to no limiter, {title}** (does "
            "not move when another process takes part of CPU 0).",
            "",
        ]
        out.append("| connections | " + " | ".join(CONFIGS[c].label for c in configs[1:]) + " |")
        out.append("| --- |" + " ---: |" * (len(configs) - 1))
        for n in connections:
            rows = [find.get((group, c, n)) for c in configs[1:]]
            out.append(
                f"| {n} | "
                + " | ".join(
                    "-" if r is None else f"{r['goodput_per_server_cpu_ratio']:.2f}x" for r in rows
                )
                + " |"
            )
        out.append("")
    out += [
        "**Every cell: rates and latency by kind of response** (medians of rounds; "
        "`refused` is 503 or episode failure; CPU in cores over the window: the server's, "
        "the client's, and every other process's on the machine)",
        "",
        "| group | configuration | conns | 200 ok/s | ok p50 / p99 | refused/s | "
        "refused p50 / p99 | reconnects/s | server CPU | ok per server CPU-s | "
        "client CPU | other CPU |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in summary:
        refused = {k: v for k, v in row["kinds"].items() if k != "200 ok"}
        refused_rate = sum(v["per_second"] for v in refused.values())
        worst = max(refused.values(), key=lambda v: v["per_second"], default=None)
        ok = row["kinds"].get("200 ok")
        out.append(
            f"| {row['group']} | {row['label']} | {row['connections']} | {row['goodput']:,.0f} | "
            + (f"{ok['p50_ms']:.0f} / {ok['p99_ms']:.0f} ms" if ok else "-")
            + " | "
            + (f"{refused_rate:,.0f} ({', '.join(sorted(refused))})" if refused else "0")
            + " | "
            + (f"{worst['p50_ms']:.1f} / {worst['p99_ms']:.1f} ms" if worst else "-")
            + " | "
            + f"{row['reconnects_per_second']:,.0f} | {row['server_cpu']:.2f} | "
            f"{row['goodput_per_server_cpu_second']:,.0f} | {row['loadgen_cpu']:.2f} "
            f"(max {row['loadgen_cpu_max']:.2f}) | {row['other_cpu']:.2f} "
            f"(max {row['other_cpu_max']:.2f}) |"
        )
    busy_client = [r for r in summary if r["loadgen_cpu_max"] > CLIENT_CPU_WARNING]
    if busy_client:
        out += [
            "",
            f"**Warning**: the client used more than {CLIENT_CPU_WARNING} of its core in "
            "these cells, so it may have limited them: "
            + ", ".join(
                f"{r['group']} {r['config']} c={r['connections']} ({r['loadgen_cpu_max']:.2f})"
                for r in busy_client
            ),
        ]
    errors = {
        (r["group"], r["config"], r["connections"]): r["errors"] for r in summary if r["errors"]
    }
    if errors:
        out += ["", "Client-side errors (summed over rounds):", ""]
        out += [f"- {g} {c} c={n}: {e}" for (g, c, n), e in errors.items()]
    return "\n".join(out)


def summarize_files(paths: list[str], out: str | None) -> None:
    """Tables over the cells of one or more earlier runs (of the same tree: their rounds are
    pooled, each ratio still taken within its own round)."""
    cells: list[dict[str, Any]] = []
    pairs: list[tuple[str, str]] = []
    for index, path in enumerate(paths):
        run = json.loads(Path(path).read_text())
        print(
            f"{path}: source {run['source']['commit'][:12]}, {run['date']}, load average "
            f"{run['load_average_start']} -> {run['load_average_end']}, "
            f"{len(run['rounds'])} rounds"
        )
        for cell in run["cells"]:
            cells.append({**cell, "round": index * 1000 + cell["round"]})
            if (cell["group"], cell["config"]) not in pairs:
                pairs.append((cell["group"], cell["config"]))
    summary = summarize(cells, pairs)
    print()
    print(tables(summary, pairs))
    if out:
        Path(out).write_text(
            json.dumps(
                {"benchmark": "overload", "pooled_from": paths, "summary": summary}, indent=1
            )
            + "\n"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--source",
        default=str(PROJECT_ROOT),
        help="gym-concurrency source tree to measure (default: this one)",
    )
    parser.add_argument("--label", default="run", help="names the JSON files")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured window per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up per cell")
    parser.add_argument("--settle", type=float, default=0.2, help="pause between cells")
    parser.add_argument("--connections", default="64,256,1024")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=30.0,
        help="before each round, wait up to this many seconds for the other "
        "processes on the machine to use under 0.3 cores (0: don't)",
    )
    parser.add_argument(
        "--configs",
        default=",".join(PLAIN_CONFIGS),
        help="comma-separated subset of: " + ", ".join(PLAIN_CONFIGS),
    )
    parser.add_argument("--sdk-configs", default=",".join(SDK_CONFIGS))
    parser.add_argument(
        "--max-other",
        type=float,
        default=0.35,
        help="measure a cell again if other processes used more cores",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help="at most this many extra tries of a noisy cell, while the run keeps "
        "within 1.1x of its estimated time",
    )
    parser.add_argument("--no-sdk", dest="sdk", action="store_false")
    parser.add_argument(
        "--no-close",
        dest="close",
        action="store_false",
        help="skip the Connection: close variants even if the setting exists",
    )
    parser.add_argument(
        "--no-keepalive",
        dest="keepalive",
        action="store_false",
        help="skip the variants that keep the connection on refusal",
    )
    parser.add_argument("--no-inprocess", dest="inprocess", action="store_false")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 round, 0.5 s warm-up + 1.5 s windows: checks that it all runs",
    )
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", default=None, help="default: results/overload-LABEL.json")
    parser.add_argument(
        "--summarize",
        nargs="+",
        metavar="JSON",
        help="measure nothing: print the tables of earlier runs' JSON files, "
        "their rounds pooled (--json writes the pooled summary)",
    )
    args = parser.parse_args()
    if args.summarize:
        summarize_files(args.summarize, args.json)
        return
    if args.quick:
        args.rounds, args.seconds, args.warmup = 1, 1.5, 0.5
    args.connections = [int(c) for c in args.connections.split(",")]
    args.configs = args.configs.split(",")
    args.sdk_configs = args.sdk_configs.split(",")
    if "none" not in args.configs or "none" not in args.sdk_configs:
        sys.exit("'none' (the baseline) must be among the configurations")
    unknown = [c for c in args.configs + args.sdk_configs if c not in PLAIN_CONFIGS]
    if unknown:
        sys.exit(f"unknown configurations {unknown}; known: {PLAIN_CONFIGS}")
    source = Path(args.source).resolve()
    offers = probe(args.python, source)
    pairs = plan(args, offers)
    n_cells = sum(len(connections_for(c, args.connections)) for _, c in pairs)
    estimate = args.rounds * (
        n_cells * (args.warmup + args.seconds + args.settle + 0.4) + len(pairs) * 2.5
    )
    args.estimate = estimate
    print(
        f"source {source}; {len(pairs)} servers x {args.rounds} rounds, {n_cells} cells a "
        f"round; about {estimate / 60:.1f} min (up to {1.1 * estimate / 60:.1f} min with "
        "retries of noisy cells)",
        flush=True,
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    workdir = Path("/tmp/gym_concurrency_overload")
    workdir.mkdir(exist_ok=True)
    started = time.monotonic()
    load_start = load_average()
    cells, rounds, server_info = run_rounds(args, pairs, source, workdir)
    summary = summarize(cells, pairs)
    result = {
        "benchmark": "overload",
        "label": args.label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
        },
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "seconds": round(time.monotonic() - started, 1),
        "source": describe_tree(source),
        "server": server_info,
        "offers": offers,
        "settings": {
            k: getattr(args, k)
            for k in (
                "rounds",
                "seconds",
                "warmup",
                "settle",
                "connections",
                "configs",
                "sdk_configs",
                "wait_quiet",
                "max_other",
                "retries",
            )
        }
        | {"gc_threshold_env": os.environ.get("GYM_BENCH_GC_THRESHOLD")},
        "pinning": {
            "server_cpu": SERVER_CPU,
            "client_cpu": CLIENT_CPU,
            "taskset": bool(pinned("0", [])),
            "sdk_export_interval_s": 1.0,
        },
        "rounds": rounds,
        "summary": summary,
        "cells": cells,
    }
    path = Path(args.json) if args.json else RESULTS / f"overload-{args.label}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print()
    print(
        f"source {result['source']['commit'][:12]} ({result['source']['subject'][:72]}); "
        f"load average {load_start} at start, {result['load_average_end']} at end; "
        f"{result['seconds'] / 60:.1f} min"
    )
    print()
    print(tables(summary, pairs))
    print(f"\nraw results: {path}")
    if args.inprocess:
        command = [
            args.python,
            "-m",
            "benchmarks.queued_inprocess",
            "--source",
            str(source),
            "--json",
            str(path.with_name(f"queued-inprocess-{args.label}.json")),
        ]
        if args.quick:
            command.append("--quick")
        busy = wait_until_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
        print(f"\nin process ({busy} cores busy just before):", flush=True)
        subprocess.run(pinned(SERVER_CPU, command), cwd=PROJECT_ROOT, check=True)


if __name__ == "__main__":
    main()
