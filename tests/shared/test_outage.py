"""Redis paused (SIGSTOP) and restarted under a SharedLimit: "refuse" answers "unavailable",
"local" admits within its fallback, each counted; Redis coming back needs no restart of any
limit, and afterwards no slot is lost (leases Redis forgot are re-registered) or phantom
(leases given back while Redis was away are removed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest
import redis
import redis.asyncio as aioredis

from gym_concurrency import LimitUnavailableError, SharedLimit
from tests.shared.helpers import Limits, held_ids, leases, queued, settle, wait_for
from tests.shared.redis_server import RedisServer

OUTAGE = {"lease_seconds": 4.0, "redis_timeout": 0.3}


async def back(*limits: SharedLimit) -> float:
    """Wait until every limit reaches Redis again (nothing restarted); the seconds it took."""
    return await wait_for(lambda: all(x.connected for x in limits), 2.0, "Redis reached again")


async def test_refuse_answers_unavailable_while_redis_is_paused_and_recovers_exactly(
    on_own: Limits, own_redis: RedisServer
) -> None:
    client = own_redis.client()
    a, b, c = on_own(2, **OUTAGE), on_own(2, **OUTAGE), on_own(2, **OUTAGE)
    assert await a.enqueue() == "admitted"
    assert await a.enqueue() == "admitted"
    queued_before = c.enqueue()  # waits in line through the outage
    await settle(a, b, c)
    kept = held_ids(a)

    own_redis.pause()
    started = time.monotonic()
    answers = await asyncio.gather(*(b.enqueue() for _ in range(5)))
    assert answers == ["unavailable"] * 5
    assert time.monotonic() - started < 1.0  # bounded by redis_timeout, not hanging
    assert await b.enqueue() == "unavailable"  # known down: answered at once
    with pytest.raises(LimitUnavailableError):
        await b.acquire()
    assert b.admission_unavailable == 7
    assert not b.connected
    a.release()  # given back while Redis is away: removed once it answers again
    await asyncio.sleep(1.0)
    own_redis.resume()

    await back(a, b, c)
    assert await queued_before == "admitted"  # the released slot, to the waiter in line
    await settle(a, b, c)
    assert leases(client, a) == held_ids(a, c)  # nothing lost, nothing phantom
    assert len(kept & leases(client, a)) == 1
    assert queued(client, a) == []
    assert (a.admission_unavailable, c.admission_unavailable) == (0, 0)
    a.release()
    assert await b.enqueue() == "admitted"  # b reaches Redis again with no restart
    b.release()
    c.release()
    await settle(a, b, c)
    assert leases(client, a) == set()


async def test_local_admits_within_the_fallback_while_redis_is_paused(
    on_own: Limits, own_redis: RedisServer
) -> None:
    client = own_redis.client()
    # A Redis up for less than a lease may have lost slots still held: the first admission
    # on it waits a lease (the grace period); here without a timeout.
    warm = on_own(4, **OUTAGE)
    assert await warm.enqueue() == "admitted"
    warm.release()
    limit = on_own(4, redis_unavailable="local", local_max_concurrent=2, timeout=0.6, **OUTAGE)
    assert await limit.enqueue() == "admitted"  # a lease in Redis
    lease = held_ids(limit)

    own_redis.pause()
    answers = await asyncio.gather(*(limit.enqueue() for _ in range(3)))
    # Two fallback slots; the third waits in the fallback until its timeout.
    assert sorted(answers) == ["admitted", "admitted", "timeout"]
    assert limit.admission_unavailable == 3
    assert limit.admission_timeouts == 1
    assert limit.active == 3  # one lease and two fallback slots
    more = limit.enqueue()
    assert not more.done()  # the fallback is full: it waits there
    limit.release()  # a fallback slot first: it passes to the waiter in the fallback
    assert await more == "admitted"
    assert limit.admission_unavailable == 4
    own_redis.resume()

    await back(limit)
    await settle(limit)
    # The lease held through the outage is kept, and the fallback's slots still held are
    # leases now (counted before anything more is granted).
    assert leases(client, limit) == held_ids(limit)
    assert lease < held_ids(limit)
    assert len(held_ids(limit)) == 3
    assert await limit.enqueue() == "admitted"  # Redis again, no restart
    for _ in range(limit.active):
        limit.release()
    await settle(limit)
    assert limit.active == 0
    assert leases(client, limit) == set()
    assert limit.admission_unavailable == 4


@pytest.mark.parametrize("mode", ["refuse", "local"])
async def test_after_a_redis_restart_leases_and_waiters_are_re_registered(
    on_own: Limits, own_redis: RedisServer, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    caplog.set_level(logging.WARNING, "gym_concurrency.limits.shared")
    client = own_redis.client()
    options = {"lease_seconds": 1.5, "redis_timeout": 0.3}
    fallback = {"redis_unavailable": "local", "local_max_concurrent": 1} if mode == "local" else {}
    a, b, c = on_own(2, **options), on_own(2, **options), on_own(2, **options, **fallback)
    assert await a.enqueue() == "admitted"
    assert await a.enqueue() == "admitted"
    waiting = b.enqueue()
    await settle(a, b, c)
    waiter_id = queued(client, a)

    most = 0
    watching = aioredis.Redis.from_url(own_redis.url, socket_timeout=1)

    async def watch() -> None:  # never more leases than the limit, through the recovery
        nonlocal most
        while True:
            with contextlib.suppress(redis.RedisError):  # down for a moment
                most = max(most, await watching.zcard(a.redis_keys["leases"]))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    restart = asyncio.create_task(asyncio.to_thread(own_redis.restart, 0.6))
    await asyncio.sleep(0.3)  # Redis is down now
    if mode == "refuse":
        assert await c.enqueue() == "unavailable"
    else:  # admitted within the fallback (one slot): the next one waits there
        assert await c.enqueue() == "admitted"
        assert not c.enqueue().done()
    assert c.admission_unavailable == (1 if mode == "refuse" else 2)
    await restart  # everything in Redis is gone
    await back(a, b, c)
    await wait_for(lambda: client.zcard(a.redis_keys["leases"]) >= 2, 2.0, "leases re-registered")
    await settle(a, b, c)
    assert leases(client, a) | set(queued(client, a)) >= held_ids(a) | set(waiter_id)
    assert client.get(a.redis_keys["limit"]) == "2"  # the size, restored
    assert "re-registered" in caplog.text
    assert not waiting.done()  # still 2 of 2 held
    a.release()
    if mode == "local":  # the fallback's slot is a lease in Redis now: it counts too
        await asyncio.sleep(0.3)
        assert not waiting.done()
        c.release()  # its waiter in the fallback queues in Redis now: both are admitted
        a.release()
    assert await asyncio.wait_for(waiting, 3.0) == "admitted"
    await settle(a, b, c)
    watcher.cancel()
    await watching.aclose()
    assert most <= (3 if mode == "local" else 2)  # (with the fallback's slot counted)
    for limit in (a, b, c):
        while limit.active:
            limit.release()
    await settle(a, b, c)
    if mode == "local":  # the fallback's waiter had its slot, and gave it back
        assert c.active == 0
        assert c.queue_depth == 0
    assert leases(client, a) == set()
    assert queued(client, a) == []


async def test_a_pause_longer_than_the_lease_loses_no_slot_and_leaves_no_phantom(
    on_own: Limits, own_redis: RedisServer
) -> None:
    client = own_redis.client()
    # A call may take a while on a loaded machine: a second to answer, still well inside
    # the lease, which the pause outlasts.
    a = on_own(3, lease_seconds=2.4, redis_timeout=1.0)
    for _ in range(3):
        assert await a.enqueue() == "admitted"
    own_redis.pause()
    await asyncio.sleep(0.3)
    a.release()  # given back during the outage
    await asyncio.sleep(2.5)  # every lease's deadline passes while Redis is stopped
    own_redis.resume()
    await back(a)
    await settle(a)
    await a._sync.sync()
    assert leases(client, a) == held_ids(a)  # the two still held came back; the third not
    assert len(held_ids(a)) == 2
    a.release()
    a.release()
    await settle(a)
    assert leases(client, a) == set()
