"""A global limit's waiter with a deadline of its own, against a real redis-server: the wait
ends "deadline" (DeadlineExceededError from `acquire()`, a TimeoutError) when the deadline is
past or passes first, "timeout" when the limit's own timeout does; each counted once, as a
timeout, in the process where it happened, and nothing is left queued in Redis."""

from __future__ import annotations

import asyncio
import time

import pytest

from gym_concurrency import DeadlineExceededError
from gym_concurrency.deadline import within_deadline
from tests.shared.helpers import Limits, queued, settle
from tests.shared.redis_server import RedisServer


async def test_a_past_deadline_is_refused_at_once_as_a_deadline(limits: Limits) -> None:
    holder, waiting = limits(1), limits(1, timeout=30)
    assert await holder.enqueue() == "admitted"
    refused = waiting.enqueue(deadline=0)
    assert refused.done()
    assert refused.result() == "deadline"
    with pytest.raises(DeadlineExceededError, match="no slot within the deadline"):
        await waiting.acquire(deadline=-1)
    assert (waiting.admission_timeouts, waiting.queue_depth) == (2, 0)
    holder.release()


async def test_a_queued_wait_ends_at_its_deadline_as_a_deadline(
    limits: Limits, redis_server: RedisServer
) -> None:
    holder, waiting = limits(1), limits(1, timeout=30)
    assert await holder.enqueue() == "admitted"
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        await waiting.acquire(deadline=0.2)
    assert 0.18 <= time.monotonic() - started < 1.5
    loop = asyncio.get_running_loop()
    with within_deadline(loop.time() + 0.2), pytest.raises(DeadlineExceededError):
        async with waiting:  # inside a request with 0.2 s left, as the middleware sets it
            pass
    await settle(holder, waiting)
    assert (waiting.admission_timeouts, holder.admission_timeouts) == (2, 0)
    assert queued(redis_server.client(), holder) == []  # it left the global queue
    holder.release()


async def test_the_limits_own_timeout_is_a_plain_timeout(limits: Limits) -> None:
    holder, waiting = limits(1), limits(1, timeout=0.2)
    assert await holder.enqueue() == "admitted"
    assert await waiting.enqueue(deadline=30) == "timeout"
    with pytest.raises(TimeoutError) as raised:
        await waiting.acquire(deadline=30)
    assert type(raised.value) is TimeoutError
    assert waiting.admission_timeouts == 2
    holder.release()
