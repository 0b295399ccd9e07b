"""A global limit shrunk under a queued waiter heavier than its new size, on a real
redis-server, each SharedLimit standing for one process: the waiter is granted the whole limit
once it frees (a lease that weighs the limit, counted in `admission_capped`), gives it back by
releasing what it asked for, and the queue behind it moves on. A size of 0 is a pause."""

from __future__ import annotations

import asyncio

import redis

from gym_concurrency import SharedLimit
from tests.shared.helpers import Limits, leases, settle, wait_for
from tests.shared.redis_server import RedisServer


def held_in_redis(client: redis.Redis, limit: SharedLimit) -> int:
    """The weight Redis counts as held on `limit`'s key now."""
    return int(client.hget(limit.redis_keys["state"], "n"))


async def admitted(limit: SharedLimit, waiter: asyncio.Future[str], within: float = 3.0) -> None:
    """`waiter`'s wait ends "admitted" within `within` s, and its task takes what it got."""
    assert await asyncio.wait_for(waiter, within) == "admitted"
    limit.settle(waiter)


async def test_a_waiter_heavier_than_a_shrunk_global_limit_is_granted_all_of_it(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    a, b, c = limits(4), limits(4), limits(4)
    await admitted(a, a.enqueue())
    heavy = b.enqueue(4)  # 1 + 4 > 4: chosen next, capacity kept for it
    await settle(a, b)
    behind = [c.enqueue() for _ in range(3)]
    await settle(a, b, c)
    a.resize(2)  # 4 can never fit in 2
    await settle(a)
    a.release()
    await admitted(b, heavy)
    await settle(a, b, c)
    assert (b.active, b.admission_capped) == (2, 1)
    (lease,) = leases(client, b)
    assert lease.endswith("*4/2")  # asked 4, holds 2: what Redis counts
    assert b.statistics().shared.active == 2  # type: ignore[union-attr]
    assert not any(w.done() for w in behind)
    b.release(4)  # what it asked for: gives back the 2 it holds
    assert b.active == 0
    for waiter in behind[:2]:
        await admitted(c, waiter)
    await settle(a, b, c)
    assert not behind[2].done()
    c.release()
    await admitted(c, behind[2])
    c.release()
    c.release()
    await settle(a, b, c)
    assert leases(client, a) == set()
    assert client.hgetall(a.redis_keys["capped"]) == {}
    assert held_in_redis(client, a) == 0
    assert (a.active, b.active, c.active) == (0, 0, 0)


async def test_a_capped_flow_holds_what_it_was_granted_across_processes(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    a, b = limits(6), limits(6)
    await admitted(a, a.enqueue(2, "env-b"))
    heavy = b.enqueue(6, "env-a")
    await settle(a, b)
    behind = a.enqueue(1, "env-b")
    await settle(a, b)
    b.resize(3)
    await settle(b)
    a.release(2, "env-b")
    await admitted(b, heavy)
    await settle(a, b)
    assert client.hgetall(a.redis_keys["fheld"]) == {"env-a": "3"}
    assert not behind.done()  # env-a holds 3 of 3
    b.release(6, "env-a")
    await admitted(a, behind)
    await settle(a, b)
    assert client.hgetall(a.redis_keys["fheld"]) == {"env-b": "1"}
    a.release(1, "env-b")
    await settle(a, b)
    assert held_in_redis(client, a) == 0


async def test_zero_pauses_a_heavy_global_waiter_and_the_next_size_caps_it(
    limits: Limits, redis_server: RedisServer
) -> None:
    a, b = limits(4), limits(4)
    await admitted(a, a.enqueue())
    heavy = b.enqueue(4)
    await settle(a, b)
    a.resize(0)
    await settle(a)
    a.release()
    await asyncio.sleep(0.8)  # a renewal or more: nothing is granted at 0
    assert not heavy.done()
    assert b.admission_capped == 0
    a.resize(3)
    await admitted(b, heavy)
    assert (b.active, b.admission_capped) == (3, 1)
    b.release(4)
    await settle(a, b)
    assert held_in_redis(redis_server.client(), a) == 0


async def test_a_process_that_saw_the_older_size_is_granted_at_once_on_an_idle_limit(
    limits: Limits, redis_server: RedisServer
) -> None:
    # b last saw 8; a shrinks the limit to 2. b asks 6 (it checks against 8): Redis queues it
    # and, the limit being idle, grants it all 2 in that same call. With both heartbeats
    # stopped, nothing else could grant it.
    a, b = limits(8), limits(8)
    await admitted(a, a.enqueue(), within=5.0)  # (after any grace a young Redis starts)
    await admitted(b, b.enqueue())
    a.release()
    b.release()
    await settle(a, b)
    await a._heartbeat.join()
    await b._heartbeat.join()
    a.resize(2)
    await settle(a)
    assert b.limit == 8
    heavy = b.enqueue(6)
    await admitted(b, heavy, within=2.0)
    assert (b.active, b.admission_capped) == (2, 1)
    b.release(6)
    await settle(a, b)
    assert held_in_redis(redis_server.client(), a) == 0


async def test_a_renewal_learns_of_a_capped_grant_whose_notification_was_not_read(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    a, b = limits(4), limits(4)
    await admitted(a, a.enqueue())
    heavy = b.enqueue(4)
    await settle(a, b)
    for task in b._life.tasks:  # b's mailbox stops: it learns of grants from its renewals only
        task.cancel()
    a.resize(2)
    await settle(a)
    a.release()
    await admitted(b, heavy, within=3.0)  # a renewal at most a third of a lease later
    await settle(a, b)
    assert b.active == 2
    (lease,) = leases(client, b)
    assert lease.endswith("*4/2")
    assert client.zcard(a.redis_keys["queue"]) == 0  # not queued again besides
    b.release(4)
    await wait_for(lambda: not leases(client, b), 2.0, "the lease removed")
    assert held_in_redis(client, a) == 0


async def test_a_waiter_that_leaves_before_hearing_of_its_capped_grant_frees_it_at_once(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    a, b = limits(4), limits(4)
    await admitted(a, a.enqueue())
    heavy = b.enqueue(4)
    await settle(a, b)
    await b._heartbeat.join()  # b hears of no grant: no mailbox, no renewal
    for task in b._life.tasks:
        task.cancel()
    a.resize(2)
    await settle(a)
    a.release()
    await wait_for(lambda: held_in_redis(client, a) == 2, 2.0, "the capped grant")
    b.leave(heavy)  # its client went away: Redis drops the lease it was granted, unheard of
    await settle(b)
    assert held_in_redis(client, a) == 0
    assert leases(client, a) == set()
    assert client.hgetall(a.redis_keys["capped"]) == {}
    assert (b.active, b.admission_cancelled) == (0, 1)
