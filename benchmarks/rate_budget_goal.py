"""Issue 35's rate-budget goal: a hosted provider at 60,000 TPM / 500 RPM, 4 client processes,
mixed calls of 100-16,000 tokens, 5 minutes: 0 upstream 429s and >= 0.95 of the token quota
used with a global budget, today's fixed and AIMD limits side by side.

The provider is benchmarks/_fake_provider.py (a sliding one-minute window, real 429s with
Retry-After; `--completion-share` of `max_tokens` used, so a call uses less than its
estimate), on CPU 0. Each of `--processes` client processes (benchmarks/_rate_budget_client.py,
CPU 1) runs `--callers` closed-loop callers through one configured client limit
(`ClientLimit`, httpx transport, the default retry policy), built from the settings a server
would have:

    fixed          max_concurrent=--slots a process
    aimd           the same, adaptive AIMD in [1, 4x --slots] on 429 / 503 only (latency
                   ignored: call sizes vary 160x)
    budget-global  tokens_per_minute=--tpm, requests_per_minute=--rpm, tokens=openai_tokens,
                   scope global on a redis-server of this run (--slots x processes slots)
    budget-backfill  budget-global with backfill_seconds=--backfill (10): while the budget
                   alone holds the oldest call back, lighter ones that fit pass it, never
                   making it wait more than that past the moment the budget would take it
    budget-local   each process 1/processes of the budget, --slots slots, scope process

Configurations run one after another (a fresh provider each; the order rotates over
`--rounds`). Reported per configuration: the provider's 429s, the fraction of the token quota
used (tokens served in each whole provider minute after the first, the ramp, / --tpm; and
over the whole run), calls completed and failed, p50 / p95 latency of the completed calls.
The budget configurations need issue 35's wiring: without it they stop before anything
starts, saying what is missing.

`--faults` (with `--configs budget-global` or `budget-backfill` alone) injects three faults
at 25 %, 50 % and 75 % of `--seconds`: kill -9 of one client process (a replacement with the
same arguments, but the seconds left, starts at once, as a supervisor would restart a
replica: 4 processes keep calling and a newcomer joins a budget already spent), a restart of
the redis-server on the same port (stopped and started: no persistence, its state lost) and
key loss (every key of the limit deleted while it runs). The provider then meters
`--provider-factor` (2) x the budget, so that what the budget lets through is served and
counted, not refused. Reported besides:
the most tokens and requests the provider served in any 60-s window (sliding, from its
`GET /calls`), each / the budget, the overshoot (max(0, most / budget - 1), the worse of the
two; goal <= 0.02), when each fault happened and what followed it.

    .venvs/3.11/bin/python -m benchmarks.rate_budget_goal [--configs fixed,aimd,budget-global,
        budget-backfill,budget-local] [--seconds 300] [--rounds 1] [--label NAME]
        [--source TREE] [--quick] [--faults [--provider-factor 2]] [--backfill 10]

`--source TREE` measures another checkout's library (a merge of issue 35's branches, say)
without installing it (benchmarks/_source.py); the clients check that nothing else loaded.

Writes results/rate-budget-goal-LABEL.json (raw) and .summary.json (LABEL: `run`, `faults`
with --faults); prints a Markdown table.
127.0.0.1 only; every run bounded by --seconds.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._goal_parts import (
    STARTUP_S,
    FakeUpstream,
    by_config,
    chosen_configs,
    clients_figures,
    get_json,
    missing_wiring,
    release,
    rounds,
    run_clients,
    start_clients,
    wiring_error,
)
from benchmarks._results import RunStart, run_header, with_outcome, write_and_print
from benchmarks._shared_cost_redis import LocalRedis
from benchmarks._source import PROJECT_ROOT, use_source_tree
from benchmarks.overload import load_average

CONFIGS = ("fixed", "aimd", "budget-global", "budget-backfill", "budget-local")
GLOBAL_CONFIGS = ("budget-global", "budget-backfill")  # a budget shared on a Redis of the run
BUDGET_FIELDS = ("tokens_per_minute", "requests_per_minute", "tokens")
GOALS = {"budget_global_429": 0, "budget_global_quota_used": 0.95}
SETTINGS = (
    "seconds",
    "rounds",
    "processes",
    "callers",
    "slots",
    "tpm",
    "rpm",
    "backfill",
)  # in the JSON
CLIENT = "benchmarks._rate_budget_client"
FAULT_GOALS = {"budget_global_overshoot": 0.02}
FAULT_AT = (0.25, 0.50, 0.75)  # of --seconds: kill -9 a client, restart Redis, lose the keys
FAULT_NAMES = ("kill -9 of a client", "Redis restart", "key loss")
WINDOW_S = 60.0  # the budget's minute, as the provider meters it
AFTER_S = 90.0  # how far after a fault its pause (the longest nothing was served) is looked for


def settings_for(config: str, args: argparse.Namespace, redis_url: str | None) -> dict[str, Any]:
    """The ConcurrencySettings (as JSON data) one client process of `config` runs with."""
    client: dict[str, Any] = {"limit_name": "upstream", "max_concurrent": args.slots}
    settings: dict[str, Any] = {"component": "rate_budget_goal", "clients": [client]}
    if config == "aimd":
        client["adaptive"] = {
            "min_concurrent": 1,
            "max_concurrent": 4 * args.slots,
            "algorithm": "aimd",
            "latency_tolerance": None,
        }
    elif config.startswith("budget"):
        share = args.processes if config == "budget-local" else 1
        client["tokens_per_minute"] = math.ceil(args.tpm / share)
        client["requests_per_minute"] = math.ceil(args.rpm / share)
        client["tokens"] = "openai_tokens"
        if config in GLOBAL_CONFIGS:
            client["scope"] = "global"
            client["max_concurrent"] = args.slots * args.processes
            settings["redis_url"] = redis_url
        if config == "budget-backfill":
            client["backfill_seconds"] = args.backfill
    return settings


def cell(args: argparse.Namespace, config: str, seed: int) -> dict[str, Any]:
    redis = LocalRedis("0") if config in GLOBAL_CONFIGS else None
    provider = None
    try:
        if redis is not None:
            redis.wait_older_than(5)  # past a new Redis's grace period
        factor = args.provider_factor if args.faults else 1
        served = ["--tpm", str(math.ceil(factor * args.tpm))]
        served += ["--rpm", str(math.ceil(factor * args.rpm))]
        served += ["--completion-share", str(args.completion_share)]
        served += ["--base-ms", str(args.base_ms), "--us-per-token", str(args.us_per_token)]
        provider = FakeUpstream(args.python, "benchmarks._fake_provider", served)
        settings = json.dumps(settings_for(config, args, redis.url if redis else None))
        common = ["--url", provider.url, "--settings", settings]
        common += ["--seconds", str(args.seconds), "--callers", str(args.callers)]
        common += [
            "--source",
            args.source,
            "--expect",
            "budget" if config.startswith("budget") else "",
        ]
        argv = [[*common, "--seed", str(seed * 100 + i)] for i in range(args.processes)]
        processes = start_clients(args.python, CLIENT, argv)
        start = release(processes, STARTUP_S)
        if not args.faults:
            clients = run_clients(processes, STARTUP_S + args.seconds + 120)
            return measure(config, args, clients, provider.stats(), provider, start)
        assert redis is not None  # (--faults runs a global budget alone)
        clients, faults = run_with_faults(args, processes, argv[0], redis, start)
        one = measure(config, args, clients, provider.stats(), provider, start)
        calls = get_json(provider.url + "/calls", timeout=60)["calls"]
        return one | fault_figures(args, calls, faults, start)
    finally:
        if provider is not None:
            provider.stop()
        if redis is not None:
            redis.stop()


def run_with_faults(
    args: argparse.Namespace,
    processes: list[subprocess.Popen[str]],
    first_argv: list[str],
    redis: LocalRedis,
    start: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The clients' results of a --faults run, and the faults (each: what, at how many seconds
    after the start, what it found), injected by a thread at FAULT_AT x --seconds while this
    one collects the clients. The first client is the one killed; its replacement's result
    comes last."""
    spare: list[subprocess.Popen[str]] = []

    def kill_client() -> dict[str, Any]:
        victim = processes[0]
        victim.kill()  # SIGKILL, as kill -9: no lease given back, no reservation settled
        victim.communicate()
        left = start + args.seconds - time.monotonic()  # (argparse: the last --seconds counts)
        spare.extend(start_clients(args.python, CLIENT, [[*first_argv, "--seconds", f"{left}"]]))
        began = release(spare, STARTUP_S)
        return {"exit": victim.returncode, "replacement_from_s": round(began - start, 2)}

    faults: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    steps: list[Callable[[], dict[str, Any]]] = [
        kill_client,
        functools.partial(restart_redis, redis),
        functools.partial(lose_keys, redis),
    ]

    def inject() -> None:
        try:
            for share, name, step in zip(FAULT_AT, FAULT_NAMES, steps, strict=True):
                time.sleep(max(0.0, start + share * args.seconds - time.monotonic()))
                at = time.monotonic()
                faults.append({"fault": name, "at_s": round(at - start, 2), **step()})
        except BaseException as error:  # said once the clients are in
            errors.append(error)

    thread = threading.Thread(target=inject, daemon=True)
    thread.start()
    clients = run_clients(processes[1:], STARTUP_S + args.seconds + 120)
    thread.join(STARTUP_S + 60)
    if errors or thread.is_alive():
        raise RuntimeError(f"the faults stopped after {faults}: {errors or 'still running'}")
    return clients + run_clients(spare, STARTUP_S + 120), faults


