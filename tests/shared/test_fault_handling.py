"""How one SharedLimit behaves under the faults of tests/shared/faults, step by step on a real
redis-server: leases renewed while the event loop is blocked, leases it could not renew
counted lost (the metric, the log line, the hook) with admissions refused until they count
again, the local fallback's slots and waiters handed to Redis when it answers, where a limit
lives in Redis, and a new limit on a Redis that has been up for a while starting at once."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest

from gym_concurrency import (
    COMPONENT_ATTRIBUTE,
    LIMIT_NAME_ATTRIBUTE,
    SharedLimit,
    observe_concurrency,
)
from gym_concurrency.names import ADMISSION_LEASE_LOST_INSTRUMENT, SCOPE_ATTRIBUTE
from tests.metrics_capture import MetricsCapture
from tests.shared.helpers import Limits, held_ids, leases, queued, settle, wait_for
from tests.shared.redis_server import RedisServer

LEASE = {"lease_seconds": 0.8, "redis_timeout": 0.2}


@pytest.fixture
async def on_own(own_redis: RedisServer, key: str) -> AsyncIterator[Limits]:
    """Limits on a Redis of this test's own, once it has been up for more than a lease (a
    younger one may have lost slots still held: its first admissions wait a lease)."""
    while int(own_redis.client().info("server")["uptime_in_seconds"]) < 1:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    made = Limits(own_redis.url, key)
    yield made
    await made.close()


async def test_a_new_limit_on_a_redis_up_for_a_while_admits_at_once(on_own: Limits) -> None:
    limit = on_own(1, **LEASE)
    started = time.monotonic()
    assert await limit.enqueue() == "admitted"
    assert time.monotonic() - started < 0.5  # no grace period: nothing can have been lost
    limit.release()


async def test_a_blocked_event_loop_keeps_its_leases(
    on_own: Limits, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "gym_concurrency.limits.shared")
    client = own_redis.client()
    limit = on_own(2, **LEASE)
    assert await limit.enqueue() == "admitted"
    before = client.zscore(limit.redis_keys["leases"], *held_ids(limit))
    time.sleep(4 * LEASE["lease_seconds"])  # noqa: ASYNC251 - the fault: the loop is blocked
    after = client.zscore(limit.redis_keys["leases"], *held_ids(limit))
    assert after is not None  # renewed all along, by the heartbeat's thread
    assert before is not None
    assert after > before + 2 * LEASE["lease_seconds"] * 1000
    await settle(limit)
    assert leases(client, limit) == held_ids(limit)
    assert "re-registered" not in caplog.text  # Redis never lost it
    assert limit.admission_lease_lost == 0
    limit.release()


async def test_leases_not_renewed_within_the_lease_are_counted_lost_and_admission_stops(
    on_own: Limits,
    own_redis: RedisServer,
    caplog: pytest.LogCaptureFixture,
    metrics: MetricsCapture,
) -> None:
    caplog.set_level(logging.WARNING, "gym_concurrency.limits.shared")
    observe_concurrency(metrics.provider)
    client = own_redis.client()
    lost: list[tuple[SharedLimit, tuple[str, ...]]] = []
    limit = on_own(
        2,
        component="faults",
        limit_name="lost",
        on_lease_lost=lambda limit, ids: lost.append((limit, ids)),
        **LEASE,
    )
    assert await limit.enqueue() == "admitted"
    held = held_ids(limit)
    own_redis.pause()
    try:
        await wait_for(lambda: bool(lost), 3 * LEASE["lease_seconds"], "the leases found lost")
        assert lost == [(limit, tuple(held))]
        assert limit.admission_lease_lost == 1
        assert not limit.connected
        assert await limit.enqueue() == "unavailable"  # nothing new while they may be lost
        ours = frozenset(
            {
                COMPONENT_ATTRIBUTE: "faults",
                LIMIT_NAME_ATTRIBUTE: "lost",
                SCOPE_ATTRIBUTE: "global",
            }.items()
        )
        assert metrics.values(ADMISSION_LEASE_LOST_INSTRUMENT)[ours] == 1
        line = next(r.getMessage() for r in caplog.records if "could not renew" in r.getMessage())
        assert "faults/lost" in line  # the limit
        assert next(iter(held)) in line  # and its holders
    finally:
        own_redis.resume()
    await wait_for(lambda: limit.connected, 2.0, "Redis counting the holders again")
    assert leases(client, limit) == held  # re-registered before anything else
    assert "counted again" in caplog.text
    assert await limit.enqueue() == "admitted"
    assert limit.admission_lease_lost == 1  # each lost lease counted once
    limit.release()
    limit.release()


async def test_a_failing_lease_lost_hook_never_reaches_the_limit(
    on_own: Limits, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    def hook(limit: SharedLimit, ids: tuple[str, ...]) -> None:
        raise RuntimeError("a hook that fails")

    limit = on_own(1, on_lease_lost=hook, **LEASE)
    assert await limit.enqueue() == "admitted"
    own_redis.pause()
    try:
        await wait_for(lambda: limit.admission_lease_lost == 1, 3.0, "the lease found lost")
        await asyncio.sleep(0.05)
    finally:
        own_redis.resume()
    assert "on_lease_lost failed" in caplog.text
    await wait_for(lambda: limit.connected, 2.0, "Redis again")
    limit.release()


async def test_an_admission_redis_runs_after_its_call_timed_out_gets_its_slot_back(
    on_own: Limits, own_redis: RedisServer
) -> None:
    # A Redis that resumes after a pause runs what it had received in any order, so the
    # admission whose call timed out may run after the renewal that removed it: every
    # renewal for a lease after that one removes it again.
    client = own_redis.client()
    limit = on_own(2, **LEASE)
    assert await limit.enqueue() == "admitted"
    late = f"{limit.redis_keys['leases']}-late:1"  # an id this process gave up on
    limit._sync.drop_later([late])
    await limit._sync.sync()  # removed (nothing there yet)
    await limit._store.acquire(None, [late])  # then the timed-out call runs: a lease
    assert late in leases(client, limit)
    await limit._sync.sync()
    assert leases(client, limit) == held_ids(limit)
    assert limit.available == 1
    await asyncio.sleep(LEASE["lease_seconds"] * 1.2)
    await limit._sync.sync()
    assert late not in limit._sync.dropping  # kept for a lease, no longer
    limit.release()


async def test_the_fallback_s_slots_become_leases_and_its_waiters_queue_in_redis(
    on_own: Limits, own_redis: RedisServer
) -> None:
    client = own_redis.client()
    limit = on_own(1, redis_unavailable="local", local_max_concurrent=1, **LEASE)
    other = on_own(1, **LEASE)
    assert await limit.connect()
    own_redis.pause()
    try:
        assert await limit.enqueue() == "admitted"  # through the fallback
        waiting = limit.enqueue()  # waits in the fallback
        await asyncio.sleep(0.1)
        assert not waiting.done()
    finally:
        own_redis.resume()
    await wait_for(lambda: limit.connected, 2.0, "Redis again")
    await settle(limit, other)
    assert leases(client, limit) == held_ids(limit)  # the fallback's slot counts in Redis
    assert len(held_ids(limit)) == 1
    blocked = other.enqueue()  # Redis is full: the fallback's slot is a lease
    await settle(limit, other)
    assert not blocked.done()
    assert len(queued(client, limit)) == 2  # the fallback's waiter queues in Redis now
    limit.release()  # the fallback's slot: Redis hands it to the oldest waiter (FIFO)
    assert await asyncio.wait_for(waiting, 2.0) == "admitted"
    assert not blocked.done()
    limit.release()
    assert await asyncio.wait_for(blocked, 2.0) == "admitted"
    other.release()
    await settle(limit, other)
    assert leases(client, limit) == set()


def test_a_limit_lives_under_its_component_server_and_name() -> None:
    url = "redis://127.0.0.1:1/0"
    limit = SharedLimit(2, redis_url=url, component="team_a", limit_name="judge")
    assert limit.key == "team_a/judge"
    assert limit.redis_keys["leases"] == "gym_concurrency:{team_a/judge}:leases"
    served = SharedLimit(
        2, redis_url=url, component="team_a", server="west", limit_name="judge", key_prefix="p"
    )
    assert served.redis_keys["limit"] == "p:{team_a/west/judge}:limit"
    assert SharedLimit(2, redis_url=url, limit_name="judge", key="shared").key == "shared"
    with pytest.raises(ValueError, match="component"):
        SharedLimit(2, redis_url=url, component="a{b}", limit_name="judge")


def test_a_redis_url_is_shown_without_its_password() -> None:
    with pytest.raises(ValueError, match=r"http://user:\*\*\*@host") as caught:
        SharedLimit(2, redis_url="http://user:hunter2@host:6379", limit_name="x")
    assert "hunter2" not in str(caught.value)
    with pytest.raises(ValueError, match="service name"):
        SharedLimit(2, redis_url="redis+sentinel://127.0.0.1:26379", limit_name="x")


async def test_closing_leaves_only_the_limit_s_configuration(
    on_own: Limits, own_redis: RedisServer
) -> None:
    client = own_redis.client()
    a, b = on_own(2, **LEASE), on_own(2, **LEASE)
    assert await a.enqueue() == "admitted"
    assert await b.enqueue() == "admitted"
    waiting = b.enqueue()  # queued, then handed a's slot
    await settle(a, b)
    a.release()
    assert await asyncio.wait_for(waiting, 3) == "admitted"
    b.enqueue()  # still queued when b closes
    await settle(a, b)
    await a.close()
    await b.close()
    left = {k.rsplit(":", 1)[-1] for k in client.keys("*")}
    assert left == {"limit", "configured"}, client.keys("*")
