"""One client process of benchmarks/shared_cost.py (not run by hand).

    python -m benchmarks._shared_cost_worker --config process|shared --tasks T --limit L
        --admissions N [--redis-url URL --key KEY] [--budget] [--profile PATH] [--no-uvloop]

Makes the limit (MeteredSemaphore, or SharedLimit on `--redis-url`), warms it up (connect,
the first admissions: a young Redis's grace period, script loading), prints `ready`, waits for
`go` on stdin, then runs N admissions with T tasks (each: acquire, yield once if T > 1 so
that the others queue, release), waits for the limit's releases in flight to end, and prints
one JSON line: the client CPU (`time.process_time()`, every thread of this process: the
heartbeat's too) and wall time of that window, the admissions made and the script calls by
name (counted where the library's store has `_call`). `--budget`: the shared limit carries a
rate budget too large to refuse (so that what is measured is its cost), and each admission
reserves 500 tokens and settles 120 (`enqueue`, `settle`, `reservation.settle`, `release`: the
refund rides on the release's call). Then waits for `close`, closes the
limit and exits. `gym_concurrency` is whatever the working folder / sys.path gives: the
driver checks the `library` it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import sys
import time
from typing import Any

WARMUP = 50


def _count_calls(limit: Any, calls: dict[str, int]) -> bool:
    """Wrap the store's script calls to count them by name (the measured tree's internals:
    False where they are not there; Redis's own command stats count them anyway)."""
    store = getattr(limit, "_store", None)
    if store is None or not hasattr(store, "_call"):
        return False
    call, blocking = store._call, getattr(store, "_call_blocking", None)

    async def counted(script: str, *args: Any) -> Any:
        calls[script] = calls.get(script, 0) + 1
        return await call(script, *args)

    def counted_blocking(script: str, *args: Any) -> Any:
        calls[script] = calls.get(script, 0) + 1  # (the heartbeat thread: one writer)
        return blocking(script, *args)  # type: ignore[misc]

    store._call = counted
    if blocking is not None:
        store._call_blocking = counted_blocking
    return True


async def _settled(limit: Any) -> None:
    """Until the releases this process sent are answered (a shared limit releases in the
    background); at most 2 s."""
    sync = getattr(limit, "_sync", None)
    if not hasattr(limit, "redis_url") and not hasattr(limit, "_store"):
        return  # a process limit: nothing in flight
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        background = getattr(sync, "background", None)
        if background is None:
            await asyncio.sleep(0.02)  # (another tree: no handle on its tasks)
            return
        if not [t for t in background if not t.done()]:
            return
        await asyncio.sleep(0.001)


async def _admissions(limit: Any, tasks: int, admissions: int, budget: bool = False) -> int:
    done = 0

    async def one() -> None:
        nonlocal done
        while done < admissions:
            reservation = None
            if budget:
                waiter = limit.enqueue(tokens=500)
                assert await waiter == "admitted"
                reservation = limit.settle(waiter)
            else:
                await limit.acquire()
            if tasks > 1:
                await asyncio.sleep(0)  # hold across a turn of the loop: the others queue
            done += 1
            if reservation is not None:
                reservation.settle(120)
            limit.release()

    await asyncio.gather(*(one() for _ in range(tasks)))
    return done


async def run(args: argparse.Namespace) -> None:
    import gym_concurrency
    from gym_concurrency import MeteredSemaphore, SharedLimit

    limit: Any
    if args.config == "process":
        limit = MeteredSemaphore(args.limit)
    else:
        options: dict[str, Any] = {}
        if args.budget:
            from gym_concurrency.limits.rate_budget import RateBudget

            big = 10**12  # never refuses: the cost is measured, not the budget
            options["budget"] = RateBudget(tokens_per_minute=big, requests_per_minute=big)
        limit = SharedLimit(args.limit, redis_url=args.redis_url, key=args.key, **options)
        await limit.connect()
    await _admissions(limit, min(args.tasks, WARMUP), WARMUP, args.budget)
    await _settled(limit)
    calls: dict[str, int] = {}
    counting = _count_calls(limit, calls)
    print("ready", flush=True)
    assert (await asyncio.to_thread(sys.stdin.readline)).strip() == "go"
    profile = cProfile.Profile() if args.profile else None
    wall, cpu = time.perf_counter(), time.process_time()
    if profile is not None:
        profile.enable()
    done = await _admissions(limit, args.tasks, args.admissions, args.budget)
    await _settled(limit)
    if profile is not None:
        profile.disable()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if profile is not None:
        profile.dump_stats(args.profile)
    from redis.utils import HIREDIS_AVAILABLE

    result = {
        "admissions": done,
        "cpu_s": cpu,
        "wall_s": wall,
        "script_calls": calls if counting else None,
        "library": gym_concurrency.__file__,
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        "hiredis": HIREDIS_AVAILABLE,
    }
    print(json.dumps(result), flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # "close": after the driver's Redis figures
    if args.config == "shared":
        await limit.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", choices=("process", "shared"), required=True)
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--admissions", type=int, default=2000)
    parser.add_argument("--redis-url")
    parser.add_argument("--key", default="shared-cost")
    parser.add_argument("--budget", action="store_true")
    parser.add_argument("--profile")
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args()
    factory = None
    if not args.no_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(run(args))


if __name__ == "__main__":
    main()