def restart_redis(redis: LocalRedis) -> dict[str, Any]:
    """Stop the run's redis-server and start it again on the same port, with the same command
    (no persistence: its state is lost); how long it was away, the keys it loaded from disk as
    it started (0: none kept) and the keys it had when it first answered here (the clients,
    which try again every quarter of a second, may have written some by then)."""
    import redis as redis_py

    command = redis.process.args
    redis.process.terminate()
    redis.process.wait(10)
    stopped = time.monotonic()
    redis.process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=redis.directory
    )
    while True:
        try:
            keys = redis.client.dbsize()
            loaded = int(redis.client.info("persistence")["rdb_last_load_keys_loaded"])
            break
        except redis_py.RedisError:
            if redis.process.poll() is not None or time.monotonic() > stopped + 10:
                raise RuntimeError("the restarted redis-server did not answer") from None
            time.sleep(0.02)
    away = round(time.monotonic() - stopped, 3)
    return {"away_s": away, "keys_loaded": loaded, "keys_after": keys}


def lose_keys(redis: LocalRedis) -> dict[str, Any]:
    """Delete every key of the run's Redis (the limit's: it holds no other) while it runs."""
    keys = list(redis.client.scan_iter(count=1000))
    deleted = redis.client.delete(*keys) if keys else 0
    return {"keys_deleted": deleted, "keys": sorted(keys)}


