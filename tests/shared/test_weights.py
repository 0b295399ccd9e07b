"""Weights in a limit shared across processes, on a real redis-server: held weight never over
the limit across processes, FIFO by ticket with the oldest waiter never passed, the weight
read back in every figure, a waiter's weight gone with it, clear errors for what cannot
work, and the state's weight rebuilt from the lease ids when Redis loses it."""

from __future__ import annotations

import asyncio

import pytest

from gym_concurrency import SharedLimit
from tests.shared.helpers import Limits, leases, settle, wait_for
from tests.shared.redis_server import RedisServer


async def test_held_weight_across_processes_never_passes_the_limit(limits: Limits) -> None:
    a, b, c = limits(10), limits(10), limits(10)
    assert await a.enqueue(7) == "admitted"
    heavy = b.enqueue(4)  # 7 + 4 > 10: it waits
    await settle(b)  # (queued in Redis first: the order across processes is Redis's)
    light = c.enqueue(3)  # would fit, but never passes the waiter before it
    await settle(a, b, c)
    assert not heavy.done()
    assert not light.done()
    assert (a.active, a.global_active, a.available) == (7, 7, 3)
    shared = c.statistics().shared
    assert shared is not None
    assert (shared.queue_depth, shared.queued_weight, shared.flows) == (2, 7, 1)
    assert (b.queued_weight, c.statistics().queued_weight) == (4, 3)
    assert [(f.flow, f.held, f.queue_depth, f.queued_weight) for f in b.flow_statistics()] == [
        (None, 0, 1, 4)
    ]
    a.release(7)
    assert await asyncio.wait_for(heavy, 3) == "admitted"
    assert await asyncio.wait_for(light, 3) == "admitted"  # 4 + 3 fit together
    await settle(a, b, c)
    assert (b.active, c.active, a.global_active) == (4, 3, 7)
    b.release(4)
    c.release(3)


async def test_a_heavy_waiter_keeps_what_frees_until_it_fits(limits: Limits) -> None:
    a, b, c = limits(4), limits(4), limits(4)
    assert [await a.enqueue(), await a.enqueue()] == ["admitted"] * 2
    assert await a.enqueue(2) == "admitted"
    whole = b.enqueue(4)
    await settle(b)
    one = c.enqueue(1)
    await settle(a, b, c)
    a.release()  # 1 free: kept for the head (4), not given to the 1 behind it
    await asyncio.sleep(0.3)
    assert not one.done()
    a.release()
    a.release(2)
    assert await asyncio.wait_for(whole, 3) == "admitted"
    assert not one.done()
    b.release(4)
    assert await asyncio.wait_for(one, 3) == "admitted"
    c.release()


async def test_a_waiter_that_times_out_takes_its_weight_out_of_the_queue(
    limits: Limits,
) -> None:
    a, b = limits(3), limits(3, timeout=0.3)
    assert await a.enqueue(3) == "admitted"
    assert await b.enqueue(2) == "timeout"
    await settle(a, b)
    assert (b.queued_weight, b.statistics().shared.queued_weight) == (0, 0)  # type: ignore[union-attr]
    waiting = b.enqueue(3)
    a.release(3)  # nothing of the one that left holds it back
    assert await asyncio.wait_for(waiting, 3) == "admitted"
    b.release(3)


async def test_a_cancelled_weighted_waiter_takes_its_weight_out_of_the_queue(
    limits: Limits,
) -> None:
    a, b, c = limits(3), limits(3), limits(3)
    assert await a.enqueue(3) == "admitted"
    heavy = asyncio.ensure_future(b.acquire(3))
    await settle(a, b)
    assert b.queued_weight == 3
    heavy.cancel()
    with pytest.raises(asyncio.CancelledError):
        await heavy
    assert (b.queued_weight, b.queue_depth, b.active) == (0, 0, 0)
    assert b.admission_cancelled == 1
    waiting = c.enqueue(2)  # nothing of the cancelled one left ahead of it
    await settle(b, c)
    a.release(3)
    assert await asyncio.wait_for(waiting, 3) == "admitted"
    await settle(a, b, c)
    assert (b.active, c.active) == (0, 2)
    c.release(2)


