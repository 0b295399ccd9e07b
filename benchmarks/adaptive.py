"""Limits that move: an adaptive limit against static ones, on an upstream with a capacity knee,
through the demo's proxy route (examples/fastapi_app, `POST /v1/chat/completions`).

The upstream (benchmarks/adaptive_upstream.py) takes `--base` seconds per request up to
`--knee` K in flight, base * (c / K)**2 past it, and answers 503 at once past 2K. The demo
server (uvicorn, uvloop + httptools, pinned to CPU 0) proxies to it under the route limit
`upstream_requests`, configured per cell: static at some size, or adaptive (gradient, AIMD).
A closed loop of `--clients` keep-alive clients (pinned to CPU 1, with the upstream) sends the
next request as soon as the last answer arrived, or 0.25 s after a failure (a client's retry
pause). Everything runs on 127.0.0.1 and each cell is bounded in time.

Scenarios:
- steady: the knee stays at K. Goodput (200s a second) and p99 latency (client-side, queue
  wait included) of the adaptive limit against the best static limit of a sweep, a limit far
  too low and one far too high.
- halve: the knee halves to K/2 `--halve-at` seconds in. The adaptive limit's recovery
  (first second from which goodput over 2 s is within 10% of the new best static limit's)
  and the old best static limit's p99 before and after.

    .venvs/3.11/bin/python -m benchmarks.adaptive                # ~15 min, the figures
    .venvs/3.11/bin/python -m benchmarks.adaptive --quick        # ~4 min smoke pass

Writes benchmarks/results/adaptive-<label>.json and docs/adaptive-limits.png (limit, in
flight, queued and p99 over time), and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._source import PROJECT_ROOT, describe_tree

HOST = "127.0.0.1"
RESULTS = PROJECT_ROOT / "benchmarks" / "results"
PLOT = PROJECT_ROOT / "docs" / "adaptive-limits.png"
SERVER_CPU, LOAD_CPU = "0", "1"
LIMIT_NAME = "upstream_requests"
RETRY_PAUSE = 0.25  # seconds a client waits after a failed request
REQUEST_BODY = b'{"model":"fake-model","messages":[{"role":"user","content":"hi"}]}'


# --- the load: a closed loop of keep-alive clients ------------------------------------------


async def _client(port: int, deadline: float, records: list[tuple[float, float, int]]) -> None:
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(REQUEST_BODY), REQUEST_BODY)
    )
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        while time.time() < deadline:
            sent = time.time()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            close = False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
            await reader.readexactly(length)
            records.append((sent, time.time(), status))
            if close:
                writer.close()
                reader, writer = await asyncio.open_connection(HOST, port)
            if status != 200:
                await asyncio.sleep(RETRY_PAUSE)
    except (ConnectionError, asyncio.IncompleteReadError):
        records.append((time.time(), time.time(), 0))
    finally:
        writer.close()


async def _load(port: int, clients: int, seconds: float) -> list[tuple[float, float, int]]:
    deadline = time.time() + seconds
    records: list[tuple[float, float, int]] = []
    await asyncio.gather(*(_client(port, deadline, records) for _ in range(clients)))
    return records


# --- one cell: an upstream, the demo proxy, the load ------------------------------------------


def _pinned(cpu: str, command: list[str]) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", cpu, *command]
    return command


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _get(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def _post(url: str) -> None:
    request = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=2):
        pass


def _settings(config: dict[str, Any]) -> str:
    """The demo's settings file for one cell: only the proxy route is limited."""
    route = {
        "path": "/v1/chat/completions",
        "methods": ["POST"],
        "limit_name": LIMIT_NAME,
        "max_concurrent": config["size"],
        "queue_timeout_seconds": 30,
        "failure": "openai",
    }
    if config.get("algorithm"):
        route["adaptive"] = {
            "min_concurrent": 4,
            "max_concurrent": 256,
            "algorithm": config["algorithm"],
        }
    operations = [  # the demo's routes use these (checked at its start)
        {
            "limit_name": "verifier",
            "operation": "verify",
            "executor": "subprocess",
            "max_concurrent": 2,
        },
        {"limit_name": "judge", "operation": "judge", "executor": "inline", "max_concurrent": 4},
    ]
    return json.dumps(
        {
            "component": "bench",
            "server_name": "adaptive",
            "routes": [route],
            "operations": operations,
        }
    )


