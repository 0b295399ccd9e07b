"""The SharedLimit contract against a real redis-server, with several limits in one test
standing for several processes (each its own id, heartbeat and mailbox): FIFO by ticket, the
global limit and queue, timeout / cancel / shed each counted once where it happened, leases
released exactly, resize, lost notifications, dead holders, the observer and close()."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import time
from types import FrameType
from typing import Any

import pytest
import redis

from gym_concurrency import (
    ADMISSION_SHED_INSTRUMENT,
    COMPONENT_ATTRIBUTE,
    CONCURRENCY_ACTIVE_INSTRUMENT,
    CONCURRENCY_AVAILABLE_INSTRUMENT,
    CONCURRENCY_LIMIT_INSTRUMENT,
    LIMIT_NAME_ATTRIBUTE,
    QUEUE_DEPTH_INSTRUMENT,
    LimitConfigurationError,
    MeteredSemaphore,
    QueueFullError,
    SharedLimit,
    observe_concurrency,
)
from gym_concurrency.limits import registered_limits
from gym_concurrency.names import (
    ADMISSION_LEASE_LOST_INSTRUMENT,
    ADMISSION_UNAVAILABLE_INSTRUMENT,
    SCOPE_ATTRIBUTE,
)
from tests.metrics_capture import MetricsCapture
from tests.shared.helpers import Limits, held_ids, leases, queued, settle, wait_for
from tests.shared.redis_server import RedisServer

URL = "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"value": -1}, ValueError, "value"),
        ({"value": "2"}, TypeError, "value"),
        ({"value": True}, TypeError, "value"),
        ({"timeout": 0}, ValueError, "timeout"),
        ({"timeout": float("inf")}, ValueError, "timeout"),
        ({"max_queue": -1}, ValueError, "max_queue"),
        ({"lease_seconds": 0}, ValueError, "lease_seconds"),
        ({"lease_seconds": 1, "redis_timeout": 1}, ValueError, "redis_timeout"),
        ({"redis_timeout": "1"}, TypeError, "redis_timeout"),
        ({"redis_unavailable": "queue"}, ValueError, "redis_unavailable"),
        ({"redis_unavailable": "local"}, ValueError, "local_max_concurrent"),
        (
            {"redis_unavailable": "local", "local_max_concurrent": -1},
            ValueError,
            "local_max_concurrent",
        ),
        ({"local_max_concurrent": 2}, ValueError, "local_max_concurrent"),
        ({"redis_url": "http://127.0.0.1:6379"}, ValueError, "redis_url"),
        ({"key": "a{b}"}, ValueError, "key"),
        ({"limit_name": ""}, ValueError, "limit_name"),
        ({"limit_name": None}, ValueError, "limit_name or key"),
        ({"key_prefix": ""}, ValueError, "key_prefix"),
        ({"max_connections": 0}, ValueError, "max_connections"),
    ],
)
def test_bad_arguments_fail_naming_the_argument(
    options: dict[str, Any], error: type[Exception], named: str
) -> None:
    arguments: dict[str, Any] = {"value": 2, "redis_url": URL, "limit_name": "episodes"}
    arguments.update(options)
    value = arguments.pop("value")
    with pytest.raises(error, match=named):
        SharedLimit(value, **arguments)


def test_resize_to_a_bad_size_fails_naming_it() -> None:
    limit = SharedLimit(2, redis_url=URL, key="never-connected")
    with pytest.raises(ValueError, match="limit"):
        limit.resize(-1)
    assert limit.limit == 2


def test_the_core_imports_no_redis_until_a_shared_limit_connects() -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        import gym_concurrency
        from gym_concurrency import SharedLimit
        limit = SharedLimit(2, redis_url="redis://127.0.0.1:1/0", key="k", redis_timeout=0.2)
        before = sorted(m for m in sys.modules if m.split(".")[0] == "redis")
        async def main():
            result = await limit.enqueue()  # nothing listens on port 1: unavailable
            await limit.close()
            return result
        result = asyncio.run(main())
        after = "redis.asyncio" in sys.modules
        print(",".join(before) or "nothing", result, after, limit.admission_unavailable)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["nothing", "unavailable", "True", "1"]


async def test_an_uncontended_admission_holds_one_lease_and_release_removes_it(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    limit = limits(3)
    assert limit.try_acquire() is False  # every shared admission goes through enqueue()
    assert limit.scope == "global"
    assert await limit.enqueue() == "admitted"
    assert (limit.limit, limit.active, limit.available, limit.queue_depth) == (3, 1, 2, 0)
    assert leases(client, limit) == held_ids(limit)
    assert len(held_ids(limit)) == 1
    limit.release()
    assert limit.active == 0
    await settle(limit)
    assert leases(client, limit) == set()
    assert limit.available == 3
    with pytest.raises(ValueError, match="no slot held"):
        limit.release()


async def test_never_more_than_the_limit_and_fifo_across_processes(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    procs = [limits(2), limits(2), limits(2)]
    for proc in procs:
        assert await proc.connect()  # a first connection takes a while: not an arrival
    assert await procs[0].enqueue() == "admitted"
    assert await procs[1].enqueue() == "admitted"
    order: list[int] = []
    futures = []
    for n in range(9):  # arrivals alternate between processes, each clearly after the last
        future = procs[n % 3].enqueue()
        future.add_done_callback(lambda f, n=n: order.append(n))
        futures.append((procs[n % 3], future))
        await asyncio.sleep(0.005)
    await settle(*procs)
    assert len(leases(client, procs[0])) == 2  # the limit is full; nobody overtook
    assert len(queued(client, procs[0])) == 9
    assert sum(p.queue_depth for p in procs) == 9
    releases = [procs[0], procs[1]] + [p for p, _ in futures]
    for holder in releases[:9]:
        holder.release()
        await settle(*procs)
        assert len(leases(client, holder)) <= 2
        assert leases(client, holder) == held_ids(*procs)
    assert order == list(range(9))
    for holder in releases[9:]:
        holder.release()
    await settle(*procs)
    assert leases(client, procs[0]) == set()
    assert queued(client, procs[0]) == []


async def test_max_queue_is_the_global_queue_and_shed_counts_where_it_happened(
    limits: Limits,
) -> None:
    a, b = limits(1, max_queue=2), limits(1, max_queue=2)
    assert await a.enqueue() == "admitted"
    first, second = a.enqueue(), b.enqueue()
    await settle(a, b)
    assert await b.enqueue() == "shed"  # two already wait, one in each process
    assert (a.admission_shed, b.admission_shed) == (0, 1)
    with pytest.raises(QueueFullError):
        await a.acquire()
    assert (a.admission_shed, b.admission_shed) == (1, 1)
    a.release()
    assert await first == "admitted"
    a.release()
    assert await second == "admitted"
    b.release()


async def test_max_queue_zero_never_waits(limits: Limits) -> None:
    a, b = limits(1, max_queue=0), limits(1, max_queue=0)
    assert await a.enqueue() == "admitted"
    assert await b.enqueue() == "shed"
    a.release()
    await settle(a, b)
    assert await b.enqueue() == "admitted"
    b.release()


async def test_a_timeout_counts_once_in_its_own_process_and_holds_nothing(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    holder, waiting = limits(1), limits(1, timeout=0.2)
    assert await holder.enqueue() == "admitted"
    started = time.monotonic()
    assert await waiting.enqueue() == "timeout"
    assert 0.18 <= time.monotonic() - started < 1.0
    with pytest.raises(TimeoutError):
        await waiting.acquire()
    await settle(holder, waiting)
    assert (waiting.admission_timeouts, holder.admission_timeouts) == (2, 0)
    assert waiting.admission_cancelled == 0
    assert queued(client, holder) == []  # the timed-out waiters left the global queue
    later = holder.enqueue()
    holder.release()
    assert await later == "admitted"
    holder.release()
    await settle(holder, waiting)
    assert leases(client, holder) == set()


async def test_leaving_counts_once_and_a_slot_granted_at_that_moment_passes_on(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    holder, a, b = limits(1), limits(1), limits(1)
    assert await holder.enqueue() == "admitted"
    left, behind = a.enqueue(), b.enqueue()
    await settle(holder, a, b)
    holder.release()  # Redis hands the slot to `left` ...
    a.leave(left)  # ... in the same moment `left` gives up: the slot passes on
    assert left.cancelled()
    assert await behind == "admitted"
    await settle(holder, a, b)
    assert leases(client, a) == held_ids(b)
    assert (a.admission_cancelled, b.admission_cancelled, holder.admission_cancelled) == (1, 0, 0)

    # A waiter whose future already says "admitted" leaves: counted, and its slot passes on.
    admitted_then_left, last = a.enqueue(), b.enqueue()
    await settle(a, b)
    b.release()
    assert await admitted_then_left == "admitted"
    a.leave(admitted_then_left)
    assert a.admission_cancelled == 2
    assert a.active == 0
    assert await last == "admitted"
    b.release()
    await settle(a, b)
    assert leases(client, a) == set()


async def test_a_task_cancelled_while_acquiring_counts_once_and_leaves_the_queue(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    holder, waiting = limits(1), limits(1)
    assert await holder.enqueue() == "admitted"
    task = asyncio.create_task(waiting.acquire())
    await settle(holder, waiting)
    assert len(queued(client, holder)) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle(holder, waiting)
    assert waiting.admission_cancelled == 1
    assert waiting.queue_depth == 0
    assert queued(client, holder) == []
    holder.release()
    await settle(holder, waiting)
    assert leases(client, holder) == set()


async def test_release_removes_exactly_its_own_lease(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    a, b = limits(3), limits(3)
    assert await a.enqueue() == "admitted"
    assert await b.enqueue() == "admitted"
    assert await b.enqueue() == "admitted"
    mine, theirs = held_ids(a), held_ids(b)
    a.release()
    await settle(a, b)
    assert leases(client, a) == theirs
    assert not mine & leases(client, a)
    with pytest.raises(ValueError, match="no slot held"):
        a.release()  # another process's slots are not this one's to give back
    b.release()
    b.release()


async def test_resize_is_global_grows_fifo_at_once_and_shrinking_revokes_nothing(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    a, b = limits(1), limits(1)
    assert await a.enqueue() == "admitted"
    order: list[str] = []
    first, second, third = b.enqueue(), a.enqueue(), b.enqueue()
    for name, future in (("first", first), ("second", second), ("third", third)):
        future.add_done_callback(lambda f, name=name: order.append(name))
    await settle(a, b)
    a.resize(3)  # two new slots: the two oldest waiters, at once
    await wait_for(lambda: first.done() and second.done(), 1.0, "the grown slots handed out")
    assert order == ["first", "second"]
    assert not third.done()
    assert client.get(a.redis_keys["limit"]) == "3"
    # Every process sees it at its next answer from Redis, at the latest its heartbeat.
    await wait_for(lambda: b.limit == 3, b.lease_seconds / 3 + 0.5, "b seeing the new size")
    a.resize(1)  # three held: none revoked, none free
    await settle(a, b)
    assert a.active + b.active == 3
    assert a.available == 0
    assert len(leases(client, a)) == 3
    b.release()
    a.release()
    await settle(a, b)
    assert not third.done()  # still 1 held of 1
    a.release()
    assert await third == "admitted"
    b.release()
    a.resize(0)  # pauses admission; waiters keep waiting
    await settle(a)  # (a resize is applied when Redis answers: before b asks, here)
    paused = b.enqueue()
    await settle(a, b)
    assert not paused.done()
    b.resize(1)
    assert await paused == "admitted"
    b.release()


async def test_a_configured_size_rolls_out_but_a_restart_keeps_a_resize(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    a = limits(4)
    assert await a.connect()
    a.resize(6)
    await settle(a)
    again = limits(4)  # a process restarts with the same configuration
    assert await again.connect()
    assert again.limit == 6
    assert client.get(a.redis_keys["limit"]) == "6"
    disagreeing = limits(8)  # another size while processes of this one live: an error
    with pytest.raises(LimitConfigurationError, match=r"size 8.*size 6 \(configured 4\)"):
        await disagreeing.connect()
    assert client.get(a.redis_keys["limit"]) == "6"
    await a.close()
    await again.close()
    changed = limits(8)  # a new configuration rolls out once the old one's processes stop
    assert await changed.connect()
    assert changed.limit == 8
    assert client.get(a.redis_keys["limit"]) == "8"


async def test_a_lost_notification_delays_a_waiter_at_most_about_a_second(
    limits: Limits, redis_server: RedisServer
) -> None:
    holder, waiting = limits(1, lease_seconds=9), limits(1, lease_seconds=9)
    assert await holder.enqueue() == "admitted"
    future = waiting.enqueue()
    await settle(holder, waiting)
    (mailbox_task,) = waiting._life.tasks  # (the heartbeat runs on a thread of its own)
    mailbox_task.cancel()  # its notifications now go nowhere: a thief takes them
    thief = redis_server.client()
    box = waiting.mailbox_prefix + waiting._store.proc
    holder.release()
    started = time.monotonic()
    # The notification is lost: the thief takes it, or the cancelled pop's connection did.
    thief_pop = asyncio.create_task(asyncio.to_thread(thief.blpop, [box], 1))
    assert await asyncio.wait_for(future, 2.0) == "admitted"  # the re-check found it
    assert time.monotonic() - started <= 1.15
    await thief_pop
    waiting.release()


async def test_a_dead_process_loses_its_leases_and_waiters_within_lease_seconds(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    dead, alive = limits(2), limits(2)
    assert await dead.enqueue() == "admitted"
    assert await dead.enqueue() == "admitted"
    dead.enqueue()  # queued ahead of the live process's waiters
    mine = [alive.enqueue(), alive.enqueue()]
    await settle(dead, alive)
    limits.kill(dead)
    started = time.monotonic()
    results = await asyncio.wait_for(asyncio.gather(*mine), 5)
    took = time.monotonic() - started
    assert results == ["admitted", "admitted"]
    assert took <= alive.lease_seconds + 0.1, took  # handed on as the leases expire
    await settle(alive)
    assert leases(client, alive) == held_ids(alive)
    assert queued(client, alive) == []
    assert alive.admission_cancelled == alive.admission_timeouts == 0
    alive.release()
    alive.release()


class RedisCalls:
    """Counts calls into the redis package while active (a sys.setprofile hook)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __enter__(self) -> RedisCalls:
        gc.collect()  # no finalizer of an earlier test's connections runs while probing
        gc.disable()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        gc.enable()

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_globals.get("__name__", "").startswith("redis"):
            self.calls.append(f"{frame.f_globals['__name__']}.{frame.f_code.co_name}")


