"""The load generator of benchmarks/flows.py's middleware part (aiohttp on uvloop, 127.0.0.1).

`--flood` closed-loop callers send `GET /work?ms=N` with `x-flow: flood` (N drawn from
uniform(10, 30) ms), each the next as soon as its last answer arrived; an open loop of
Poisson arrivals at `--quiet-rate` a second sends the same with `x-flow: quiet`. Every draw
comes from RNGs seeded by `--seed`: the quiet calls are the same in every configuration of a
round. After `--warmup` s it measures for `--seconds` s: the quiet calls that arrived in the
window (latency: send to the whole answer; all are waited for, up to 30 s), the flood's
answers completed in the window, statuses other than 200, and CPU (its own, the server's
with `--server-pid`, every other process's from /proc/stat). Prints one JSON object.

    taskset -c 1 python -m benchmarks._flows_load --port P [--flood 256] [--quiet-rate 25]
        [--warmup 2] [--seconds 20] [--seed 1] [--server-pid PID]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import time
from typing import Any

from benchmarks._flows_inprocess import SERVICE_S, loop_name, percentile, run_loop
from benchmarks._loadgen import _proc_cpu_seconds, machine_busy_seconds

HOST = "127.0.0.1"  # the only address this generator talks to
now = time.perf_counter


async def run(
    port: int,
    flood: int,
    quiet_rate: float,
    warmup: float,
    seconds: float,
    seed: int,
    server_pid: int | None,
) -> dict[str, Any]:
    import aiohttp

    base = f"http://{HOST}:{port}/work"
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    session = aiohttp.ClientSession(connector=connector, timeout=timeout)
    start = now()
    window_start, window_end = start + warmup, start + warmup + seconds
    flood_done = 0
    statuses: dict[str, int] = {}
    flood_rng = random.Random(seed * 7919 + 1)
    flood_headers = {"x-flow": "flood"}

    def count(kind: str) -> None:
        statuses[kind] = statuses.get(kind, 0) + 1

    quiet_headers = {"x-flow": "quiet"}

    async def get(ms: int, headers: dict[str, str]) -> int:
        async with session.get(base, params={"ms": str(ms)}, headers=headers) as response:
            await response.read()
            return response.status

    async def flooder() -> None:
        nonlocal flood_done
        while now() < window_end:
            try:
                status = await get(round(flood_rng.uniform(*SERVICE_S) * 1000), flood_headers)
            except (aiohttp.ClientError, TimeoutError) as error:
                status = -1
                count(f"flood {type(error).__name__}")
                await asyncio.sleep(0.05)
            if window_start <= now() < window_end:
                if status == 200:
                    flood_done += 1
                elif status > 0:
                    count(f"flood {status}")

    latencies: list[float] = []

    async def quiet_call(ms: int) -> None:
        sent = now()
        try:
            status = await get(ms, quiet_headers)
        except (aiohttp.ClientError, TimeoutError) as error:
            count(f"quiet {type(error).__name__}")
            return
        if window_start <= sent < window_end:
            if status == 200:
                latencies.append(now() - sent)
            else:
                count(f"quiet {status}")

    cpu: dict[str, float] = {}

    async def sample_cpu() -> None:  # CPU over the window: this process, the server, all
        for edge, at in (("0", window_start), ("1", window_end)):
            await asyncio.sleep(max(0.0, at - now()))
            cpu["wall" + edge], cpu["self" + edge] = now(), time.process_time()
            cpu["machine" + edge] = machine_busy_seconds()
            if server_pid:
                cpu["server" + edge] = _proc_cpu_seconds(server_pid) or 0.0

    sampler = asyncio.create_task(sample_cpu())
    flooders = [asyncio.create_task(flooder()) for _ in range(flood)]
    quiet_rng = random.Random(seed)
    quiet_tasks: set[asyncio.Task[None]] = set()
    next_at = start + quiet_rng.expovariate(quiet_rate) if quiet_rate > 0 else window_end
    while next_at < window_end:
        await asyncio.sleep(max(0.0, next_at - now()))
        task = asyncio.create_task(quiet_call(round(quiet_rng.uniform(*SERVICE_S) * 1000)))
        quiet_tasks.add(task)
        task.add_done_callback(quiet_tasks.discard)
        next_at += quiet_rng.expovariate(quiet_rate)
    await sampler
    window = cpu["wall1"] - cpu["wall0"]
    if quiet_tasks:
        await asyncio.wait(list(quiet_tasks), timeout=30)
    unfinished = len(quiet_tasks)
    for task in flooders:
        task.cancel()
    await asyncio.gather(*flooders, *quiet_tasks, return_exceptions=True)
    await session.close()
    latencies.sort()
    result: dict[str, Any] = {
        "window_s": window,
        "quiet_calls": len(latencies),
        "quiet_unfinished": unfinished,
        "quiet_p50_ms": percentile(latencies, 0.50) * 1000,
        "quiet_p99_ms": percentile(latencies, 0.99) * 1000,
        "quiet_max_ms": (latencies[-1] if latencies else float("nan")) * 1000,
        "flood_per_second": flood_done / window,
        "other_statuses": statuses,
        "loadgen_cpu": (cpu["self1"] - cpu["self0"]) / window,
        "machine_cpu": (cpu["machine1"] - cpu["machine0"]) / window,
    }
    if server_pid:
        result["server_cpu"] = (cpu["server1"] - cpu["server0"]) / window
        result["other_cpu"] = max(
            0.0, result["machine_cpu"] - result["server_cpu"] - result["loadgen_cpu"]
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--flood", type=int, default=256)
    parser.add_argument("--quiet-rate", type=float, default=25.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--server-pid", type=int, default=None)
    args = parser.parse_args()
    if not 0 < args.seconds <= 120 or not 0 <= args.warmup <= 30:
        sys.exit("--seconds must be in (0, 120] and --warmup in [0, 30]")
    if not 0 <= args.flood <= 2000 or not 0 <= args.quiet_rate <= 1000:
        sys.exit("--flood must be in [0, 2000] and --quiet-rate in [0, 1000]")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = run_loop(
        run(
            args.port,
            args.flood,
            args.quiet_rate,
            args.warmup,
            args.seconds,
            args.seed,
            args.server_pid,
        )
    )
    result["loop"] = loop_name()
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
