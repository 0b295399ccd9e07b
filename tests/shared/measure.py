# ruff: noqa: ASYNC110  (a measuring script polls plain state between its steps)
"""Figures for the shared limit on a real redis-server of its own (not a test; prints JSON):

    python -m tests.shared.measure [--handoffs 1000] [--waiters 100,10000]

- round trips: Redis script calls per admitted request on the uncontended path
  (goal 2: acquire, release; heartbeats are per process, counted apart);
- handoff: from `release()` in one process to the admission of the waiter in another
  (CLOCK_MONOTONIC is system-wide on Linux), p50 / p99 (goal p99 <= 5 ms on loopback);
- waiters: W waiters queued across 4 processes, each admission handing the one slot to the
  next waiter (which queues again at the back, so the queue stays W deep): Redis memory
  with all W queued, Redis CPU and wall time per admission (goal: flat from 100 to 10,000).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gym_concurrency import SharedLimit
from tests.shared.redis_server import RedisServer


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def round_trips(url: str, admissions: int) -> dict[str, float]:
    limit = SharedLimit(4, redis_url=url, key="rt")
    await limit.connect()
    calls: dict[str, int] = {}
    call = limit._store._call

    async def counted(script: str, args: list[Any]) -> list[Any]:
        calls[script] = calls.get(script, 0) + 1
        return await call(script, args)

    limit._store._call = counted  # type: ignore[method-assign]
    started = time.perf_counter()
    for _ in range(admissions):
        assert await limit.enqueue() == "admitted"
        limit.release()
        while limit._sync.background:
            await asyncio.sleep(0)
    elapsed = time.perf_counter() - started
    await limit.close()
    per = {name: count / admissions for name, count in calls.items()}
    return {
        "per_admission": per.get("acquire", 0) + per.get("remove", 0),
        "acquire": per.get("acquire", 0),
        "remove": per.get("remove", 0),
        "heartbeat_calls": calls.get("sync", 0) + calls.get("configure", 0),
        "uncontended_admit_release_us": elapsed / admissions * 1e6,
    }


def _pingpong(url: str, rounds: int, start_at: float, out: Any) -> None:
    async def run() -> list[tuple[str, float]]:
        limit = SharedLimit(1, redis_url=url, key="pingpong")
        await limit.connect()
        while time.monotonic() < start_at:
            await asyncio.sleep(0.001)
        events = []
        for _ in range(rounds):
            await limit.acquire()
            events.append(("admit", time.monotonic()))
            await asyncio.sleep(0.0005)
            events.append(("release", time.monotonic()))
            limit.release()
        await limit.close()
        return events

    out.put(asyncio.run(run()))


def handoffs(url: str, rounds: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.monotonic() + 2.0
    procs = [ctx.Process(target=_pingpong, args=(url, rounds, start_at, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
    merged = sorted((at, who, kind) for who, events in enumerate(results) for kind, at in events)
    gaps = []
    for (at, who, kind), (next_at, next_who, next_kind) in itertools.pairwise(merged):
        if kind == "release" and next_kind == "admit" and next_who != who:
            gaps.append((next_at - at) * 1000)
    return {
        "handoffs": len(gaps),
        "p50_ms": _quantile(gaps, 0.5),
        "p99_ms": _quantile(gaps, 0.99),
        "max_ms": max(gaps),
    }


def _waiters(url: str, count: int, ready: Any, stop: Any, out: Any) -> None:
    """`count` waiters that, once admitted, give the slot back and queue again at the back,
    so the queue stays `count` deep in this process until `stop` is set."""

    async def run() -> list[float]:
        limit = SharedLimit(1, redis_url=url, key="scale", lease_seconds=30)
        await limit.connect()
        times: list[float] = []

        async def one() -> None:
            while True:
                await limit.acquire()
                times.append(time.monotonic())
                limit.release()

        tasks = [asyncio.create_task(one()) for _ in range(count)]
        await asyncio.sleep(0)
        ready.put(True)
        while not stop.is_set():
            await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await limit.close()
        return times

    out.put(asyncio.run(run()))


async def waiters(
    server: RedisServer, total: int, processes: int = 4, seconds: float = 2.5
) -> dict[str, float]:
    """Steady state with `total` waiters queued across `processes`: each admission hands the
    slot on to the next process's waiter; Redis CPU and wall time per admission measured over
    `seconds` after a 0.5 s warm-up."""
    client = server.client()
    holder = SharedLimit(1, redis_url=server.url, key="scale", lease_seconds=30)
    assert await holder.enqueue() == "admitted"
    ctx = multiprocessing.get_context("spawn")
    ready, out, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_waiters, args=(server.url, total // processes, ready, stop, out))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    queue_key = holder.redis_keys["queue"]
    while client.zcard(queue_key) < total:
        await asyncio.sleep(0.01)
    await asyncio.sleep(1.5)  # a re-check round with every waiter queued
    memory = int(client.info("memory")["used_memory"])
    holder.release()
    await asyncio.sleep(0.5)
    begin, cpu_before = time.monotonic(), client.info("cpu")
    await asyncio.sleep(seconds)
    end, cpu_after = time.monotonic(), client.info("cpu")
    depth = client.zcard(queue_key)
    stop.set()
    results = [await asyncio.to_thread(out.get, True, 120) for _ in procs]
    for p in procs:
        p.join()
    await holder.close()
    cpu = sum(float(cpu_after[k]) - float(cpu_before[k]) for k in ("used_cpu_sys", "used_cpu_user"))
    admitted = sorted(t for times in results for t in times if begin <= t <= end)
    gaps = [(b - a) * 1e6 for a, b in itertools.pairwise(admitted)]
    return {
        "waiters": total,
        "queued_during_measurement": depth,
        "redis_used_memory_bytes": memory,
        "admissions_measured": len(admitted),
        "wall_us_per_admission": (end - begin) / len(admitted) * 1e6,
        "median_gap_us": statistics.median(gaps),
        "redis_cpu_us_per_admission": cpu / len(admitted) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--handoffs", type=int, default=1000)
    parser.add_argument("--waiters", default="100,10000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(Path(directory))
        try:
            client = server.client()
            empty = int(client.info("memory")["used_memory"])
            figures: dict[str, Any] = {
                "redis": client.info("server")["redis_version"],
                "redis_used_memory_empty_bytes": empty,
                "round_trips": asyncio.run(round_trips(server.url, 1000)),
                "handoff": handoffs(server.url, args.handoffs),
                "waiters": [asyncio.run(waiters(server, int(n))) for n in args.waiters.split(",")],
            }
        finally:
            server.stop()
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
