"""Fair queuing by flow across OS processes through one Redis (issue 25's fairness goals).

Two parts, each configuration interleaved in rounds, a fresh limit key per cell:

- `quiet`: a limit of 16 shared by three processes. Two flood it (128 closed-loop callers
  each, 16x the limit together), the third sends a quiet flow (Poisson, 25 calls/s); every
  call holds its slot uniform(10, 30) ms. `alone` (the quiet flow only), `one-flow` (all in
  the default flow: one FIFO queue), `flows` (flood / quiet). Goal: the quiet flow's p99
  latency (arrival to release) with flows within 1.5x of alone.
- `fair`: a limit of 32 shared by three processes, each its own flow with 64 closed-loop
  callers asking for weight 1, 2 and 4. Jain's index of the time-averaged weight each flow
  holds: goal >= 0.95 with flows (`one-flow`, by arrival, for comparison).

Every cell also checks the witness: the calls' [admitted, released] intervals, summed by
weight across processes, never above the limit. Raw cells in results/shared-flows.json (not
kept), the summary in results/shared-flows.summary.json, the tables printed.

    .venvs/3.11/bin/python -m benchmarks.shared_flows [--rounds 3] [--seconds 15] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks._shared_cost_redis import LocalRedis

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
QUIET_CONFIGS = ("alone", "one-flow", "flows")
FAIR_CONFIGS = ("one-flow", "flows")
FAIR_WEIGHTS = (1, 2, 4)


def _workers(part: str, config: str) -> list[list[str]]:
    """Each process's worker arguments for one cell."""
    if part == "quiet":
        quiet = ["--limit", "16", "--rate", "25", "--flow", "" if config == "one-flow" else "quiet"]
        if config == "alone":
            return [quiet]
        flood = ["--limit", "16", "--callers", "128"]
        flood += ["--flow", "" if config == "one-flow" else "flood"]
        return [flood, flood, quiet]
    flows = {weight: "" if config == "one-flow" else f"f{weight}" for weight in FAIR_WEIGHTS}
    return [
        ["--limit", "32", "--callers", "64", "--weight", str(weight), "--flow", flows[weight]]
        for weight in FAIR_WEIGHTS
    ]


