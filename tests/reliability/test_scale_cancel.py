"""Scale: 10,000 waiters queued on one MeteredSemaphore, cancelled at once, all leave.

Time is only bounded generously here; benchmarks/scale_cancel.py measures that the cost is
linear in the number of waiters (1,000 vs 10,000 as a ratio).
"""

from __future__ import annotations

import asyncio
import uuid
from time import perf_counter

import pytest

from gym_concurrency import MeteredSemaphore, observe_concurrency
from gym_concurrency.names import (
    ADMISSION_CANCELLED_INSTRUMENT,
    CONCURRENCY_ACTIVE_INSTRUMENT,
    QUEUE_DEPTH_INSTRUMENT,
)
from tests.metrics_capture import MetricsCapture

WAITERS = 10_000
GENEROUS_SECONDS = 30.0


async def queue_waiters(semaphore: MeteredSemaphore, count: int) -> list[asyncio.Task[bool]]:
    """`count` tasks waiting on `semaphore` (whose slots are all held)."""
    tasks: list[asyncio.Task[bool]] = [
        asyncio.create_task(semaphore.acquire()) for _ in range(count)
    ]
    await asyncio.sleep(0)  # each task runs up to its wait
    assert semaphore.queue_depth == count
    return tasks


async def cancel_all(tasks: list[asyncio.Task[bool]]) -> float:
    """Cancel every task at once and wait for all; the seconds it took."""
    started = perf_counter()
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = perf_counter() - started
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    return elapsed


def reported(metrics: MetricsCapture, name: str, limit_name: str) -> int:
    """The value the observer reports for `limit_name` (summed over its attribute set)."""
    values = metrics.values(name)
    return sum(
        v
        for attrs, v in values.items()
        if dict(attrs).get("nemo.gym.concurrency.limit_name") == limit_name
    )


@pytest.mark.slow
async def test_ten_thousand_queued_waiters_cancelled_at_once_all_leave(metrics: MetricsCapture):
    limit_name = f"scale_{uuid.uuid4().hex[:8]}"
    semaphore = MeteredSemaphore(1, component="reliability", limit_name=limit_name)
    observe_concurrency(metrics.provider)
    await semaphore.acquire()
    tasks = await queue_waiters(semaphore, WAITERS)

    elapsed = await cancel_all(tasks)

    assert (semaphore.queue_depth, semaphore.admission_cancelled) == (0, WAITERS)
    assert (semaphore.active, semaphore.admission_timeouts, semaphore.admission_shed) == (1, 0, 0)
    assert reported(metrics, QUEUE_DEPTH_INSTRUMENT, limit_name) == 0
    assert reported(metrics, ADMISSION_CANCELLED_INSTRUMENT, limit_name) == WAITERS
    semaphore.release()
    assert (semaphore.active, semaphore.locked()) == (0, False)
    assert reported(metrics, CONCURRENCY_ACTIVE_INSTRUMENT, limit_name) == 0
    assert elapsed < GENEROUS_SECONDS, f"cancelling {WAITERS} waiters took {elapsed:.1f} s"


@pytest.mark.slow
async def test_a_slot_released_into_ten_thousand_cancelled_waiters_is_not_lost():
    # The release hands the slot to the first waiter, which is cancelled in the same loop
    # iteration: the slot must pass along the queue and come back free, exactly once.
    semaphore = MeteredSemaphore(1, component="reliability", limit_name="scale_release")
    await semaphore.acquire()
    tasks = await queue_waiters(semaphore, WAITERS)
    semaphore.release()

    await cancel_all(tasks)

    assert (semaphore.active, semaphore.queue_depth) == (0, 0)
    assert semaphore.admission_cancelled == WAITERS
    await asyncio.wait_for(semaphore.acquire(), 1)  # the one slot is free again ...
    assert semaphore.locked()  # ... and only one
    semaphore.release()
    with pytest.raises(ValueError, match="no slot held"):
        semaphore.release()