async def test_what_cannot_work_fails_at_the_call_naming_it(limits: Limits) -> None:
    limit = limits(4)
    with pytest.raises(ValueError, match="weight 5 is more than the limit 4"):
        limit.enqueue(5)
    with pytest.raises(ValueError, match=r"flow is None or a string .*got flow=7"):
        await limit.acquire(1, 7)  # a flow is named the same in every process: a string
    with pytest.raises(ValueError, match=r"without NUL .*got flow='a\\x00b'"):
        limit.enqueue(1, "a\0b")
    with pytest.raises(ValueError, match=r"at most 256 characters"):
        limit.enqueue(1, "x" * 257)
    with pytest.raises(TypeError, match="weight must be an int"):
        limit.enqueue(1.5)  # type: ignore[arg-type]
    assert await limit.enqueue(2) == "admitted"
    with pytest.raises(ValueError, match=r"released weight 3, which no slot .* holds 2"):
        limit.release(3)
    with pytest.raises(ValueError, match=r"released weight 2 in flow 'env-a', which no slot"):
        limit.release(2, "env-a")
    limit.release(2)
    with pytest.raises(ValueError, match="released with no slot held"):
        limit.release()


async def test_the_weight_held_is_rebuilt_from_the_leases_when_redis_loses_the_state(
    limits: Limits, redis_server: object
) -> None:
    a, b = limits(5), limits(5)
    client = redis_server.client()  # type: ignore[attr-defined]
    assert await a.enqueue(3) == "admitted"
    assert await a.enqueue(2) == "admitted"
    await settle(a)
    client.delete(a.redis_keys["state"])  # the counts go; the leases stay
    waiting = b.enqueue(1)
    await asyncio.sleep(0.5)
    assert not waiting.done()  # 5 of 5 held, counted again from the ids
    a.release(3)
    assert await asyncio.wait_for(waiting, 3) == "admitted"
    await wait_for(lambda: len(leases(client, a)) == 2, 2.0, "one lease each")
    assert b.global_active == 3  # 2 of a's and 1 of b's, as b's admission saw it
    a.release(2)
    b.release()


async def test_the_local_fallback_counts_weight_too(key: str) -> None:
    limit = SharedLimit(
        8, redis_url=UNREACHABLE, key=key, redis_unavailable="local", local_max_concurrent=3,
        lease_seconds=0.8, redis_timeout=0.2,
    )  # fmt: skip
    try:
        assert await limit.enqueue(2) == "admitted"  # through the fallback: 2 of its 3
        heavy = limit.enqueue(5)  # over its size: it waits for all 3
        await asyncio.sleep(0.1)
        assert not heavy.done()
        limit.release(2)
        assert await asyncio.wait_for(heavy, 3) == "admitted"
        assert (limit.active, limit.admission_unavailable) == (5, 2)
        limit.release(5)
        assert limit.active == 0
    finally:
        await limit.close()


UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing listens there


async def test_a_weighted_waiter_that_leaves_as_it_is_admitted_gives_back_its_own_ask(
    limits: Limits, redis_server: RedisServer
) -> None:
    """A task that leaves at the moment its wait for weight 3 in a flow is admitted (its
    client disconnected, or a timeout cancelled it in the same loop step) gives back what it
    was handed: never the slot of another task of the process, never an error."""
    client = redis_server.client()
    limit = limits(5)
    other = limit.enqueue()  # another task's slot: weight 1, the default flow
    assert await other == "admitted"
    limit.settle(other)
    await settle(limit)
    (others,) = leases(client, limit)
    heavy = limit.enqueue(3, "env-a")
    assert await heavy == "admitted"
    limit.leave(heavy)  # what wait_in_queue does when its task is cancelled now
    await settle(limit)
    assert (limit.active, limit.admission_cancelled) == (1, 1)
    assert leases(client, limit) == {others}
    alone = limit.enqueue(2, "env-b")
    assert await alone == "admitted"
    limit.release()
    limit.leave(alone)  # with nothing else held: no "released with no slot held"
    await settle(limit)
    assert (limit.active, limit.global_active) == (0, 0)
    assert leases(client, limit) == set()