def most_in_any_window(
    moments: Sequence[float], amounts: Sequence[float], width: float = WINDOW_S
) -> tuple[float, float | None]:
    """The most `amounts` sum to in any window [t, t + `width`) (sliding), of events at
    `moments` (sorted), and the start of the first such window (None: no event)."""
    most: float = 0
    at: float | None = None
    total: float = 0
    end = 0
    for index, moment in enumerate(moments):
        while end < len(moments) and moments[end] < moment + width:
            total += amounts[end]
            end += 1
        if at is None or total > most:
            most, at = total, moment
        total -= amounts[index]
    return most, at


def fault_figures(
    args: argparse.Namespace,
    calls: list[list[float]],
    faults: list[dict[str, Any]],
    start: float,
) -> dict[str, Any]:
    """What a --faults cell adds: the most tokens and requests the provider served in any 60-s
    window, each / the budget, the overshoot; each fault with the tokens served in the minute
    after it and its pause (the longest nothing was served, within AFTER_S of it and the run)."""
    moments = [moment for moment, _ in calls]
    figures: dict[str, Any] = {}
    for name, amounts, budget in (
        ("tokens", [tokens for _, tokens in calls], args.tpm),
        ("requests", [1] * len(calls), args.rpm),
    ):
        most, at = most_in_any_window(moments, amounts)
        figures[f"most_{name}_60s"] = most
        figures[f"most_{name}_from_s"] = None if at is None else round(at - start, 2)
        figures[f"{name}_ratio"] = most / budget
    ratios = (figures["tokens_ratio"], figures["requests_ratio"])
    for fault in faults:
        at = start + fault["at_s"]
        until = min(at + AFTER_S, start + args.seconds)
        after = [at] + [m for m in moments if at < m <= until] + [until]
        fault["pause_s"] = round(max(b - a for a, b in itertools.pairwise(after)), 2)
        fault["tokens_next_60s"] = sum(n for m, n in calls if at <= m < at + WINDOW_S)
    return figures | {"overshoot": max(0.0, *(r - 1 for r in ratios)), "faults": faults}


