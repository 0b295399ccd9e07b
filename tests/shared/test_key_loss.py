"""A shared limit whose Redis loses one of its keys (an operator's DEL, an eviction), step by
step on a real redis-server: the loss starts a grace in which nothing is granted while the
holders re-register; leases re-registered over a limit that shrank meanwhile count until
their work drains; and a Redis that may evict the limit's keys is said at start."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gym_concurrency import SharedLimit
from tests.shared.helpers import held_ids, leases, settle, wait_for
from tests.shared.redis_server import RedisServer

# redis_timeout: generous for a loaded 2-core machine (0.2 s timed out a first acquire).
LEASE = {"lease_seconds": 0.8, "redis_timeout": 0.5}


@pytest.fixture
async def pair(redis_server: RedisServer, key: str) -> AsyncIterator[list[SharedLimit]]:
    """Two processes' limit of 1 (two SharedLimits with one key)."""
    made = [SharedLimit(1, redis_url=redis_server.url, key=key, **LEASE) for _ in range(2)]
    yield made
    for limit in made:
        await limit.close()


@pytest.mark.parametrize("lost", ["leases", "state", "leases state", "limit state"])
async def test_a_key_lost_under_a_holder_grants_its_slot_to_nobody(
    pair: list[SharedLimit], redis_server: RedisServer, lost: str
) -> None:
    holder, other = pair
    client = redis_server.client()
    assert await holder.enqueue() == "admitted"
    await settle(holder)
    client.delete(*(holder.redis_keys[name] for name in lost.split()))
    waiting = other.enqueue()
    await asyncio.sleep(1.5 * LEASE["lease_seconds"])
    assert not waiting.done()  # never two holders of a limit of 1
    assert leases(client, holder) == held_ids(holder)  # re-registered by its heartbeat
    holder.release()
    assert await asyncio.wait_for(waiting, 3) == "admitted"
    other.release()
    await settle(holder, other)


async def test_lost_leases_that_no_longer_fit_count_until_their_work_drains(
    redis_server: RedisServer, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Leaving them out would keep Redis's count within the limit and hand their slots out
    # a second time while their work runs on.
    client = redis_server.client()
    limit, other = (SharedLimit(2, redis_url=redis_server.url, key=key, **LEASE) for _ in "ab")
    try:
        assert [await limit.enqueue(), await limit.enqueue()] == ["admitted"] * 2
        await settle(limit)
        limit.resize(1)  # shrinking revokes nothing: 2 held for 1
        await wait_for(lambda: client.get(limit.redis_keys["limit"]) == "1", 3.0, "resized")
        client.delete(limit.redis_keys["leases"])
        await wait_for(lambda: leases(client, limit) == held_ids(limit), 3.0, "re-registered")
        # (said on the event loop once the renewal hands over what it learned)
        await wait_for(lambda: "over the limit: 2 held for 1" in caplog.text, 3.0, "said")
        assert limit.admission_lease_lost == 0
        waiting = other.enqueue()
        limit.release()
        await asyncio.sleep(1.5 * LEASE["lease_seconds"])
        assert not waiting.done()  # 1 held for 1
        limit.release()
        assert await asyncio.wait_for(waiting, 3) == "admitted"
        other.release()
        await settle(limit, other)
    finally:
        await limit.close()
        await other.close()


@pytest.fixture
def evicting(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
    yield server
    server.stop()


async def test_a_redis_that_may_evict_the_limit_s_keys_is_said_once_at_start(
    evicting: RedisServer, redis_server: RedisServer, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "gym_concurrency")
    for url in (redis_server.url, evicting.url):
        limit = SharedLimit(1, redis_url=url, key=key, **LEASE)
        try:
            await limit.connect()
            limit.resize(2)
            await settle(limit)
        finally:
            await limit.close()
    said = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(said) == 1, said
    assert "allkeys-lru" in said[0]
    assert "noeviction" in said[0]  # what to do instead
    assert f":{evicting.port}/" in said[0]  # which Redis
    assert redis_server.client().config_get("maxmemory")["maxmemory"] == "0"
