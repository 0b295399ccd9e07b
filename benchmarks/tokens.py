"""Limits in tokens: a count limit against a token-weighted one, on an upstream whose capacity
is in tokens.

The upstream (benchmarks/_tokens_upstream.py, real uvicorn, CPU 0) holds at most 64,000 tokens
of "KV cache" at once and answers 429 at once above that; a call holds its tokens for --base-ms
+ --us-per-token a token (default 20 ms + 4 µs, far faster than a real model; `--base-ms 100
--us-per-token 40` is closer to one). 128 closed-loop callers (benchmarks/_tokens_client.py,
aiohttp, CPU 1) make chat completion calls of log-uniform sizes between 100 and 16,000 tokens
(mean ~3,130), each attempt inside a MeteredSemaphore; a 429 gives the limit back and retries
the same call after 0.1 s. Four configurations, interleaved in rounds (the order rotates), one fresh
upstream per cell:

    count-mean          MeteredSemaphore(capacity / mean size) = 20, weight 1
    count-largest       MeteredSemaphore(capacity / largest size) = 4, weight 1
    weighted            MeteredSemaphore(64000), weight = openai_tokens(body)
    weighted+backfill   the same with backfill_seconds=--backfill-seconds (default: the
                        service time of the largest call)

Reported per configuration (medians over rounds): the upstream's time-averaged tokens in flight
/ its capacity (its utilisation, exact: integrated at every change), per second too; its 429s;
calls and tokens completed a second; latency per call (retries included); the tokens the
callers held, time-averaged (what the limit admitted). Goal: `weighted` keeps the upstream at
>= 0.95 of its capacity with 0 429s (with backfill too), where the count limits overload it
(429s) or leave >= 30% of it idle.

    .venvs/3.11/bin/python -m benchmarks.tokens [--rounds 3] [--seconds 20] [--warmup 2]
        [--base-ms 20] [--us-per-token 4] [--backfill-seconds S] [--configs a,b]
        [--source TREE] [--label NAME] [--quick]

Writes benchmarks/results/tokens-LABEL.json (raw) and tokens-LABEL.summary.json; prints a
Markdown table. 127.0.0.1 only; every cell is bounded (warm-up + window).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._goal_parts import CLIENT_CPU, FakeUpstream
from benchmarks._results import RunStart, goals_line, with_outcome, write_results
from benchmarks._source import PROJECT_ROOT, describe_tree
from benchmarks.overload import load_average, pinned, wait_until_quiet

CAPACITY, MIN_TOKENS, MAX_TOKENS, CALLERS = 64_000, 100, 16_000, 128
CONFIGS = ("count-mean", "count-largest", "weighted", "weighted+backfill")
WEIGHTED = ("weighted", "weighted+backfill")
BASE_MS, US_PER_TOKEN = 20.0, 4.0
GOALS = {"weighted_utilisation": 0.95, "weighted_429": 0, "count_idle": 0.30}


def mean_size(low: int, high: int) -> float:
    """The mean of round(exp(uniform(ln low, ln high))): (high - low) / ln(high / low)."""
    return (high - low) / math.log(high / low)


def limits(capacity: int, low: int, high: int) -> dict[str, int]:
    return {
        "count-mean": max(1, round(capacity / mean_size(low, high))),
        "count-largest": max(1, capacity // high),
        "weighted": capacity,
        "weighted+backfill": capacity,
    }


def start_upstream(args: argparse.Namespace) -> FakeUpstream:
    """benchmarks/_tokens_upstream.py, pinned to CPU 0, on a free port of 127.0.0.1."""
    served = ["--capacity", str(args.capacity)]
    served += ["--base-ms", str(args.base_ms), "--us-per-token", str(args.us_per_token)]
    return FakeUpstream(args.python, "benchmarks._tokens_upstream", served)


def cell(args: argparse.Namespace, config: str, limit: int, seed: int) -> dict[str, Any]:
    upstream = start_upstream(args)
    try:
        command = [args.python, "-m", "benchmarks._tokens_client", "--port", str(upstream.port)]
        command += ["--config", "weighted" if config in WEIGHTED else "count"]
        if config == "weighted+backfill":
            command += ["--backfill-seconds", str(args.backfill_seconds)]
        command += ["--limit", str(limit), "--callers", str(args.callers)]
        command += ["--min-tokens", str(args.min_tokens), "--max-tokens", str(args.max_tokens)]
        command += ["--warmup", str(args.warmup), "--seconds", str(args.seconds)]
        command += ["--seed", str(seed), "--source", str(args.source)]
        done = subprocess.run(
            pinned(CLIENT_CPU, command),
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=args.warmup + args.seconds + 60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"client failed ({done.returncode}):\n{done.stderr}")
        return dict(json.loads(done.stdout))
    finally:
        upstream.stop()


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    by = {(c["round"], c["name"]): c for c in cells}
    rounds = sorted({c["round"] for c in cells})
    out: dict[str, Any] = {}
    for name in CONFIGS:
        mine = [by[(r, name)] for r in rounds if (r, name) in by]
        if not mine:
            continue
        per_second = [u for c in mine for u in c["utilisation_per_second"]]
        token_ratios = [
            by[(r, name)]["tokens_per_second"] / by[(r, "weighted")]["tokens_per_second"]
            for r in rounds
            if (r, name) in by and (r, "weighted") in by
        ]
        out[name] = {
            "limit": mine[0]["limit"],
            "rounds": len(mine),
            "utilisation": _median([c["utilisation"] for c in mine]),
            "utilisation_rounds": [round(c["utilisation"], 4) for c in mine],
            "utilisation_per_second_min": min(per_second) if per_second else None,
            "utilisation_per_second_p10": (
                sorted(per_second)[len(per_second) // 10] if per_second else None
            ),
            "utilisation_per_second_max": max(per_second) if per_second else None,
            "client_held_utilisation": _median([c["client_held_utilisation"] for c in mine]),
            "upstream_429_per_round": [c["upstream_429"] for c in mine],
            "upstream_429_per_second": _median([c["upstream_429"] / c["window_s"] for c in mine]),
            "upstream_max_in_flight": max(c["upstream_max_in_flight"] for c in mine),
            "backfilled_per_second": _median([c["backfilled"] / c["window_s"] for c in mine]),
            "attempts_per_call": _median(
                [c["attempts"] / max(1, c["calls_per_second"] * c["window_s"]) for c in mine]
            ),
            "calls_per_second": _median([c["calls_per_second"] for c in mine]),
            "tokens_per_second": _median([c["tokens_per_second"] for c in mine]),
            "tokens_per_second_vs_weighted": _median(token_ratios),
            "p50_s": _median([c["p50_s"] for c in mine]),
            "p99_s": _median([c["p99_s"] for c in mine]),
            "client_cpu_max": round(max(c["client_cpu"] for c in mine), 3),
            "client_other_failures": sum(c["client_other_failures"] for c in mine),
            "leaked_after": [c["leaked_after"] for c in mine],
        }
    return out


def verdicts(summary: dict[str, Any]) -> dict[str, Any]:
    """Each goal, met or not, from the summary."""
    out: dict[str, Any] = {}
    for name in WEIGHTED:
        weighted = summary.get(name)
        if weighted:
            out[f"{name}_utilisation>=0.95"] = weighted["utilisation"] >= 0.95
            out[f"{name}_0_429"] = sum(weighted["upstream_429_per_round"]) == 0
    for name in ("count-mean", "count-largest"):
        row = summary.get(name)
        if row:
            overloads = sum(row["upstream_429_per_round"]) > 0
            idle = 1 - row["utilisation"] >= GOALS["count_idle"]
            out[f"{name}_overloads_or_idle>=0.30"] = overloads or idle
    return out


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| limit | upstream utilisation (rounds; per-second min) | idle | upstream 429/s | "
        "attempts / call | tokens/s (vs weighted) | calls/s | p50 / p99 | callers held | "
        "backfilled/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in summary.items():
        rounds = ", ".join(f"{u:.3f}" for u in row["utilisation_rounds"])
        lines.append(
            f"| {name} ({row['limit']}) | {row['utilisation']:.3f} ({rounds}; "
            f"{row['utilisation_per_second_min']:.3f}) | {1 - row['utilisation']:.2f} | "
            f"{row['upstream_429_per_second']:.1f} | {row['attempts_per_call']:.2f} | "
            f"{row['tokens_per_second']:,.0f} ({row['tokens_per_second_vs_weighted']:.2f}) | "
            f"{row['calls_per_second']:.0f} | {row['p50_s'] * 1000:.0f} / "
            f"{row['p99_s'] * 1000:.0f} ms | {row['client_held_utilisation']:.3f} | "
            f"{row['backfilled_per_second']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", default=str(PROJECT_ROOT), help="the tree to measure")
    parser.add_argument("--label", default="run", help="names the JSON files")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--capacity", type=int, default=CAPACITY)
    parser.add_argument("--callers", type=int, default=CALLERS)
    parser.add_argument("--min-tokens", type=int, default=MIN_TOKENS)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--base-ms", type=float, default=BASE_MS, help="upstream service time")
    parser.add_argument("--us-per-token", type=float, default=US_PER_TOKEN, help="and per token")
    parser.add_argument(
        "--backfill-seconds", type=float, default=None, help="default: the largest call's service"
    )
    parser.add_argument("--configs", default=",".join(CONFIGS), help="which, comma-separated")
    parser.add_argument("--wait-quiet", type=float, default=20.0, help="s, before each round")
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s cells: a smoke run")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", default=None, help="default: results/tokens-LABEL.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.warmup, args.wait_quiet = 1, 3.0, 1.0, 0.0
    if not 1 <= args.rounds <= 20 or not 0 < args.seconds <= 120:
        sys.exit("--rounds must be in [1, 20] and --seconds in (0, 120]")
    if args.max_tokens > args.capacity:
        sys.exit("--max-tokens must not exceed --capacity")
    args.source = str(Path(args.source).resolve())
    if args.backfill_seconds is None:
        args.backfill_seconds = round((args.base_ms + args.us_per_token * args.max_tokens) / 1e3, 3)
    configs = tuple(c for c in CONFIGS if c in args.configs.split(","))
    if not configs or len(configs) != len(args.configs.split(",")):
        sys.exit(f"--configs: a comma-separated list of {', '.join(CONFIGS)}")
    sizes = limits(args.capacity, args.min_tokens, args.max_tokens)
    start = RunStart()
    cells: list[dict[str, Any]] = []
    for index in range(args.rounds):
        seed = index + 1
        order = list(configs[index % len(configs) :] + configs[: index % len(configs)])
        busy = wait_until_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
        print(f"round {index + 1}/{args.rounds}: load {load_average()}, {busy} busy", flush=True)
        for name in order:
            one = cell(args, name, sizes[name], seed)
            one.update(round=index, name=name, seed=seed, load=load_average())
            cells.append(one)
            print(
                f"  {name:14s} limit {sizes[name]:6d}  utilisation {one['utilisation']:.3f} "
                f"(callers held {one['client_held_utilisation']:.3f})  "
                f"429 {one['upstream_429']:5d}  {one['tokens_per_second']:9,.0f} tokens/s"
                f"  {one['calls_per_second']:5.0f} calls/s  p99 {one['p99_s'] * 1000:.0f}"
                f" ms  client cpu {one['client_cpu']:.2f}",
                flush=True,
            )
    summary = summarize(cells)
    head: dict[str, Any] = {
        "benchmark": "tokens",
        "label": args.label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "python": sys.version.split()[0],
        "source": describe_tree(Path(args.source)),
        "gym_concurrency_files": cells[0].get("gym_concurrency_files") if cells else None,
        "settings": {
            "capacity_tokens": args.capacity,
            "call_tokens": [args.min_tokens, args.max_tokens, "log-uniform"],
            "mean_call_tokens": round(mean_size(args.min_tokens, args.max_tokens), 1),
            "service_s": f"{args.base_ms / 1e3:g} + {args.us_per_token / 1e6:g} * tokens",
            "backfill_seconds": args.backfill_seconds,
            "callers": args.callers,
            "retry_pause_s": 0.1,
            "limits": sizes,
            "rounds": args.rounds,
            "warmup_s": args.warmup,
            "seconds": args.seconds,
        },
    }
    result = with_outcome(head, GOALS, start, summary, verdicts(summary))
    for c in cells:
        c.pop("gym_concurrency_files", None)
    path, summary_path = write_results(result, cells, args.json, f"tokens-{args.label}.json")
    print()
    print(
        f"source {result['source']['commit'][:12]}; load {start.load_average} -> "
        f"{result['load_average_end']}; {result['seconds'] / 60:.1f} min"
    )
    print()
    print(table(summary))
    print()
    print(goals_line(verdicts(summary)))
    print(f"\nraw: {path}\nsummary: {summary_path}")


if __name__ == "__main__":
    main()
