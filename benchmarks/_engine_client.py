"""One client process of benchmarks/engine_goal.py: its share of a burst, `--requests` chat
completion calls to the fake engine made all at once, at the moment the driver gives
(`_goal_client_limit.released`), through one configured client limit, over aiohttp or httpx
(`--client`: httpx's connection pool costs CPU that grows with the calls in flight times the
connections kept, encode/httpx#3215). Its connection pool is opened first (`--warm`
connections): a server's pool is warm, and 250 connections opened at once by a process on a
shared core would stretch the burst's start. Prints one JSON object: when its first call was
sent and its last one answered (monotonic), the CPU the process spent meanwhile, the calls
completed and failed, their latencies, the limit's counters at the end.

    taskset -c 1 python -m benchmarks._engine_client --url http://127.0.0.1:P --settings JSON
        [--requests 250] [--warm 128] [--client aiohttp] [--expect engine] [--source TREE]
        [--timeout 120]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from benchmarks._goal_client_process import (
    chat_completion,
    chat_completion_aiohttp,
    client_arguments,
    run_client,
)

BODY = json.dumps(
    {"model": "fake", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 100}
).encode()  # 201 tokens: 64 of them fill a tenth of the fake engine's KV cache

if TYPE_CHECKING:
    from gym_concurrency.limits import Limit

Post = Callable[[Counter[str]], Awaitable[bool]]  # one call; whether it was answered 200


@contextlib.asynccontextmanager
async def calls_through_limit(
    args: argparse.Namespace, expect: list[str], warm: int
) -> AsyncIterator[tuple[Post, Limit]]:
    """One call of BODY over `--client`, through the settings' client limit; that limit."""
    from benchmarks._goal_client_limit import client_limit, session_limit

    if args.client == "aiohttp":
        async with session_limit(args.settings, args.url, expect, warm) as (session, limit):
            yield partial(chat_completion_aiohttp, session, BODY), limit
    else:
        async with client_limit(args.settings, args.url, expect, warm) as (client, limit):
            yield partial(chat_completion, client, BODY), limit


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks._goal_client_limit import limit_figures, released

    expect = [part for part in args.expect.split(",") if part]
    latencies: list[float] = []
    failed: Counter[str] = Counter()
    warm = min(args.requests, args.warm)
    async with calls_through_limit(args, expect, warm) as (post, limit):
        _, late = await released()
        first, cpu = time.monotonic(), time.process_time()

        async def call() -> float:
            sent = time.monotonic()
            answered = await post(failed)
            done = time.monotonic()
            if answered:
                latencies.append(done - sent)
            return done

        calls = [asyncio.create_task(call()) for _ in range(args.requests)]
        finished, pending = await asyncio.wait(calls, timeout=args.timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        last = max((task.result() for task in finished), default=time.monotonic())
        cpu = time.process_time() - cpu  # this process's, its threads' too, for the burst
        figures = limit_figures(limit)
    latencies.sort()
    return {
        "late_s": round(late, 4),
        "first_sent": first,
        "last_done": last,
        "cpu_s": round(cpu, 4),
        "completed": len(latencies),
        "failed": dict(failed),
        "unfinished": len(pending),
        "latencies_s": [round(x, 4) for x in latencies],
        "limit": figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--settings", required=True, help="ConcurrencySettings as JSON")
    parser.add_argument("--requests", type=int, default=250)
    parser.add_argument("--warm", type=int, default=128, help="connections opened first")
    parser.add_argument("--timeout", type=float, default=120.0, help="s, for the whole burst")
    parser.add_argument("--client", choices=("aiohttp", "httpx"), default="aiohttp")
    args = client_arguments(parser)
    if not 1 <= args.requests <= 10_000 or not 0 < args.timeout <= 600:
        sys.exit("--requests must be in [1, 10000] and --timeout in (0, 600]")
    run_client(args, run)


if __name__ == "__main__":
    main()