def measure(
    config: str,
    args: argparse.Namespace,
    clients: list[dict[str, Any]],
    stats: dict[str, Any],
    provider: FakeUpstream,
    start: float,
) -> dict[str, Any]:
    """One cell's figures: the provider's counts and whole minutes, the clients' calls."""
    end = start + args.seconds
    windows = stats["tokens_per_window"]
    # Window i is [started + 60 i, started + 60 (i + 1)), started in [spawned, ready]: the
    # minutes wholly inside the run, the first (the ramp) left out.
    first = max(1, math.ceil((start - provider.spawned) / 60))
    last = math.floor((end - provider.ready) / 60) - 1
    whole = [windows[i] for i in range(first, last + 1) if i < len(windows)]
    failed: dict[str, int] = {}
    for c in clients:
        for kind, count in c["failed"].items():
            failed[kind] = failed.get(kind, 0) + count
    return {
        "config": config,
        "upstream_429": stats["refused"],
        "refused_by": stats["refused_by"],
        "served": stats["served"],
        "tokens_served": stats["tokens_served"],
        "tokens_per_window": windows,
        "whole_windows": [first, last],
        "quota_used_windows": statistics.mean(whole) / args.tpm if whole else None,
        # A window admits a whole minute's quota at once: a run under a minute has that.
        "quota_used_run": stats["tokens_served"] / (max(1.0, args.seconds / 60) * args.tpm),
        "most_in_window": stats["most_in_window"],
        "completed": sum(c["completed"] for c in clients),
        "failed": failed,
        "tokens_estimated": sum(c["tokens_estimated"] for c in clients),
        **clients_figures(clients),
    }


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, mine in by_config(cells, CONFIGS):
        windows = [c["quota_used_windows"] for c in mine if c["quota_used_windows"] is not None]
        out[name] = {
            "rounds": len(mine),
            "upstream_429": [c["upstream_429"] for c in mine],
            "quota_used_windows": statistics.median(windows) if windows else None,
            "quota_used_run": statistics.median(c["quota_used_run"] for c in mine),
            "completed": [c["completed"] for c in mine],
            "failed": [sum(c["failed"].values()) for c in mine],
            "p50_s": statistics.median(c["p50_s"] for c in mine),
            "p95_s": statistics.median(c["p95_s"] for c in mine),
        }
        if "overshoot" in mine[0]:  # a --faults run
            out[name] |= {
                **{k: [c[k] for c in mine] for k in ("most_tokens_60s", "most_requests_60s")},
                **{k: max(c[k] for c in mine) for k in ("tokens_ratio", "requests_ratio")},
                "overshoot": max(c["overshoot"] for c in mine),
                "faults": [c["faults"] for c in mine],
            }
    return out


def verdicts(summary: dict[str, Any]) -> dict[str, bool]:
    """Each global budget's goals: 0 429s and the quota, or (--faults) the overshoot."""
    found: dict[str, bool] = {}
    for name in GLOBAL_CONFIGS:
        row = summary.get(name)
        if not row:
            continue
        if "overshoot" in row:
            limit = FAULT_GOALS["budget_global_overshoot"]
            found[f"{name}_overshoot<=0.02"] = row["overshoot"] <= limit
            continue
        used = row["quota_used_windows"] or row["quota_used_run"]
        found[f"{name}_0_429"] = max(row["upstream_429"]) == 0
        found[f"{name}_quota>=0.95"] = used >= GOALS["budget_global_quota_used"]
    return found


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| configuration | upstream 429s | quota used (whole minutes after the first) | "
        "quota used (run) | calls completed | calls failed | p50 / p95 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in summary.items():
        lines.append(
            f"| `{name}` | {', '.join(map(str, row['upstream_429']))} | "
            f"{_share(row['quota_used_windows'])} | {_share(row['quota_used_run'])} | "
            f"{', '.join(map(str, row['completed']))} | {', '.join(map(str, row['failed']))} | "
            f"{row['p50_s']:.2f} / {row['p95_s']:.2f} s |"
        )
    return "\n".join(lines)


