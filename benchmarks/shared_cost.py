"""A global limit's cost per admission against a process limit's, in the same run.

    python -m benchmarks.shared_cost [--baseline PATH] [--source PATH] [--rounds 3]
        [--label NAME] [--quick] [--analyze] [--budget] [--out DIR]

Configurations, interleaved round by round (the order rotates):

    process           MeteredSemaphore, the library of --source (default: this tree)
    shared            SharedLimit on this benchmark's redis-server, the library of --source
    shared-baseline   the same with the library of --baseline (a checkout: `git worktree add
                      /tmp/before <commit>`), if given: before / after from one run
    shared-budget     `shared` with a rate budget (--budget): each admission reserves 500
                      tokens with its slot and settles 120 (the goal: <= 1.3x `shared`'s
                      client CPU, still one script call for the admission)

each in three modes: `uncontended` (one process, one task: acquire, release), `contended`
(one process, 64 tasks over a limit of 8) and `contended-3proc` (three processes of 22 tasks
over one limit of 8; for the process limit, three limits of 8). Each cell runs in fresh
client processes (`_shared_cost_worker.py`, pinned to CPU 1 with taskset) that warm up, then
make N admissions on a signal; the redis-server (pinned to CPU 0) is read around that
window. Per admission: client CPU (`time.process_time()` of the client processes, heartbeat
thread included), wall time, script calls and Redis commands executed (`INFO commandstats`
deltas: scripts apart, the commands they run counted with the rest, the mailbox's BLPOP too)
and Redis CPU (`INFO cpu`). Reported: medians over rounds, the ratio of each figure to the
process limit's in the same round (median of the per-round ratios), and each figure against
the goals of the design's cost list (DESIGN.md, "What a global limit must survive and
cost"). uvloop is used if installed, hiredis if redis-py finds it (both recorded).

`--analyze` then profiles one uncontended and one contended shared run (cProfile, top 15 by
tottime) and splits the commands Redis ran by script (MONITOR): `_shared_cost_analyze.py`.

Raw runs go to `results/shared-cost-LABEL.json` (not kept in git), the summary to
`results/shared-cost[-LABEL].summary.json`. The machine is shared: trust the same-round ratios
more than the absolute figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._shared_cost_redis import LocalRedis

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CLIENT_CPU, REDIS_CPU = "1", "0"

# mode -> (processes, tasks per process, limit)
MODES: dict[str, tuple[int, int, int]] = {
    "uncontended": (1, 1, 8),
    "contended": (1, 64, 8),
    "contended-3proc": (3, 22, 8),
}
# figure -> (mode -> goal): the contract's cost list (at most)
GOALS: dict[str, dict[str, float]] = {
    "client_cpu_us": {"uncontended": 250, "contended": 400, "contended-3proc": 400},
    "script_calls": {"uncontended": 2, "contended": 2, "contended-3proc": 2},
    "redis_commands": {"uncontended": 12, "contended": 15, "contended-3proc": 15},
    "redis_cpu_us": {"contended": 80, "contended-3proc": 80},
}
FIGURES = ("client_cpu_us", "wall_us", "script_calls", "redis_commands", "redis_cpu_us")


def _pinned(command: list[str]) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", CLIENT_CPU, *command]
    return command


class Cell:
    """The client processes of one configuration in one mode, started and warmed up."""

    def __init__(self, library: Path, config: str, mode: str, **options: Any) -> None:
        processes, tasks, limit = MODES[mode]
        self.folder = tempfile.mkdtemp(prefix="shared-cost-")
        # Only the package comes from `library`: the working folder is first on sys.path,
        # ahead of this tree (on PYTHONPATH for the worker's own module).
        (Path(self.folder) / "gym_concurrency").symlink_to(library / "gym_concurrency")
        self.library = library
        command = [sys.executable, "-m", "benchmarks._shared_cost_worker"]
        command += ["--config", config, "--tasks", str(tasks), "--limit", str(limit)]
        command += ["--admissions", str(options["admissions"] // processes)]
        if config == "shared":
            command += ["--redis-url", options["redis_url"], "--key", options["key"]]
        if options.get("budget"):
            command.append("--budget")
        if options.get("no_uvloop"):
            command.append("--no-uvloop")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.workers = []
        for index in range(processes):
            profile = options.get("profile")
            extra = ["--profile", f"{profile}.{index}"] if profile else []
            self.workers.append(
                subprocess.Popen(
                    _pinned([*command, *extra]),
                    cwd=self.folder,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        try:
            for worker in self.workers:
                self._expect(worker, "ready")
        except BaseException:
            for worker in self.workers:
                worker.kill()
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    @staticmethod
    def _expect(worker: subprocess.Popen[str], word: str) -> str:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        if not line.startswith(word):
            worker.kill()
            raise RuntimeError(f"a worker said {line!r} instead of {word!r}")
        return line

    def go(self) -> list[dict[str, Any]]:
        for worker in self.workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        results = [json.loads(self._expect(worker, "{")) for worker in self.workers]
        for result in results:
            loaded = Path(result["library"]).resolve()
            if not loaded.is_relative_to(self.library.resolve() / "gym_concurrency"):
                raise RuntimeError(f"gym_concurrency came from {loaded}, not {self.library}")
        return results

    def close(self) -> None:
        for worker in self.workers:
            assert worker.stdin is not None
            worker.stdin.write("close\n")
            worker.stdin.close()
        for worker in self.workers:
            worker.wait(30)
        shutil.rmtree(self.folder, ignore_errors=True)


def measure(
    redis: LocalRedis, library: Path, config: str, mode: str, **options: Any
) -> dict[str, Any]:
    """One cell: its figures per admission (and the raw counts)."""
    kind = "process" if config == "process" else "shared"
    around = options.pop("around", None) or contextlib.nullcontext
    budget = config == "shared-budget"
    cell = Cell(library, kind, mode, redis_url=redis.url, budget=budget, **options)
    try:
        with around():  # (the analysis's MONITOR: the measured window only)
            before = redis.snapshot()
            results = cell.go()
            redis_delta = redis.snapshot().since(before)
    finally:
        cell.close()
    admissions = sum(r["admissions"] for r in results)
    per = 1e6 / admissions
    script_calls: dict[str, float] = {}
    for result in results:
        for name, count in (result["script_calls"] or {}).items():
            script_calls[name] = script_calls.get(name, 0) + count / admissions
    commands = redis_delta["commands"] if kind == "shared" else {}
    return {
        "admissions": admissions,
        "client_cpu_us": sum(r["cpu_s"] for r in results) * per,
        "wall_us": max(r["wall_s"] for r in results) * per,
        "script_calls": redis_delta["script_calls"] / admissions if kind == "shared" else 0.0,
        "redis_commands": sum(commands.values()) / admissions,
        "redis_cpu_us": redis_delta["cpu_s"] * per if kind == "shared" else 0.0,
        "commands_per_admission": {k: v / admissions for k, v in sorted(commands.items())},
        "client_script_calls_per_admission": script_calls,
        "loop": results[0]["loop"],
        "hiredis": results[0]["hiredis"],
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(runs: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    keys = sorted({(r["config"], r["mode"]) for r in runs})
    for config, mode in keys:
        rows = [r for r in runs if (r["config"], r["mode"]) == (config, mode)]
        cell: dict[str, Any] = {f: round(_median([r[f] for r in rows]), 2) for f in FIGURES}
        names = sorted({k for r in rows for k in r["commands_per_admission"]})
        cell["commands_per_admission"] = {
            k: round(_median([r["commands_per_admission"].get(k, 0) for r in rows]), 2)
            for k in names
        }
        cell["rounds"] = len(rows)
        cells[f"{config}/{mode}"] = cell
        if config == "process":
            continue
        per_round = []
        for row in rows:
            base = [
                r
                for r in runs
                if (r["config"], r["mode"], r["round"]) == ("process", mode, row["round"])
            ]
            if base:
                per_round.append({f: row[f] / base[0][f] for f in ("client_cpu_us", "wall_us")})
        ratios[f"{config}/{mode}"] = {
            f"{f}_over_process": round(_median([p[f] for p in per_round]), 1)
            for f in ("client_cpu_us", "wall_us")
        }
    goals: dict[str, Any] = {}
    for config in sorted({c for c, _ in keys} - {"process"}):
        for figure, by_mode in GOALS.items():
            for mode, goal in by_mode.items():
                found = cells.get(f"{config}/{mode}")
                if found is not None:
                    value = found[figure]
                    goals.setdefault(config, {})[f"{figure}/{mode}"] = {
                        "value": value,
                        "goal_at_most": goal,
                        "met": value <= goal,
                    }
    summary = {**meta, "cells": cells, "ratios_to_process_same_round": ratios, "goals": goals}
    if any(c == "shared-baseline" for c, _ in keys):
        summary["shared_over_baseline_same_round"] = _over(runs, "shared", "shared-baseline")
    if any(c == "shared-budget" for c, _ in keys):
        summary["budget_over_shared_same_round"] = _over(runs, "shared-budget", "shared")
    return summary


def _over(runs: list[dict[str, Any]], measured: str, base: str) -> dict[str, Any]:
    """Per mode, the median over rounds of each figure of `measured` over `base`'s in the
    same round (after / before, or with a budget / without)."""
    out: dict[str, Any] = {}
    for mode in MODES:
        pairs = [
            (a, b)
            for a in runs
            for b in runs
            if (a["config"], b["config"]) == (measured, base)
            and a["mode"] == b["mode"] == mode
            and a["round"] == b["round"]
        ]
        out[mode] = {f: round(_median([a[f] / b[f] for a, b in pairs if b[f]]), 3) for f in FIGURES}
    return out


def _table(summary: dict[str, Any]) -> str:
    lines = [
        "| configuration / mode | client CPU us | wall us | script calls | Redis commands "
        "| Redis CPU us | CPU x process |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, cell in summary["cells"].items():
        ratio = summary["ratios_to_process_same_round"].get(name, {})
        lines.append(
            f"| {name} | {cell['client_cpu_us']:.1f} | {cell['wall_us']:.1f} | "
            f"{cell['script_calls']:.2f} | {cell['redis_commands']:.1f} | "
            f"{cell['redis_cpu_us']:.1f} | {ratio.get('client_cpu_us_over_process', '-')} |"
        )
    return "\n".join(lines)


def _git(tree: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout: shared-baseline")
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree measured")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--admissions", type=int, default=2000, help="per cell (x10: process)")
    parser.add_argument("--label", default="")
    parser.add_argument("--quick", action="store_true", help="1 round, 200 admissions")
    parser.add_argument("--analyze", action="store_true", help="then profile and MONITOR")
    parser.add_argument("--budget", action="store_true", help="and shared-budget")
    parser.add_argument("--no-uvloop", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.admissions = 1, 200
    trees = {"process": args.source.resolve(), "shared": args.source.resolve()}
    if args.baseline is not None:
        trees["shared-baseline"] = args.baseline.resolve()
    if args.budget:
        trees["shared-budget"] = args.source.resolve()
    for tree in trees.values():
        if not (tree / "gym_concurrency").is_dir():
            parser.error(f"{tree} has no gym_concurrency package")
    redis = LocalRedis(REDIS_CPU if (os.cpu_count() or 1) >= 2 else None)
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        redis.wait_older_than(5)
        configs = list(trees)
        for round_ in range(args.rounds):
            order = configs[round_ % len(configs) :] + configs[: round_ % len(configs)]
            for mode in MODES:
                for config in order:
                    count = args.admissions * (10 if config == "process" else 1)
                    row = measure(
                        redis,
                        trees[config],
                        config,
                        mode,
                        admissions=count,
                        key=f"cost-{config}-{mode}-{round_}",
                        no_uvloop=args.no_uvloop,
                    )
                    runs.append({"config": config, "mode": mode, "round": round_, **row})
                    print(
                        f"round {round_ + 1} {config}/{mode}: client {row['client_cpu_us']:.0f} "
                        f"us, Redis {row['redis_cpu_us']:.0f} us, "
                        f"{row['redis_commands']:.1f} commands",
                        file=sys.stderr,
                        flush=True,
                    )
        analysis = None
        if args.analyze:
            from benchmarks._shared_cost_analyze import analyze

            analysis = analyze(redis, trees["shared"], args.admissions, measure)
    finally:
        redis.stop()
    meta = {
        "label": args.label,
        "commits": {
            name: _git(tree, "rev-parse", "--short", "HEAD")
            + ("+changes" if _git(tree, "status", "--short", "gym_concurrency") else "")
            for name, tree in trees.items()
        },
        "libraries": {name: str(tree) for name, tree in trees.items()},
        "python": sys.version.split()[0],
        "redis": redis.version,
        "loop": runs[0]["loop"],
        "hiredis": runs[0]["hiredis"],
        "rounds": args.rounds,
        "admissions_per_cell": args.admissions,
        "modes": {
            m: dict(zip(("processes", "tasks", "limit"), v, strict=True)) for m, v in MODES.items()
        },
        "pinned": {"redis_cpu": REDIS_CPU if redis.pinned else None, "client_cpu": CLIENT_CPU},
        "load_average": os.getloadavg(),
        "seconds": round(time.monotonic() - started, 1),
        "machine": f"{os.cpu_count()} CPUs, shared with other jobs: figures are noisy",
    }
    summary = summarize(runs, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.label}" if args.label else ""
    raw = {"summary": summary, "runs": runs, "analysis": analysis}
    (args.out / f"shared-cost{suffix}.json").write_text(json.dumps(raw, indent=1) + "\n")
    (args.out / f"shared-cost{suffix}.summary.json").write_text(
        json.dumps(summary, indent=1) + "\n"
    )
    print(_table(summary))
    if analysis is not None:
        print(analysis["report"])


if __name__ == "__main__":
    main()
