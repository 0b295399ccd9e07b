"""The callers of benchmarks/tokens.py: one configuration's closed loop against the token
upstream (aiohttp on uvloop, 127.0.0.1 only).

`--callers` tasks each make one chat completion call after another. A call's size is drawn
log-uniformly from [--min-tokens, --max-tokens] (seeded): half of it prompt (4 characters a
token), half `max_tokens`, so `openai_tokens(body)` is the size exactly. Every attempt holds a
MeteredSemaphore(--limit) around the HTTP call: weight 1 (`count`), or `openai_tokens(body)`
(`weighted`), with `backfill_seconds=--backfill-seconds` (default 0: none). A 429 gives the
limit back, waits --retry-pause s and tries the same call again. After --warmup s it measures
--seconds s: calls and tokens completed, 429s, attempts, latency (first attempt to success),
the tokens the callers held (time-averaged) and, from the upstream's `GET /stats` at both ends
of the window, its time-averaged tokens in flight and its own counts. Prints one JSON object.

    taskset -c 1 python -m benchmarks._tokens_client --port P --config weighted --limit 64000
        [--backfill-seconds 0] [--callers 128] [--warmup 2] [--seconds 20] [--seed 1]
        [--source TREE]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import resource
import sys
import time
from typing import Any

from benchmarks._flows_inprocess import loop_name, percentile, run_loop
from benchmarks._source import PROJECT_ROOT, loaded_files, use_source_tree

HOST = "127.0.0.1"  # the only address this client talks to
now = time.perf_counter


def body_of(size: int) -> dict[str, Any]:
    """A chat completion body that `openai_tokens` prices at exactly `size` (>= 2) tokens:
    the role's 4 characters and the content make `size // 2` prompt tokens."""
    prompt = size // 2
    content = "x" * (4 * (prompt - 1))
    return {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": size - prompt,
    }


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    from gym_concurrency import MeteredSemaphore
    from gym_concurrency.tokens import openai_tokens

    limit = MeteredSemaphore(args.limit, backfill_seconds=args.backfill_seconds)
    weighted = args.config == "weighted"
    url = f"http://{HOST}:{args.port}"
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60)
    )
    rng = random.Random(args.seed)
    start = now()
    window_start, window_end = start + args.warmup, start + args.warmup + args.seconds
    counts = {"calls": 0, "tokens": 0, "attempts": 0, "429": 0, "other": 0}
    latencies: list[float] = []
    held = {"tokens": 0, "token_seconds": 0.0, "last": now()}

    def hold_change(delta: int) -> None:
        t = now()
        held["token_seconds"] += held["tokens"] * (t - held["last"])
        held["last"] = t
        held["tokens"] += delta

    def in_window() -> bool:
        return bool(window_start <= now() < window_end)

    async def attempt(data: bytes, weight: int, size: int) -> int:
        async with limit.hold(weight):
            hold_change(size)
            try:
                async with session.post(
                    url + "/v1/chat/completions",
                    data=data,
                    headers={"content-type": "application/json"},
                ) as response:
                    await response.read()
                    return response.status
            finally:
                hold_change(-size)

    async def caller() -> None:
        while now() < window_end:
            size = log_uniform(rng, args.min_tokens, args.max_tokens)
            body = body_of(size)
            weight = openai_tokens(body) if weighted else 1
            data = json.dumps(body).encode()
            first = now()
            while True:
                status = await attempt(data, weight, size)
                if in_window():
                    counts["attempts"] += 1
                if status == 200:
                    break
                if in_window():
                    counts["429" if status == 429 else "other"] += 1
                await asyncio.sleep(args.retry_pause)
            if in_window():
                counts["calls"] += 1
                counts["tokens"] += size
                latencies.append(now() - first)

    async def upstream_stats() -> dict[str, Any]:
        async with session.get(url + "/stats") as response:
            return dict(await response.json())

    callers = [asyncio.create_task(caller()) for _ in range(args.callers)]
    await asyncio.sleep(max(0.0, window_start - now()))
    hold_change(0)
    before, held_before, cpu0 = await upstream_stats(), held["token_seconds"], time.process_time()
    backfilled_before = limit.admission_backfilled
    samples = [before]  # the upstream's counters about every second: utilisation over time
    for k in range(1, math.ceil(args.seconds) + 1):
        await asyncio.sleep(max(0.0, min(window_start + k, window_end) - now()))
        samples.append(await upstream_stats())
    hold_change(0)
    after, held_after, cpu1 = samples[-1], held["token_seconds"], time.process_time()
    backfilled = limit.admission_backfilled - backfilled_before
    window = after["t"] - before["t"]
    for task in callers:
        task.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    await session.close()
    latencies.sort()
    capacity = after["capacity"]
    return {
        "config": args.config,
        "limit": args.limit,
        "window_s": window,
        "utilisation": (after["token_seconds"] - before["token_seconds"]) / window / capacity,
        "utilisation_per_second": [
            round((b["token_seconds"] - a["token_seconds"]) / (b["t"] - a["t"]) / capacity, 4)
            for a, b in itertools.pairwise(samples)
        ],
        "client_held_utilisation": (held_after - held_before) / window / capacity,
        "upstream_429": after["refused"] - before["refused"],
        "upstream_served": after["served"] - before["served"],
        "upstream_max_in_flight": after["max_in_flight"],
        "calls_per_second": counts["calls"] / window,
        "tokens_per_second": counts["tokens"] / window,
        "attempts": counts["attempts"],
        "backfilled": backfilled,
        "backfill_seconds": args.backfill_seconds,
        "client_429": counts["429"],
        "client_other_failures": counts["other"],
        "p50_s": percentile(latencies, 0.50),
        "p99_s": percentile(latencies, 0.99),
        "client_cpu": (cpu1 - cpu0) / window,
        "leaked_after": {"active": limit.active, "queue_depth": limit.queue_depth},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--config", choices=("count", "weighted"), required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--backfill-seconds", type=float, default=0.0)
    parser.add_argument("--callers", type=int, default=128)
    parser.add_argument("--min-tokens", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=16_000)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--retry-pause", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--source", default=str(PROJECT_ROOT))
    args = parser.parse_args()
    if not 0 < args.seconds <= 120 or not 0 <= args.warmup <= 30:
        sys.exit("--seconds must be in (0, 120] and --warmup in [0, 30]")
    if not 1 <= args.callers <= 2000 or not 2 <= args.min_tokens <= args.max_tokens:
        sys.exit("--callers must be in [1, 2000] and 2 <= --min-tokens <= --max-tokens")
    root = use_source_tree(args.source)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = run_loop(run(args))
    result["gym_concurrency_files"] = loaded_files(root)
    result["loop"] = loop_name()
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
