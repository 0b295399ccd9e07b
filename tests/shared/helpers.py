"""Helpers of the shared-limit tests: making limits that stand for processes, reading what
Redis holds, waiting for a condition."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import redis

from gym_concurrency import SharedLimit
from tests.shared.redis_server import RedisServer

# Short leases so that a dead holder's slots pass on quickly in a test. The Redis timeout is
# not short: a script call took more than 0.3 s on a loaded CI machine, now and then (a test
# that needs a short one, to see an outage soon, says so).
FAST: dict[str, Any] = {"lease_seconds": 1.5, "redis_timeout": 0.7}


class Limits:
    """Makes SharedLimits (each stands for one process: its own id, heartbeat and mailbox)
    and closes them all at the end of the test."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key
        self.made: list[SharedLimit] = []
        self.dead_clients: list[Any] = []

    def __call__(self, value: int = 1, **options: Any) -> SharedLimit:
        settings = {**FAST, "key": self.key, **options}
        limit = SharedLimit(value, redis_url=self.url, **settings)
        self.made.append(limit)
        return limit

    async def close(self) -> None:
        for limit in self.made:
            await limit.close()
        for client in self.dead_clients:
            await client.aclose()

    def kill(self, limit: SharedLimit) -> None:
        """Make `limit` stand for a process that died: its heartbeat and mailbox stop, and it
        never talks to Redis again (its leases and waiters stay there until they expire)."""
        limit._heartbeat.stop()  # its thread: no renewal after the current one
        for task in limit._life.tasks:
            task.cancel()
        limit._life.tasks = []
        self.dead_clients += [limit._store._client, limit._store._mailbox_client]
        limit._store._client = limit._store._mailbox_client = None  # nothing more is sent
        limit._state.close()  # (not limit.close(), which would tell Redis)


def leases(client: redis.Redis, limit: SharedLimit) -> set[str]:
    """The lease ids Redis holds for `limit`'s key now."""
    return set(client.zrange(limit.redis_keys["leases"], 0, -1))


def queued(client: redis.Redis, limit: SharedLimit) -> list[str]:
    """The waiter ids Redis queues for `limit`'s key now, oldest first."""
    return list(client.zrange(limit.redis_keys["queue"], 0, -1))


def kept(client: redis.Redis, limit: SharedLimit) -> dict[str, Any]:
    """The budgets' counts Redis keeps in the limit's state."""
    return dict(json.loads(client.hget(limit.redis_keys["state"], "b") or "{}"))


async def until_aged(server: RedisServer, seconds: int = 3) -> None:
    """Wait until `server` has been up for longer than the grace a young Redis gives (it may
    have lost a budget: a state found missing then counts the whole minute as spent)."""
    while int(server.client().info("server")["uptime_in_seconds"]) < seconds:  # noqa: ASYNC110
        await asyncio.sleep(0.1)


def held_ids(*limits: SharedLimit) -> set[str]:
    """The lease ids the given limits (processes) believe they hold."""
    return {lease for limit in limits for lease in limit._state.held}


async def settle(*limits: SharedLimit, within: float = 3.0) -> None:
    """Wait until no Redis call of these limits is in flight (notifications delivered)."""
    deadline = time.monotonic() + within
    while any(limit._sync.background for limit in limits):
        assert time.monotonic() < deadline, "Redis calls still in flight"
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.02)


async def wait_for(condition: Callable[[], bool], within: float, what: str = "condition") -> float:
    """Wait until `condition()` holds; the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > within:
            raise AssertionError(f"{what} not reached within {within} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - started