def fault_table(summary: dict[str, Any]) -> str:
    """A --faults run's table: the most served in any 60-s window against the budget, then
    each fault of each round."""
    lines = [
        "| configuration | most tokens in 60 s (/ budget) | most requests in 60 s (/ budget) | "
        "overshoot | upstream 429s | quota used (whole minutes after the first) | "
        "quota used (run) | calls completed | calls failed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in summary.items():
        lines.append(
            f"| `{name}` | {', '.join(map(str, row['most_tokens_60s']))} "
            f"({row['tokens_ratio']:.4f}) | {', '.join(map(str, row['most_requests_60s']))} "
            f"({row['requests_ratio']:.4f}) | {row['overshoot']:.4f} | "
            f"{', '.join(map(str, row['upstream_429']))} | {_share(row['quota_used_windows'])} | "
            f"{_share(row['quota_used_run'])} | {', '.join(map(str, row['completed']))} | "
            f"{', '.join(map(str, row['failed']))} |"
        )
    for name, row in summary.items():
        for index, faults in enumerate(row["faults"]):
            for fault in faults:
                rest = {k: v for k, v in fault.items() if k not in ("fault", "at_s", "keys")}
                lines.append(
                    f"\n{name} round {index + 1}: {fault['fault']} at "
                    f"{fault['at_s']:.1f} s: {json.dumps(rest)}"
                )
    return "\n".join(lines)


def parse() -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--configs", default="fixed,aimd", help="comma-separated, of " + ", ".join(CONFIGS)
    )
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--callers", type=int, default=8, help="a process")
    parser.add_argument("--slots", type=int, default=4, help="a process (fixed, aimd's start)")
    parser.add_argument("--tpm", type=int, default=60_000)
    parser.add_argument("--rpm", type=int, default=500)
    parser.add_argument("--completion-share", type=float, default=0.5)
    parser.add_argument("--base-ms", type=float, default=200.0, help="the provider's service")
    parser.add_argument("--us-per-token", type=float, default=50.0, help="and per token")
    parser.add_argument("--faults", action="store_true", help="kill -9, Redis restart, key loss")
    parser.add_argument(
        "--backfill", type=float, default=10.0, help="budget-backfill's backfill_seconds"
    )
    parser.add_argument(
        "--provider-factor", type=float, default=2.0, help="with --faults: the provider's x"
    )
    parser.add_argument("--label", default=None, help="default: run (faults with --faults)")
    parser.add_argument("--source", default=str(PROJECT_ROOT), help="the tree to measure")
    parser.add_argument("--quick", action="store_true", help="a 10 s smoke run")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", default=None, help="default: results/rate-budget-goal-LABEL.json")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 10.0, 1
    configs = chosen_configs(parser, args.configs, CONFIGS)
    one_global = len(configs) == 1 and configs[0] in GLOBAL_CONFIGS
    if args.faults and (not one_global or args.provider_factor < 1):
        parser.error(
            "--faults runs --configs budget-global or budget-backfill alone, --provider-factor >= 1"
        )
    args.label = args.label or ("faults" if args.faults else "run")
    if not 0 < args.seconds <= 1800 or not 1 <= args.rounds <= 10:
        parser.error("--seconds must be in (0, 1800] and --rounds in [1, 10]")
    if not 1 <= args.processes <= 16 or not 1 <= args.slots <= 1000:
        parser.error("--processes must be in [1, 16] and --slots in [1, 1000]")
    return args, configs


def main() -> None:
    args, configs = parse()
    args.source = str(use_source_tree(args.source))  # the probe below reads that tree too
    errors = [
        wiring_error(c, missing)
        for c in configs
        if c.startswith("budget") and (missing := missing_wiring(BUDGET_FIELDS))
    ]
    if errors:
        sys.exit("\n".join(errors))
    start = RunStart()
    cells: list[dict[str, Any]] = []
    for index, name in rounds(configs, args.rounds):
        one = cell(args, name, index + 1)
        one.update(round=index, load=load_average())
        cells.append(one)
        print(
            f"round {index + 1} {name:14s} 429 {one['upstream_429']:5d}  quota used "
            f"{_share(one['quota_used_windows'])} (run {one['quota_used_run']:.3f})  "
            f"completed {one['completed']:5d}  failed {sum(one['failed'].values()):5d}  "
            f"p50 {one['p50_s']:.2f} s  p95 {one['p95_s']:.2f} s"
            + (f"  overshoot {one['overshoot']:.4f}" if args.faults else ""),
            flush=True,
        )
    summary = summarize(cells)
    settings = {k: getattr(args, k) for k in SETTINGS} | {
        "completion_share": args.completion_share,
        "service_s": f"{args.base_ms / 1e3:g} + {args.us_per_token / 1e6:g} * tokens",
        "call_tokens": [100, 16_000, "log-uniform, seeded"],
        "quota_used_windows": "mean tokens of the provider's whole minutes after the "
        "first (the ramp) / tpm",
    }
    if args.faults:
        settings |= {
            "faults": {"at": FAULT_AT, "of": FAULT_NAMES},
            "provider_factor": args.provider_factor,
            "window_s": WINDOW_S,
        }
    head = {**run_header("rate_budget_goal", args.label, args.source), "settings": settings}
    goals, shown = (FAULT_GOALS, fault_table) if args.faults else (GOALS, table)
    result = with_outcome(head, goals, start, summary, verdicts(summary))
    write_and_print(result, cells, args.json, f"rate-budget-goal-{args.label}.json", shown(summary))


if __name__ == "__main__":
    main()
