"""Issue 35's engine goal: a fake engine of batch capacity 64 behind 4 client processes, a burst
of 1,000 requests: the engine's waiting queue <= 6 at every scrape and its batch utilisation
>= 0.95 of the burst's duration with a limit following the engine's /metrics; today's fixed,
AIMD and gradient limits side by side.

The engine is benchmarks/_fake_engine.py (`--batch` 64, `--service-ms` 200: the burst takes
at least 1,000 / 64 x 0.2 = 3.1 s; `--service-spread S` draws each run's time from
U(1 - S, 1 + S) x the service time, so that runs end apart as with real output lengths), on
CPU 0. Each of `--processes` client processes (benchmarks/_engine_client.py, CPU 1) sends its
1/processes of `--requests` at once, at a common moment, through one configured client limit
(`ClientLimit`: its aiohttp middleware, or with `--clients httpx` its httpx transport; given
both, each configuration runs with each, a row `config/client` each):

    fixed     max_concurrent = batch / processes (16): the batch exactly, known in advance
    fixed-global  one global limit of batch + --engine-global-waiting-max (70) for all the
              processes, on a redis-server of this run (the hand-off through Redis, no engine)
    aimd      adaptive AIMD (latency tolerance 1.25: the engine never refuses), starting at
              --adaptive-start a process, within [1, batch]
    gradient  the same, gradient
    engine    max_concurrent = --engine-slots (batch) a process, `engine` following the
              engine's /metrics: waiting_max = --engine-waiting-max (default 6 // processes,
              so the sum <= 6), batch_size = --engine-batch-size (64), interval
              --engine-interval s (0.05), stale after --engine-stale-after s (3 intervals)
    engine-global  one global limit (scope global, on a redis-server of this run, CPU 0)
              following the engine for all the processes: waiting_max =
              --engine-global-waiting-max (6) for the fleet, the rest as `engine`; the size
              moves with the engine's room (docs/engine-signals.md, "Across replicas")
    fixed-global-flows, engine-global-flows  the same, each process's calls in a flow of its
              own (`flow: process`): the processes take turns at the limit, where first come,
              first served lets the first to queue take every slot that frees until its calls
              run out

This run also scrapes /metrics every --scrape-ms itself, so that the baselines have scrapes
too. Reported per configuration (over `--rounds`, order rotating, a fresh engine a cell): the
most requests waiting at any scrape during the burst (and at any moment: the engine's own
exact maximum), batch utilisation = the engine's busy_seconds (running / batch, integrated)
/ the burst's duration, and that over the burst's ceiling (`_fake_engine.ceiling`: every run
started the moment a slot frees, no hand-off time; 1,000 runs of 1 s on 64 slots end with 40
alone, 0.977; with a spread of 0.5, 0.948), the duration (first call sent to last answered),
the client processes' CPU a call during the burst (they share one core) and the share of the
burst that core was busy (near 1, a freed batch slot waits for the clients' CPU to be refilled: the
limit's own cost, and the HTTP client's: httpx's connection pool costs CPU that grows with the
calls in flight times the connections a process keeps, encode/httpx#3215; about 1.5 ms a call
at 16 in flight, 14 ms at 64, where aiohttp's stays near 0.35 ms), p50 / p95 latency.
The clients' CPU is part of a burst: each waits up to --wait-quiet s for a nearly idle machine
(`overload.wait_until_quiet`; the cores busy then are in the JSON).
`engine` needs issue 35's wiring: without it the run stops before anything starts, saying
what is missing.

    .venvs/3.11/bin/python -m benchmarks.engine_goal [--configs fixed,aimd,gradient,engine]
        [--rounds 3] [--requests 1000] [--clients aiohttp,httpx] [--label NAME] [--source TREE]
        [--quick]

`--source TREE` measures another checkout's library (a merge of issue 35's branches, say)
without installing it (benchmarks/_source.py); the clients check that nothing else loaded.

Writes results/engine-goal-LABEL.json (raw) and .summary.json; prints a Markdown table.
127.0.0.1 only; every burst bounded by --timeout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the project root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._fake_engine import ceiling
from benchmarks._goal_parts import (
    STARTUP_S,
    FakeUpstream,
    chosen_configs,
    clients_figures,
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
from benchmarks.overload import load_average, wait_until_quiet

CLIENTS = ("aiohttp", "httpx")  # the HTTP client a process calls through
CONFIGS = (
    "fixed",
    "fixed-global",
    "fixed-global-flows",
    "aimd",
    "gradient",
    "engine",
    "engine-global",
    "engine-global-flows",
)
GOALS = {"engine_max_waiting_at_scrape": 6, "engine_batch_utilisation": 0.95}
SETTINGS = (  # the options the JSON records
    "rounds",
    "requests",
    "processes",
    "batch",
    "service_ms",
    "service_spread",
    "adaptive_start",
    "engine_waiting_max",
    "engine_batch_size",
    "engine_interval",
    "engine_stale_after",
    "engine_slots",
    "engine_global_waiting_max",
    "redis_cpu",
    "scrape_ms",
    "warm",
    "clients",
)


def settings_for(
    config: str, args: argparse.Namespace, engine_url: str, redis_url: str | None = None
) -> dict[str, Any]:
    """The ConcurrencySettings (as JSON data) one client process of `config` runs with."""
    client: dict[str, Any] = {"limit_name": "upstream", "retry": None}
    settings: dict[str, Any] = {"component": "engine_goal", "clients": [client]}
    if config.endswith("-flows"):  # each process in a flow of its own: they take turns
        client["flow"] = "process"
        config = config.removesuffix("-flows")
    if config == "fixed":
        client["max_concurrent"] = max(1, args.batch // args.processes)
    elif config == "fixed-global":  # the batch and the queue the engine goal allows, known
        client["max_concurrent"] = args.batch + args.engine_global_waiting_max
        client["scope"] = "global"
        settings["redis_url"] = redis_url
    elif config in ("aimd", "gradient"):
        client["max_concurrent"] = args.adaptive_start
        client["adaptive"] = {
            "min_concurrent": 1,
            "max_concurrent": max(args.batch, args.adaptive_start),
            "algorithm": config,
        }
    else:
        client["max_concurrent"] = args.engine_slots or args.batch
        client["engine"] = {
            "url": f"{engine_url}/metrics",
            "waiting_max": args.engine_waiting_max,
            "batch_size": args.engine_batch_size,
            "interval_seconds": args.engine_interval,
            "stale_after_seconds": args.engine_stale_after,
        }
        if config == "engine-global":
            client["engine"]["waiting_max"] = args.engine_global_waiting_max
            client["max_concurrent"] = (args.engine_slots or args.batch) * args.processes
            client["scope"] = "global"
            settings["redis_url"] = redis_url
    return settings


class Scraper:
    """GET /metrics every `seconds` in a thread until stopped: the engine records each."""

    def __init__(self, url: str, seconds: float) -> None:
        self.url, self.seconds = url + "/metrics", seconds
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.seconds):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    response.read()
            except OSError:
                pass  # counted as no scrape; the engine's own maximum still holds

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)


def cell(args: argparse.Namespace, config: str, client: str) -> dict[str, Any]:
    served = ["--batch", str(args.batch), "--service-ms", str(args.service_ms)]
    served += ["--service-spread", str(args.service_spread)]
    engine = FakeUpstream(args.python, "benchmarks._fake_engine", served)
    redis = LocalRedis(args.redis_cpu) if "-global" in config else None
    scraper = None
    try:
        if redis is not None:
            redis.wait_older_than(5)  # past a new Redis's grace period (it hands out nothing)
        redis_url = None if redis is None else redis.url
        settings = json.dumps(settings_for(config, args, engine.url, redis_url))
        share, extra = divmod(args.requests, args.processes)
        common = ["--url", engine.url, "--settings", settings]
        common += ["--timeout", str(args.timeout), "--warm", str(args.warm), "--client", client]
        expect = "engine" if config.startswith("engine") else ""
        common += ["--source", args.source, "--expect", expect]
        argv = [[*common, "--requests", str(share + (i < extra))] for i in range(args.processes)]
        processes = start_clients(args.python, "benchmarks._engine_client", argv)
        release(processes, STARTUP_S)
        scraper = Scraper(engine.url, args.scrape_ms / 1e3)
        clients = run_clients(processes, STARTUP_S + args.timeout + 60)
        scraper.stop()
        return {**measure(config, clients, engine.stats()), "client": client}
    finally:
        if scraper is not None:
            scraper.stop()
        engine.stop()
        if redis is not None:
            redis.stop()


def measure(config: str, clients: list[dict[str, Any]], stats: dict[str, Any]) -> dict[str, Any]:
    """One burst's figures: the engine's scrapes and busy time over the clients' span."""
    begin = min(c["first_sent"] for c in clients)
    end = max(c["last_done"] for c in clients)
    during = [s for s in stats["scrapes"] if begin <= s["t"] <= end]
    return {
        "config": config,
        "duration_s": end - begin,
        "utilisation": stats["busy_seconds"] / (end - begin),
        "max_waiting_at_scrape": max((s["waiting"] for s in during), default=None),
        "scrapes": len(during),
        "series": [[round(s["t"] - begin, 3), s["waiting"], s["running"]] for s in during],
        "max_waiting": stats["max_waiting"],
        "max_running": stats["max_running"],
        "served": stats["served"],
        "completed": sum(c["completed"] for c in clients),
        "failed": sum(sum(c["failed"].values()) + c["unfinished"] for c in clients),
        # The clients' CPU a call (they share one core: what a limit's own work costs them).
        "client_cpu_ms_per_call": 1000 * sum(c["cpu_s"] for c in clients) / stats["served"]
        if stats["served"]
        else None,
        # The share of the burst their one core was busy: near 1, hand-offs wait for it.
        "client_core_busy": sum(c["cpu_s"] for c in clients) / (end - begin),
        **clients_figures(clients),
    }