async def test_the_observer_reports_a_global_limit_with_its_scope_and_no_redis_call(
    metrics: MetricsCapture, redis_server: RedisServer, key: str
) -> None:
    observe_concurrency(metrics.provider)
    shared = SharedLimit(
        4,
        redis_url=redis_server.url,
        component="obs_shared",
        limit_name=key,
        key=key,  # shared with `other` (by default the key is component/limit_name)
        max_queue=5,
        lease_seconds=6.0,  # generous: a loaded CI machine must not time a script call out
        redis_timeout=3.0,
    )
    other = SharedLimit(
        4, redis_url=redis_server.url, key=key, lease_seconds=6.0, redis_timeout=3.0
    )
    local = MeteredSemaphore(2, component="obs_shared", limit_name="local", max_queue=1)
    try:
        assert shared in registered_limits()
        assert local in registered_limits()
        assert other not in registered_limits()  # no component: not reported
        assert await shared.enqueue() == "admitted"
        assert await other.enqueue() == "admitted"
        assert await other.enqueue() == "admitted"
        await settle(shared, other)
        await shared._sync.sync()  # this process's view of the global state, refreshed
        global_attrs = frozenset(
            {
                COMPONENT_ATTRIBUTE: "obs_shared",
                LIMIT_NAME_ATTRIBUTE: key,
                SCOPE_ATTRIBUTE: "global",
            }.items()
        )
        local_attrs = frozenset(
            {COMPONENT_ATTRIBUTE: "obs_shared", LIMIT_NAME_ATTRIBUTE: "local"}.items()
        )
        with RedisCalls() as probe:
            found = {
                name: metrics.values(name)
                for name in (
                    CONCURRENCY_LIMIT_INSTRUMENT,
                    CONCURRENCY_ACTIVE_INSTRUMENT,
                    CONCURRENCY_AVAILABLE_INSTRUMENT,
                    QUEUE_DEPTH_INSTRUMENT,
                    ADMISSION_SHED_INSTRUMENT,
                    ADMISSION_UNAVAILABLE_INSTRUMENT,
                    ADMISSION_LEASE_LOST_INSTRUMENT,
                )
            }
        assert probe.calls == []  # plain numbers kept in process
        assert found[CONCURRENCY_LIMIT_INSTRUMENT][global_attrs] == 4
        assert found[CONCURRENCY_ACTIVE_INSTRUMENT][global_attrs] == 1  # this process's own
        assert found[CONCURRENCY_AVAILABLE_INSTRUMENT][global_attrs] == 1  # global free
        assert found[QUEUE_DEPTH_INSTRUMENT][global_attrs] == 0
        assert found[ADMISSION_SHED_INSTRUMENT][global_attrs] == 0
        # Global limits only (an earlier test's global limit, still alive, may add its own).
        for instrument in (ADMISSION_UNAVAILABLE_INSTRUMENT, ADMISSION_LEASE_LOST_INSTRUMENT):
            assert found[instrument][global_attrs] == 0
            assert local_attrs not in found[instrument]
        units = {
            # Only counters carry is_monotonic; a gauge (a budget's, an earlier test's) has none.
            metric.name: (metric.unit, getattr(metric.data, "is_monotonic", None))
            for resource in metrics.reader.get_metrics_data().resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }
        assert units[ADMISSION_UNAVAILABLE_INSTRUMENT] == ("{request}", True)  # DESIGN's table
        assert units[ADMISSION_LEASE_LOST_INSTRUMENT] == ("{slot}", True)  # docs/metrics.md
        assert found[CONCURRENCY_LIMIT_INSTRUMENT][local_attrs] == 2  # no scope attribute
        shared.release()
        other.release()
        other.release()
    finally:
        await shared.close()
        await other.close()