def run_cell(redis: LocalRedis, part: str, config: str, args: argparse.Namespace) -> dict[str, Any]:
    key = f"bench-flows-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(args.source)}
    base = [sys.executable, "-m", "benchmarks._shared_flows_worker", "--redis-url", redis.url]
    base += ["--key", key, "--warmup", str(args.warmup), "--seconds", str(args.seconds)]
    processes, outs = [], []
    folder = Path(tempfile.mkdtemp(prefix="shared-flows-"))
    for index, extra in enumerate(_workers(part, config)):
        outs.append(folder / f"worker-{index}.json")
        command = [*base, *extra, "--seed", str(index), "--out", str(outs[-1])]
        processes.append(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for process in processes:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("a worker did not start")
    start = time.monotonic() + 0.3
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(f"go {start}\n")
        process.stdin.flush()
    results = []
    for process, out in zip(processes, outs, strict=True):
        assert process.stdout is not None
        if process.stdout.readline().strip() != "done":
            raise RuntimeError("a worker failed")
        process.wait(30)
        results.append(json.loads(out.read_text()))
        out.unlink()
    folder.rmdir()
    window = (start + args.warmup, start + args.warmup + args.seconds)
    return {"part": part, "config": config, "window": window, "workers": results}


def witness_peak(cell: dict[str, Any]) -> int:
    """The most weight held at once across processes, from the calls' intervals."""
    events = []
    for worker in cell["workers"]:
        for _, admitted, released in worker["calls"]:
            events += [(admitted, 1, worker["weight"]), (released, 0, -worker["weight"])]
    held = peak = 0
    for _, _, delta in sorted(events):  # (a release before an admission at the same time)
        held += delta
        peak = max(peak, held)
    return peak


def held_in_window(calls: list[list[float]], weight: int, window: tuple[float, float]) -> float:
    """The time-averaged weight these calls held within `window`."""
    start, end = window
    total = sum(max(0.0, min(r, end) - max(a, start)) for _, a, r in calls)
    return weight * total / (end - start)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cell_figures(cell: dict[str, Any]) -> dict[str, Any]:
    start, end = cell["window"]
    figures: dict[str, Any] = {"witness_peak": witness_peak(cell)}
    if cell["part"] == "quiet":
        quiet = cell["workers"][-1]["calls"]
        latencies = [r - a for a, _, r in quiet if start <= a < end]
        figures["quiet_calls"] = len(latencies)
        figures["quiet_p50_ms"] = 1000 * percentile(latencies, 0.5)
        figures["quiet_p99_ms"] = 1000 * percentile(latencies, 0.99)
        flood = [c for worker in cell["workers"][:-1] for c in worker["calls"]]
        figures["flood_per_s"] = sum(start <= r < end for *_, r in flood) / (end - start)
    else:
        held = [held_in_window(w["calls"], w["weight"], (start, end)) for w in cell["workers"]]
        figures["held_by_flow"] = held
        figures["jain"] = sum(held) ** 2 / (len(held) * sum(h * h for h in held))
    return figures


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    rounds = max(c["round"] for c in cells) + 1
    for part, configs in (("quiet", QUIET_CONFIGS), ("fair", FAIR_CONFIGS)):
        for config in configs:
            mine = [c for c in cells if c["part"] == part and c["config"] == config]
            if not mine:
                continue
            keys = [k for k, v in mine[0]["figures"].items() if isinstance(v, int | float)]
            row = {k: statistics.median(c["figures"][k] for c in mine) for k in keys}
            row["witness_peak"] = max(c["figures"]["witness_peak"] for c in mine)
            if part == "quiet" and config != "alone":
                ratios = []
                for r in range(rounds):
                    alone = [c for c in cells if c["round"] == r and c["config"] == "alone"]
                    this = [c for c in mine if c["round"] == r]
                    if alone and this:
                        base = alone[0]["figures"]["quiet_p99_ms"]
                        ratios.append(this[0]["figures"]["quiet_p99_ms"] / base)
                row["p99_over_alone"] = statistics.median(ratios) if ratios else None
                row["p99_over_alone_rounds"] = ratios
            if part == "fair":
                row["jain_rounds"] = [c["figures"]["jain"] for c in mine]
            summary[f"{part}/{config}"] = row
    return summary


def table(summary: dict[str, Any]) -> str:
    lines = ["| cell | quiet p50 / p99 ms | p99 / alone | flood calls/s | Jain | witness peak |"]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, row in summary.items():
        quiet = (
            f"{row['quiet_p50_ms']:.1f} / {row['quiet_p99_ms']:.1f}"
            if "quiet_p99_ms" in row
            else "-"
        )
        ratio = row.get("p99_over_alone")
        lines.append(
            f"| {name} | {quiet} | {'-' if ratio is None else f'{ratio:.2f}'} | "
            f"{row.get('flood_per_s', 0):.0f} | {row.get('jain', float('nan')):.3f} | "
            f"{row['witness_peak']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree measured")
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s cells")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.warmup = 1, 3.0, 1.0
    redis = LocalRedis(cpu="0" if (os.cpu_count() or 1) >= 2 else None)
    cells = []
    try:
        redis.wait_older_than(4)  # (a younger Redis starts a grace period)
        for number in range(args.rounds):
            for part, configs in (("quiet", QUIET_CONFIGS), ("fair", FAIR_CONFIGS)):
                for config in configs:
                    cell = run_cell(redis, part, config, args)
                    cell["round"] = number
                    cell["figures"] = cell_figures(cell)
                    print(number, part, config, json.dumps(cell["figures"]), flush=True)
                    cells.append(cell)
    finally:
        redis.stop()
    summary = summarize(cells)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shared-flows.json").write_text(json.dumps(cells))
    meta = {"rounds": args.rounds, "seconds": args.seconds, "python": sys.version.split()[0]}
    (args.out / "shared-flows.summary.json").write_text(
        json.dumps({"meta": meta, "cells": summary}, indent=1) + "\n"
    )
    print(table(summary))


if __name__ == "__main__":
    main()
