"""One OS process of benchmarks/shared_flows.py: a SharedLimit on the benchmark's Redis and
one flow's callers (closed-loop, or Poisson arrivals), each holding its slot for a random time.

Says "ready" once connected, then waits for "go <monotonic start>" on stdin (the machine's
monotonic clock is the same in every process), runs until start + warmup + seconds, writes
`--out` (JSON: every call's arrival, admission and release in monotonic seconds, and the
weight it held) and says "done". The intervals [admitted, released] lie inside the lease
Redis counted, so their overlap across processes never exceeds what Redis held: the witness.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from typing import Any

from gym_concurrency import SharedLimit


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--flow", default="", help="'' for the default flow")
    parser.add_argument("--weight", type=int, default=1)
    parser.add_argument("--callers", type=int, default=0, help="closed-loop callers")
    parser.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals a second")
    parser.add_argument("--hold-ms", type=float, nargs=2, default=[10.0, 30.0])
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-uvloop", action="store_true")
    parser.add_argument("--out", required=True, help="where the JSON goes")
    return parser.parse_args()


class Load:
    """The calls of one flow, recorded as (arrival, admitted, released)."""

    def __init__(self, limit: SharedLimit, args: argparse.Namespace) -> None:
        self.limit = limit
        self.flow = args.flow or None
        self.weight = args.weight
        self.hold = (args.hold_ms[0] / 1000, args.hold_ms[1] / 1000)
        self.rng = random.Random(args.seed)
        self.calls: list[tuple[float, float, float]] = []
        self.end = 0.0

    async def call(self) -> None:
        arrival = time.monotonic()
        async with self.limit.hold(self.weight, self.flow):
            admitted = time.monotonic()
            await asyncio.sleep(self.rng.uniform(*self.hold))
            released = time.monotonic()
        self.calls.append((arrival, admitted, released))

    async def closed_loop(self) -> None:
        while time.monotonic() < self.end:
            await self.call()

    async def poisson(self, rate: float) -> None:
        tasks: set[asyncio.Task[None]] = set()
        next_at = time.monotonic()
        while True:
            next_at += self.rng.expovariate(rate)
            if next_at >= self.end:
                break
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            task = asyncio.create_task(self.call())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=30)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    limit = SharedLimit(
        args.limit, redis_url=args.redis_url, key=args.key, timeout=60, redis_timeout=2.0
    )
    await limit.connect()
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start = float(line.split()[1])
    load = Load(limit, args)
    load.end = start + args.warmup + args.seconds
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    if args.rate > 0:
        await load.poisson(args.rate)
    else:
        callers = [asyncio.create_task(load.closed_loop()) for _ in range(args.callers)]
        await asyncio.wait(callers, timeout=args.warmup + args.seconds + 30)
    await limit.close()
    return {"flow": args.flow, "weight": args.weight, "calls": load.calls}


def main() -> None:
    args = _arguments()
    if not args.no_uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    result = asyncio.run(run(args))
    with open(args.out, "w") as out:
        json.dump(result, out)
    print("done", flush=True)


if __name__ == "__main__":
    main()