def summarize(cells: list[dict[str, Any]], most: float) -> dict[str, Any]:
    """Per row (a configuration, or `config/client` given more than one client), medians over
    its rounds; `of_ceiling`: its utilisation / `most` (the burst's ceiling,
    `_fake_engine.ceiling`)."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(c["row"] for c in cells):  # (in the order first run)
        mine = [c for c in cells if c["row"] == name]
        at_scrape = [c["max_waiting_at_scrape"] for c in mine]
        utilisation = statistics.median(c["utilisation"] for c in mine)
        out[name] = {
            "rounds": len(mine),
            "max_waiting_at_scrape": max((w for w in at_scrape if w is not None), default=None),
            "max_waiting": max(c["max_waiting"] for c in mine),
            "utilisation": utilisation,
            "of_ceiling": round(utilisation / most, 3),
            "utilisation_rounds": [round(c["utilisation"], 3) for c in mine],
            "duration_s": statistics.median(c["duration_s"] for c in mine),
            "client_cpu_ms_per_call": statistics.median(
                c["client_cpu_ms_per_call"] or 0.0 for c in mine
            ),
            "client_core_busy": statistics.median(c["client_core_busy"] for c in mine),
            "p50_s": statistics.median(c["p50_s"] for c in mine),
            "p95_s": statistics.median(c["p95_s"] for c in mine),
            "failed": sum(c["failed"] for c in mine),
            "late_s_max": max(c["late_s"] for c in mine),
        }
    return out


def verdicts(summary: dict[str, Any]) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for name, row in summary.items():
        if not name.startswith("engine"):
            continue
        waiting = row["max_waiting_at_scrape"]
        goal = GOALS["engine_batch_utilisation"]
        out[f"{name}_waiting<=6_at_every_scrape"] = waiting is not None and waiting <= 6
        out[f"{name}_utilisation>=0.95"] = row["utilisation"] >= goal
    return out


def table(summary: dict[str, Any], most: float) -> str:
    lines = [
        f"The burst's ceiling (no hand-off time at all): batch utilisation {most:.3f}.",
        "",
        "| configuration | max waiting at a scrape (at any moment) | batch utilisation "
        "(rounds) | of the ceiling | burst duration | clients' CPU a call (their core busy) | "
        "p50 / p95 | failed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in summary.items():
        rounds = ", ".join(f"{u:.3f}" for u in row["utilisation_rounds"])
        lines.append(
            f"| `{name}` | {row['max_waiting_at_scrape']} ({row['max_waiting']}) | "
            f"{row['utilisation']:.3f} ({rounds}) | {row['of_ceiling']:.3f} | "
            f"{row['duration_s']:.2f} s | "
            f"{row['client_cpu_ms_per_call']:.2f} ms ({row['client_core_busy']:.2f}) | "
            f"{row['p50_s']:.2f} / {row['p95_s']:.2f} s | {row['failed']} |"
        )
    return "\n".join(lines)


def row_name(config: str, client: str, clients: list[str]) -> str:
    """A summary row's name: the configuration, `config/client` when the run has more than
    one client."""
    return config if len(clients) == 1 else f"{config}/{client}"


def parse() -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default="fixed,aimd,gradient", help=", ".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1000, help="the burst, in all")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64, help="the engine's batch capacity")
    parser.add_argument("--service-ms", type=float, default=200.0)
    parser.add_argument("--service-spread", type=float, default=0.0, help="fraction, [0, 1)")
    parser.add_argument("--adaptive-start", type=int, default=32, help="a process")
    parser.add_argument("--engine-waiting-max", type=int, default=None, help="6 // processes")
    parser.add_argument("--engine-batch-size", type=int, default=64)
    parser.add_argument("--engine-interval", type=float, default=0.05, help="s")
    parser.add_argument("--engine-stale-after", type=float, default=None, help="s (3 intervals)")
    parser.add_argument("--engine-slots", type=int, default=None, help="a process (batch)")
    parser.add_argument("--engine-global-waiting-max", type=int, default=6, help="the fleet's")
    parser.add_argument("--redis-cpu", default="0", help="the *-global configs' redis-server")
    parser.add_argument("--scrape-ms", type=float, default=50.0, help="this run's own scrapes")
    parser.add_argument("--timeout", type=float, default=120.0, help="s, a burst at most")
    parser.add_argument("--warm", type=int, default=0, help="connections a process opens first")
    parser.add_argument("--clients", default="aiohttp", help="aiohttp, httpx or both")
    parser.add_argument("--wait-quiet", type=float, default=20.0, help="s, before each burst")
    parser.add_argument("--label", default="run")
    parser.add_argument("--source", default=str(PROJECT_ROOT), help="the tree to measure")
    parser.add_argument("--quick", action="store_true", help="1 round of 200 requests")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", default=None, help="default: results/engine-goal-LABEL.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests, args.wait_quiet = 1, 200, 0.0
    if args.engine_waiting_max is None:
        args.engine_waiting_max = max(1, 6 // args.processes)
    configs = chosen_configs(parser, args.configs, CONFIGS)
    clients = args.clients.split(",")
    if len(set(clients)) < len(clients) or not set(clients) <= set(CLIENTS):
        parser.error(f"--clients: comma-separated, each once, of {', '.join(CLIENTS)}")
    if not 1 <= args.rounds <= 20 or not 1 <= args.requests <= 20_000:
        parser.error("--rounds must be in [1, 20] and --requests in [1, 20000]")
    if not 1 <= args.processes <= 16 or not 1 <= args.batch <= 4096:
        parser.error("--processes must be in [1, 16] and --batch in [1, 4096]")
    if not 0 < args.timeout <= 600 or not 10 <= args.scrape_ms <= 10_000:
        parser.error("--timeout must be in (0, 600] and --scrape-ms in [10, 10000]")
    if not 0 <= args.service_spread < 1:
        parser.error("--service-spread must be in [0, 1)")
    return args, configs


def main() -> None:
    args, configs = parse()
    args.source = str(use_source_tree(args.source))  # the probe below reads that tree too
    engines = [config for config in configs if config.startswith("engine")]
    if engines and (missing := missing_wiring(("engine",))):
        sys.exit(wiring_error("engine", missing))
    start = RunStart()
    clients = args.clients.split(",")
    rows = {row_name(c, h, clients): (c, h) for c in configs for h in clients}
    cells: list[dict[str, Any]] = []
    for index, name in rounds(list(rows), args.rounds):
        busy = wait_until_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
        one = cell(args, *rows[name])
        one.update(row=name, round=index, load=load_average(), busy_cores_before=busy)
        cells.append(one)
        print(
            f"round {index + 1} {name:27s} waiting at a scrape <= "
            f"{one['max_waiting_at_scrape']} (any moment {one['max_waiting']})  "
            f"utilisation {one['utilisation']:.3f}  burst {one['duration_s']:.2f} s  "
            f"p95 {one['p95_s']:.2f} s  failed {one['failed']}  late {one['late_s']:.2f} s",
            flush=True,
        )
    most = ceiling(args.requests, args.batch, args.service_ms / 1e3, args.service_spread)
    summary = summarize(cells, most)
    settings = {k: getattr(args, k) for k in SETTINGS}
    head = {**run_header("engine_goal", args.label, args.source), "settings": settings}
    head["ceiling"] = round(most, 4)
    result = with_outcome(head, GOALS, start, summary, verdicts(summary))
    summary_table = table(summary, most)
    write_and_print(result, cells, args.json, f"engine-goal-{args.label}.json", summary_table)


if __name__ == "__main__":
    main()
