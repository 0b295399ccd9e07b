"""One client process of benchmarks/rate_budget_goal.py: `--callers` closed-loop callers making
chat completion calls to the fake provider through one configured client limit (httpx,
`benchmarks._goal_client_limit`), for `--seconds` from the moment the driver gives.

Call sizes are a fixed seeded mix, log-uniform in [--min-tokens, --max-tokens]
(`_tokens_client.body_of`: half prompt, half `max_tokens`, so `openai_tokens` estimates the
size exactly; the provider's `--completion-share` makes the call use less). A call is the
transport's: its retries (the settings' RetryPolicy: 429 waits Retry-After) included. A call
that ends other than 200 is counted by status (or exception) and the caller goes on to its next
call. Prints one JSON object: calls completed and failed, the latency of each completed call
(first attempt to body read), tokens estimated, the limit's counters at the end.

    taskset -c 1 python -m benchmarks._rate_budget_client --url http://127.0.0.1:P
        --settings JSON --seconds 300 [--callers 8] [--seed 1] [--expect budget]
        [--source TREE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from benchmarks._goal_client_process import chat_completion, client_arguments, run_client
from benchmarks._tokens_client import body_of, log_uniform

__all__ = ["call_sizes"]


def call_sizes(seed: int, low: int, high: int) -> Iterator[int]:
    """The fixed mix of call sizes (tokens) of one process, endless."""
    rng = random.Random(seed)
    while True:
        yield log_uniform(rng, low, high)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks._goal_client_limit import client_limit, limit_figures, released

    expect = [part for part in args.expect.split(",") if part]
    sizes = call_sizes(args.seed, args.min_tokens, args.max_tokens)
    completed: list[tuple[float, int]] = []  # (latency s, size)
    failed: Counter[str] = Counter()
    async with client_limit(args.settings, args.url, expect) as (client, limit):
        start, late = await released()
        end = start + args.seconds

        async def caller() -> None:
            while time.monotonic() < end:
                size = next(sizes)
                data = json.dumps(body_of(size)).encode()
                sent = time.monotonic()
                if await chat_completion(client, data, failed):
                    completed.append((time.monotonic() - sent, size))

        callers = [asyncio.create_task(caller()) for _ in range(args.callers)]
        await asyncio.wait(callers, timeout=max(0.0, end - time.monotonic()))
        for task in callers:
            task.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        figures = limit_figures(limit)
    return {
        "late_s": round(late, 3),
        "completed": len(completed),
        "failed": dict(failed),
        "latencies_s": sorted(round(latency, 4) for latency, _ in completed),
        "tokens_estimated": sum(size for _, size in completed),
        "limit": figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--settings", required=True, help="ConcurrencySettings as JSON")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--min-tokens", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=16_000)
    parser.add_argument("--seed", type=int, default=1)
    args = client_arguments(parser)
    if not 0 < args.seconds <= 1800 or not 1 <= args.callers <= 1000:
        sys.exit("--seconds must be in (0, 1800] and --callers in [1, 1000]")
    run_client(args, run)


if __name__ == "__main__":
    main()
