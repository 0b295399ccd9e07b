"""One in-process cell of benchmarks/flows.py: a MeteredSemaphore, a flood and a quiet flow.

The flood is `flood` closed-loop tasks, each holding one unit for uniform(10, 30) ms and asking
again at once; the quiet flow is an open loop of Poisson arrivals at `quiet_rate` a second,
each holding one unit for uniform(10, 30) ms. `flows=True` gives them flows "flood" and
"quiet"; `flows=False` leaves both in the default flow (plain FIFO, today's behaviour);
`flood=0` measures the quiet flow alone. Every draw comes from a seeded RNG: the quiet flow's
arrivals and service times are the same in every configuration of a round.

Reported: the quiet calls that arrived in the window (latency: arrival to the end of the
hold), and the flood's completions in the window. Bounded: warm-up + window, then the
outstanding quiet calls (at most a few seconds) and the flood is cancelled.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

SERVICE_S = (0.010, 0.030)
now = time.perf_counter


def run_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop (the `bench` extra), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def loop_name() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    return f"uvloop {getattr(uvloop, '__version__', '?')}"


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def run_cell(
    *,
    limit: int,
    flood: int,
    quiet_rate: float,
    flows: bool,
    warmup: float,
    seconds: float,
    seed: int,
) -> dict[str, Any]:
    from gym_concurrency import MeteredSemaphore

    semaphore = MeteredSemaphore(limit)
    flood_flow = "flood" if flows else None
    quiet_flow = "quiet" if flows else None
    start = now()
    window_start, window_end = start + warmup, start + warmup + seconds
    flood_done = 0
    flood_rng = random.Random(seed * 7919 + 1)

    async def flooder() -> None:
        nonlocal flood_done
        uniform = flood_rng.uniform
        while True:
            async with semaphore.hold(1, flood_flow):
                await asyncio.sleep(uniform(*SERVICE_S))
            if window_start <= now() < window_end:
                flood_done += 1

    latencies: list[float] = []
    waits: list[float] = []

    async def quiet_call(service: float) -> None:
        arrived = now()
        async with semaphore.hold(1, quiet_flow):
            admitted = now()
            await asyncio.sleep(service)
        if window_start <= arrived < window_end:
            latencies.append(now() - arrived)
            waits.append(admitted - arrived)

    flooders = [asyncio.create_task(flooder()) for _ in range(flood)]
    quiet_rng = random.Random(seed)
    quiet_tasks: set[asyncio.Task[None]] = set()
    next_at = start + quiet_rng.expovariate(quiet_rate)
    max_queue = 0
    while True:
        delay = next_at - now()
        if delay > 0:
            await asyncio.sleep(delay)
        if next_at >= window_end:
            break
        task = asyncio.create_task(quiet_call(quiet_rng.uniform(*SERVICE_S)))
        quiet_tasks.add(task)
        task.add_done_callback(quiet_tasks.discard)
        max_queue = max(max_queue, semaphore.queue_depth)
        next_at += quiet_rng.expovariate(quiet_rate)
    elapsed = now() - window_start
    if quiet_tasks:  # the quiet calls that arrived in the window end (bounded: 30 s)
        await asyncio.wait(list(quiet_tasks), timeout=30)
    for task in flooders:
        task.cancel()
    await asyncio.gather(*flooders, return_exceptions=True)
    latencies.sort()
    waits.sort()
    leaked = {"active": semaphore.active, "queue_depth": semaphore.queue_depth}
    return {
        "window_s": elapsed,
        "quiet_calls": len(latencies),
        "quiet_unfinished": len(quiet_tasks),
        "quiet_p50_ms": percentile(latencies, 0.50) * 1000,
        "quiet_p99_ms": percentile(latencies, 0.99) * 1000,
        "quiet_max_ms": (latencies[-1] if latencies else float("nan")) * 1000,
        "quiet_wait_p99_ms": percentile(waits, 0.99) * 1000,
        "flood_per_second": flood_done / elapsed,
        "max_queue_depth": max_queue,
        "leaked_after": leaked,
    }