async def test_close_ends_waiters_unavailable_and_removes_its_leases_and_waiters(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    closing, other = limits(1), limits(1)
    assert await closing.enqueue() == "admitted"
    waiting = closing.enqueue()
    behind = other.enqueue()
    await settle(closing, other)
    await closing.close()
    assert await waiting == "unavailable"
    assert closing.admission_unavailable == 1
    assert await behind == "admitted"  # its slot passed on at once, not after the lease
    assert leases(client, other) == held_ids(other)
    assert closing._life.tasks == []
    closing.release()  # the holder finishing after close is fine
    assert await closing.enqueue() == "unavailable"
    assert not await closing.connect()
    other.release()
    never_used = limits(1)
    await never_used.close()
    assert await never_used.enqueue() == "unavailable"
    assert never_used._store._client is None  # closed before it ever connected: it never does


async def test_acquire_and_async_with_hold_a_slot_like_a_semaphore(
    limits: Limits, redis_server: RedisServer
) -> None:
    client = redis_server.client()
    a, b = limits(1), limits(1)
    async with a:
        assert a.active == 1
        assert a.locked()
        assert len(leases(client, a)) == 1
    await settle(a)
    assert await b.acquire() is True
    b.release()
    await settle(a, b)
    assert leases(client, a) == set()


async def test_a_redis_client_error_is_unavailable_not_a_crash(
    limits: Limits, caplog: pytest.LogCaptureFixture
) -> None:
    limit = limits(1)
    assert await limit.connect()
    broken = [limit.redis_keys["leases"], limit.redis_keys["queue"]]  # admitted or queued
    for key in broken:
        redis.Redis.from_url(limits.url).set(key, "not a zset")
    try:
        assert await limit.enqueue() == "unavailable"  # WRONGTYPE from the script
        assert limit.admission_unavailable == 1
        # Said by the admission's call, or by the heartbeat's (its own thread) if it found
        # the error first.
        await wait_for(
            lambda: "acquire failed" in caplog.text or "heartbeat failed" in caplog.text,
            2.0,
            "the error logged",
        )
    finally:
        redis.Redis.from_url(limits.url).delete(*broken)
    await wait_for(lambda: limit.connected, 2.0, "the limit reaching Redis again")
    assert await limit.enqueue() == "admitted"
    limit.release()
