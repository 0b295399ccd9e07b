"""Is cancelling N queued waiters linear in N? Ratio of 10,000 to 1,000 waiters, same process.

    python benchmarks/scale_cancel.py [--repeat 5]

For MeteredSemaphore and, as a baseline, asyncio.Semaphore: the best of `repeat` runs of
"queue N waiters behind a held slot, cancel them all at once, wait until all have left".
Linear cost gives a ratio near 10; quadratic cost gives one near 100. Exits 1 if
MeteredSemaphore's ratio is above 20.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from time import perf_counter

from gym_concurrency import MeteredSemaphore

SIZES = (1_000, 10_000)
LINEAR_BOUND = 20.0


async def cancel_waiters(make: Callable[[], asyncio.Semaphore], waiters: int) -> float:
    """Seconds from cancelling `waiters` queued acquires to all of them having left."""
    semaphore = make()
    await semaphore.acquire()
    tasks = [asyncio.create_task(semaphore.acquire()) for _ in range(waiters)]
    await asyncio.sleep(0)
    started = perf_counter()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = perf_counter() - started
    semaphore.release()
    return elapsed


def best_of(make: Callable[[], asyncio.Semaphore], waiters: int, repeat: int) -> float:
    return min(asyncio.run(cancel_waiters(make, waiters)) for _ in range(repeat))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    subjects: dict[str, Callable[[], asyncio.Semaphore]] = {
        "MeteredSemaphore": lambda: MeteredSemaphore(1, component="bench", limit_name="cancel"),
        "asyncio.Semaphore": lambda: asyncio.Semaphore(1),
    }
    ratios = {}
    for name, make in subjects.items():
        small, large = (best_of(make, n, repeat) for n in SIZES)
        ratios[name] = large / small
        print(
            f"{name:18} {SIZES[0]:>6} waiters: {small * 1000:8.2f} ms  "
            f"{SIZES[1]:>6} waiters: {large * 1000:8.2f} ms  ratio {ratios[name]:6.1f}"
        )
    linear = ratios["MeteredSemaphore"] <= LINEAR_BOUND
    print(
        f"MeteredSemaphore ratio {ratios['MeteredSemaphore']:.1f} "
        f"({'linear' if linear else 'NOT linear'}: bound {LINEAR_BOUND})"
    )
    return 0 if linear else 1


if __name__ == "__main__":
    sys.exit(main())
