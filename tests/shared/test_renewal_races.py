"""A renewal in flight on the heartbeat thread and the event loop acting at the same moment,
on a real redis-server: each interleaving is forced by holding the heartbeat thread at the
step in question while the loop acts."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from gym_concurrency import SharedLimit
from tests.shared.helpers import Limits, held_ids, leases, settle, wait_for
from tests.shared.redis_server import RedisServer

OUTAGE = {"lease_seconds": 4.0, "redis_timeout": 0.3}
LONG = {"lease_seconds": 8.0, "redis_timeout": 0.3}  # a lease left behind outlives the test


async def _warm(on_own: Limits) -> None:
    """A Redis up for less than a lease grants nothing at first (its grace period)."""
    warm = on_own(4, **OUTAGE)
    assert await warm.enqueue() == "admitted"
    warm.release()


async def test_a_fallback_slot_released_as_its_renewal_ends_leaves_nothing_in_redis(
    on_own: Limits, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal that registers a local fallback's slot as a lease (Redis is back) ends
    just as the slot is released: the release removes the lease in Redis, never leaves it
    held there until it expires."""
    client = own_redis.client()
    await _warm(on_own)
    limit = on_own(4, redis_unavailable="local", local_max_concurrent=1, **LONG)
    own_redis.pause()
    try:
        assert await limit.enqueue() == "admitted"  # through the fallback: Redis is away
    finally:
        own_redis.resume()
    (fallen,) = held_ids(limit)
    sync = limit._sync
    in_gap, go_on = threading.Event(), threading.Event()
    settled = sync._settle

    def settle_then_hold(drops: Any, *args: Any, **kwargs: Any) -> list[str]:
        # (a renewal that worked and named the slot: the full one that registers it)
        registers = drops is not None and fallen in sync._inflight and fallen in sync.unregistered
        deferred = settled(drops, *args, **kwargs)
        if registers:  # the renewal that made it a lease worked: the loop acts now
            in_gap.set()
            go_on.wait(5)
        return deferred

    monkeypatch.setattr(sync, "_settle", settle_then_hold)
    assert await asyncio.to_thread(in_gap.wait, 10), "no renewal registered the slot"
    limit.release()
    go_on.set()
    await settle(limit)
    # Removed by the release's call, or (that call failing) by the next renewals: well
    # within the lease it would otherwise keep its slot for.
    await wait_for(lambda: leases(client, limit) == set(), 5.0, "the lease removed")
    assert limit.active == 0


async def test_a_full_renewal_asked_for_during_a_renewal_in_flight_still_comes(
    limits: Limits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant notification the loop cannot trust while a renewal is in flight asks for
    another full renewal (`renew_soon`); the renewal in flight must not clear that ask."""
    limit: SharedLimit = limits(2, lease_seconds=30.0)
    assert await limit.enqueue() == "admitted"
    await settle(limit)
    sync = limit._sync
    store = limit._store
    sent = store.sync_blocking

    def asked_meanwhile(*args: Any) -> Any:
        sync.renew_soon = True  # what notified() or a broken mailbox does on the loop
        return sent(*args)

    monkeypatch.setattr(store, "sync_blocking", asked_meanwhile)
    await sync.sync()
    assert sync.renew_soon  # the heartbeat renews in full again at once
    monkeypatch.setattr(store, "sync_blocking", sent)
    await wait_for(lambda: not sync.renew_soon, 5.0, "the full renewal it asked for")
    limit.release()