def run_cell(
    config: dict[str, Any], scenario: dict[str, Any], args: argparse.Namespace, folder: Path
) -> dict[str, Any]:
    """Run one configuration through one scenario; the client's records and the limit's
    samples over time (seconds from the start of the load)."""
    upstream_port, proxy_port = _free_port(), _free_port()
    settings_file = folder / f"settings-{config['name']}.json"
    settings_file.write_text(_settings(config))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GYM_CONCURRENCY_", "OTEL_", "DEMO_"))
    }
    env.update(
        PYTHONPATH=str(PROJECT_ROOT),
        DEMO_SETTINGS_FILE=str(settings_file),
        DEMO_UPSTREAM_BASE_URL=f"http://{HOST}:{upstream_port}/v1",
        OTEL_METRICS_EXPORTER="none",
        OTEL_TRACES_EXPORTER="none",
    )
    python = sys.executable
    processes: list[subprocess.Popen[bytes]] = []
    log = (folder / f"{config['name']}-{scenario['name']}.log").open("wb")
    try:
        processes.append(
            subprocess.Popen(
                _pinned(
                    LOAD_CPU,
                    [
                        python,
                        "-m",
                        "benchmarks.adaptive_upstream",
                        "--port",
                        str(upstream_port),
                        "--knee",
                        str(args.knee),
                        "--base",
                        str(args.base),
                    ],
                ),
                cwd=PROJECT_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        processes.append(
            subprocess.Popen(
                _pinned(
                    SERVER_CPU,
                    [
                        python,
                        "-m",
                        "uvicorn",
                        "examples.fastapi_app.app:app",
                        "--host",
                        HOST,
                        "--port",
                        str(proxy_port),
                        "--loop",
                        "uvloop",
                        "--http",
                        "httptools",
                        "--no-access-log",
                        "--log-level",
                        "warning",
                    ],
                ),
                cwd=PROJECT_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        status_url = f"http://{HOST}:{proxy_port}/concurrency?format=json"
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(status_url)
                _get(f"http://{HOST}:{upstream_port}/stats")
                break
            except OSError as error:
                if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                    message = f"cell {config['name']} did not start; see {log.name}"
                    raise RuntimeError(message) from error
                time.sleep(0.1)
        out = folder / f"records-{config['name']}-{scenario['name']}.json"
        seconds = scenario["seconds"]
        started = time.time()
        load = subprocess.Popen(
            _pinned(
                LOAD_CPU,
                [
                    python,
                    "-m",
                    "benchmarks.adaptive",
                    "--role",
                    "load",
                    "--port",
                    str(proxy_port),
                    "--clients",
                    str(args.clients),
                    "--seconds",
                    str(seconds),
                    "--out",
                    str(out),
                ],
            ),
            cwd=PROJECT_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        samples: list[tuple[float, int, int, int]] = []
        stop = threading.Event()

        def sample() -> None:
            halved = False
            while not stop.is_set():
                now = time.time() - started
                if scenario.get("halve_at") and not halved and now >= scenario["halve_at"]:
                    _post(f"http://{HOST}:{upstream_port}/knee?k={args.knee / 2:g}")
                    halved = True
                with contextlib.suppress(OSError, ValueError):
                    rows = _get(status_url)["limits"]
                    row = next(r for r in rows if r["limit_name"] == LIMIT_NAME)
                    samples.append((now, row["limit"], row["active"], row["queue_depth"]))
                stop.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load.wait(timeout=seconds + 60)
        stop.set()
        sampler.join()
        raw = json.loads(out.read_text())
        records = [(s - started, d - started, status) for s, d, status in raw]
        return {
            "config": config,
            "scenario": scenario["name"],
            "records": records,
            "samples": samples,
        }
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()


# --- figures -----------------------------------------------------------------------------------


def goodput(cell: dict[str, Any], start: float, end: float) -> float:
    ok = sum(1 for _, done, status in cell["records"] if status == 200 and start <= done < end)
    return ok / (end - start)


def p99(cell: dict[str, Any], start: float, end: float) -> float:
    latencies = sorted(
        done - sent
        for sent, done, status in cell["records"]
        if status == 200 and start <= done < end
    )
    if not latencies:
        return math.nan
    return latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]


def failures(cell: dict[str, Any], start: float, end: float) -> int:
    return sum(1 for _, done, status in cell["records"] if status != 200 and start <= done < end)


def mean_limit(cell: dict[str, Any], start: float, end: float) -> float:
    values = [limit for t, limit, _, _ in cell["samples"] if start <= t < end]
    return sum(values) / len(values) if values else math.nan


def recovery(
    cell: dict[str, Any], halve_at: float, target: float, end: float
) -> dict[str, float | None]:
    """How goodput came back after the knee halved, against `target` (the new best static
    limit's goodput): `seconds`, from the halving until goodput over 2 s is within 10% of the
    target again after it first fell below in the 10 s after the halving (0 if it did not
    fall), or None if it never came back; and from then to the end of
    the run: the mean ratio to the target and the lowest and the share within 10% of its
    5-second windows (stepping 1 s)."""
    seconds = [goodput(cell, t, t + 1) for t in range(int(end))]
    start = int(halve_at)
    # The fall the halving causes comes at once (in flight, the old knee's latency): a dip
    # later than 10 s is the new steady state's noise, judged by the figures after recovery.
    dipped = next(
        (
            t
            for t in range(start, min(start + 10, int(end) - 1))
            if (seconds[t] + seconds[t + 1]) / 2 < 0.9 * target
        ),
        None,
    )
    back: int | None = start
    if dipped is not None:
        back = next(
            (
                t
                for t in range(dipped, int(end) - 1)
                if (seconds[t] + seconds[t + 1]) / 2 >= 0.9 * target
            ),
            None,
        )
    if back is None:
        return {
            "seconds": None,
            "mean_after": None,
            "min_5s_after": None,
            "share_5s_within_10pct": None,
        }
    windows = [sum(seconds[t : t + 5]) / 5 / target for t in range(back, int(end) - 4)]
    mean_after = sum(seconds[back:]) / max(1, len(seconds) - back) / target
    return {
        "seconds": float(back - start),
        "mean_after": mean_after,
        "min_5s_after": min(windows) if windows else None,
        "share_5s_within_10pct": sum(w >= 0.9 for w in windows) / len(windows) if windows else None,
    }


def per_second(cell: dict[str, Any], end: float) -> list[list[float]]:
    """[second, goodput, p99 of the oks, failures] for every whole second of the run."""
    return [
        [s, goodput(cell, s, s + 1), p99(cell, s, s + 1), failures(cell, s, s + 1)]
        for s in range(int(end))
    ]


def plot(
    steady: dict[str, Any],
    halve: dict[str, Any],
    static: dict[str, Any],
    halve_at: float,
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 1, figsize=(10, 8), sharex=False)
    for axis, cell, title in (
        (axes[0], steady, "steady knee (K = 32)"),
        (axes[1], halve, f"knee halves to 16 at {halve_at:g} s"),
    ):
        times = [s[0] for s in cell["samples"]]
        axis.step(
            times,
            [s[1] for s in cell["samples"]],
            where="post",
            label="limit",
            color="tab:blue",
            linewidth=2,
        )
        axis.plot(
            times,
            [s[2] for s in cell["samples"]],
            label="in flight (active)",
            color="tab:green",
            linewidth=1,
        )
        axis.plot(
            times,
            [s[3] for s in cell["samples"]],
            label="queued",
            color="tab:gray",
            linewidth=1,
            alpha=0.6,
        )
        axis.set_ylabel("slots / requests")
        axis.set_title(f"adaptive ({cell['config']['algorithm']}): {title}")
        right = axis.twinx()
        end = int(max(times)) if times else 0
        seconds = list(range(end))
        right.plot(
            [s + 0.5 for s in seconds],
            [p99(cell, s, s + 1) for s in seconds],
            color="tab:red",
            label="p99 latency (adaptive)",
            linewidth=1.5,
        )
        if cell is halve:
            right.plot(
                [s + 0.5 for s in seconds],
                [p99(static, s, s + 1) for s in seconds],
                color="tab:orange",
                linestyle="--",
                label=f"p99 latency (static {static['config']['size']})",
            )
            axis.axvline(halve_at, color="black", linestyle=":", linewidth=1)
        right.set_ylabel("p99 latency, s (per second)")
        lines = axis.get_legend_handles_labels()
        more = right.get_legend_handles_labels()
        axis.legend(lines[0] + more[0], lines[1] + more[1], loc="upper right", fontsize=8)
        axis.set_xlabel("seconds")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _median(values: list[float]) -> float:
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return math.nan
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def summarize(rounds: list[list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    """Figures per round, and their medians over rounds (`summary["median"]`)."""
    per_round = [summarize_round(cells, args) for cells in rounds]
    median: dict[str, Any] = {}
    for scenario in ("steady", "halve"):
        names = [r["name"] for r in per_round[0][scenario]]
        rows = []
        for name in names:
            found = [next(r for r in pr[scenario] if r["name"] == name) for pr in per_round]
            row: dict[str, Any] = {"name": name}
            for key in found[0]:
                if key == "name":
                    continue
                if key == "after_recovery":
                    row[key] = {
                        k: (
                            None
                            if any(f[key][k] is None for f in found)
                            else _median([f[key][k] for f in found])
                        )
                        for k in found[0][key]
                    }
                elif key == "recovery_seconds":
                    values = [f[key] for f in found]
                    row[key] = None if None in values else _median(values)
                else:
                    row[key] = _median([f[key] for f in found])
            rows.append(row)
        median[scenario] = rows
    median["goals"] = {
        algorithm: {
            key: (
                None
                if any(pr["goals"][algorithm][key] is None for pr in per_round)
                else _median([pr["goals"][algorithm][key] for pr in per_round])
            )
            for key in per_round[0]["goals"][algorithm]
        }
        for algorithm in per_round[0]["goals"]
    }
    for key in ("best_static", "best_static_after_halving"):
        median[key] = ", ".join(pr[key] for pr in per_round)
    return {"median": median, "rounds": per_round}


def summarize_round(cells: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    warm = args.warmup
    steady = [c for c in cells if c["scenario"] == "steady"]
    halve = [c for c in cells if c["scenario"] == "halve"]
    end_s, end_h, at = args.steady_seconds, args.halve_seconds, args.halve_at
    rows_s = [
        {
            "name": c["config"]["name"],
            "goodput": goodput(c, warm, end_s),
            "p99": p99(c, warm, end_s),
            "failures": failures(c, warm, end_s),
            "mean_limit": mean_limit(c, warm, end_s),
        }
        for c in steady
    ]
    statics = [r for r, c in zip(rows_s, steady, strict=True) if not c["config"].get("algorithm")]
    best = max(statics, key=lambda r: r["goodput"])
    rows_h = []
    for c in halve:
        rows_h.append(
            {
                "name": c["config"]["name"],
                "goodput_before": goodput(c, warm, at),
                "p99_before": p99(c, warm, at),
                "goodput_after": goodput(c, at + 10, end_h),
                "p99_after": p99(c, at + 10, end_h),
                "failures_after": failures(c, at, end_h),
                "mean_limit_after": mean_limit(c, at + 10, end_h),
            }
        )
    statics_h = [r for r, c in zip(rows_h, halve, strict=True) if not c["config"].get("algorithm")]
    best_new = max(statics_h, key=lambda r: r["goodput_after"])
    for r, c in zip(rows_h, halve, strict=True):
        came_back = recovery(c, at, best_new["goodput_after"], end_h)
        r["recovery_seconds"] = came_back["seconds"]
        r["after_recovery"] = {k: v for k, v in came_back.items() if k != "seconds"}
    goals = {}
    for algorithm in ("gradient", "aimd"):
        row = next((r for r in rows_s if r["name"] == algorithm), None)
        row_h = next((r for r in rows_h if r["name"] == algorithm), None)
        if row is None or row_h is None:
            continue
        goals[algorithm] = {
            "steady_goodput_ratio": row["goodput"] / best["goodput"],
            "steady_p99_ratio": row["p99"] / best["p99"],
            "halve_recovery_seconds": row_h["recovery_seconds"],
            "halve_min_5s_after_recovery": row_h["after_recovery"]["min_5s_after"],
            "halve_share_5s_within_10pct": row_h["after_recovery"]["share_5s_within_10pct"],
            "halve_goodput_after_ratio": row_h["goodput_after"] / best_new["goodput_after"],
        }
    return {
        "steady": rows_s,
        "best_static": best["name"],
        "halve": rows_h,
        "best_static_after_halving": best_new["name"],
        "goals": goals,
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def report(summary: dict[str, Any], title: str = "") -> str:
    lines = [
        f"### Steady knee{title}",
        "",
        "| limit | goodput (ok/s) | p99 (s) | failures | mean limit |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in summary["steady"]:
        lines.append(
            f"| {r['name']} | {r['goodput']:.1f} | {r['p99']:.3f} | {r['failures']} | "
            f"{r['mean_limit']:.1f} |"
        )
    lines += [
        "",
        f"Best static: {summary['best_static']}.",
        "",
        f"### Knee halves{title}",
        "",
        "| limit | goodput before | p99 before | goodput after | p99 after | failures "
        "after | mean limit after | recovery (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in summary["halve"]:
        rec = "-" if r["recovery_seconds"] is None else f"{r['recovery_seconds']:.1f}"
        lines.append(
            f"| {r['name']} | {r['goodput_before']:.1f} | {r['p99_before']:.3f} | "
            f"{r['goodput_after']:.1f} | {r['p99_after']:.3f} | {r['failures_after']} | "
            f"{r['mean_limit_after']:.1f} | {rec} |"
        )
    lines += [
        "",
        f"Best static after halving: {summary['best_static_after_halving']}.",
        "",
        f"### Goals{title}",
        "",
        "| algorithm | steady goodput / best static (>= 0.9) | steady p99 / best static "
        "(<= 1.5) | recovery after halving (< 10 s) | goodput after / new best static | "
        "lowest 5 s after recovery | 5 s windows within 10% |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for algorithm, g in summary["goals"].items():
        rec = g["halve_recovery_seconds"]
        lines.append(
            f"| {algorithm} | {g['steady_goodput_ratio']:.3f} | "
            f"{g['steady_p99_ratio']:.3f} | {'never' if rec is None else f'{rec:.1f} s'}"
            f" | {g['halve_goodput_after_ratio']:.3f} | "
            f"{_fmt(g['halve_min_5s_after_recovery'])} | "
            f"{_fmt(g['halve_share_5s_within_10pct'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["driver", "load"], default="driver")
    parser.add_argument("--port", type=int)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--clients", type=int, default=96)
    parser.add_argument("--knee", type=float, default=32)
    parser.add_argument("--base", type=float, default=0.3)
    parser.add_argument("--steady-seconds", type=float, default=40)
    parser.add_argument("--halve-seconds", type=float, default=60)
    parser.add_argument("--halve-at", type=float, default=25)
    parser.add_argument("--warmup", type=float, default=10)
    parser.add_argument("--label", default="after")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--plot", type=Path, default=PLOT)
    args = parser.parse_args()
    if args.role == "load":
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        records = asyncio.run(_load(args.port, args.clients, args.seconds))
        args.out.write_text(json.dumps(records))
        return
    k = int(args.knee)
    steady_sizes = [k // 8, k // 2, 3 * k // 4, 7 * k // 8, k, 9 * k // 8, 5 * k // 4, 4 * k]
    halve_sizes = [k // 4, 3 * k // 8, k // 2, 3 * k // 4, k]
    algorithms = ["gradient", "aimd"]
    if args.quick:
        args.steady_seconds, args.halve_seconds, args.halve_at, args.warmup = 20, 30, 12, 5
        steady_sizes, halve_sizes = [k // 8, k, 4 * k], [k // 2, k]
        args.rounds = 1
    load_start = [round(x, 2) for x in os.getloadavg()]
    rounds: list[list[dict[str, Any]]] = []
    plan = [({"name": f"static-{n}", "size": n}, "steady") for n in steady_sizes]
    plan += [({"name": a, "size": 8, "algorithm": a}, "steady") for a in algorithms]
    plan += [({"name": f"static-{n}", "size": n}, "halve") for n in halve_sizes]
    plan += [({"name": a, "size": 8, "algorithm": a}, "halve") for a in algorithms]
    with tempfile.TemporaryDirectory(prefix="adaptive-bench-") as tmp:
        folder = Path(tmp)
        for number in range(args.rounds):
            cells = []
            # The order flips every round, so that a slow spell of the machine is not one
            # configuration's alone.
            for config, scenario_name in plan if number % 2 == 0 else plan[::-1]:
                scenario = {
                    "name": scenario_name,
                    "seconds": args.steady_seconds
                    if scenario_name == "steady"
                    else args.halve_seconds,
                }
                if scenario_name == "halve":
                    scenario["halve_at"] = args.halve_at
                print(
                    f"# round {number + 1} {scenario_name} {config['name']} "
                    f"(load {os.getloadavg()[0]:.2f})",
                    file=sys.stderr,
                    flush=True,
                )
                cell = run_cell(config, scenario, args, folder)
                cell["load_average"] = [round(x, 2) for x in os.getloadavg()]
                cells.append(cell)
            rounds.append(cells)
    summary = summarize(rounds, args)
    for number, figures in enumerate(summary["rounds"]):
        print(report(figures, f" (round {number + 1})") + "\n")
    print(report(summary["median"], f" (median of {len(rounds)} rounds)"))
    cells = rounds[0]
    steady_gradient = next(
        c for c in cells if c["scenario"] == "steady" and c["config"]["name"] == "gradient"
    )
    halve_gradient = next(
        c for c in cells if c["scenario"] == "halve" and c["config"]["name"] == "gradient"
    )
    old_static = next(
        c for c in cells if c["scenario"] == "halve" and c["config"]["name"] == f"static-{k}"
    )
    plot(steady_gradient, halve_gradient, old_static, args.halve_at, args.plot)
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {
        "label": args.label,
        "source": describe_tree(PROJECT_ROOT),
        "args": {k2: str(v) for k2, v in vars(args).items()},
        "load_average": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "summary": summary,
        "rounds": [
            [
                {
                    "config": c["config"],
                    "scenario": c["scenario"],
                    "samples": c["samples"],
                    "load_average": c["load_average"],
                    "per_second": per_second(
                        c, args.steady_seconds if c["scenario"] == "steady" else args.halve_seconds
                    ),
                }
                for c in cells
            ]
            for cells in rounds
        ],
    }
    path = RESULTS / f"adaptive-{args.label}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {path} and {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
