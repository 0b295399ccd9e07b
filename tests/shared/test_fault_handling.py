"""How one SharedLimit behaves under the faults of tests/shared/faults, step by step on a real
redis-server: leases renewed while the event loop is blocked, leases it could not renew
counted lost (the metric, the log line, the hook) with admissions refused until they count
again, the local fallback's slots and waiters handed to Redis when it answers, where a limit
lives in Redis, and a new limit on a Redis that has been up for a while starting at once."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis

from gym_concurrency import (
    COMPONENT_ATTRIBUTE,
    LIMIT_NAME_ATTRIBUTE,
    LimitConfigurationError,
    SharedLimit,
    observe_concurrency,
)
from gym_concurrency.names import ADMISSION_LEASE_LOST_INSTRUMENT, SCOPE_ATTRIBUTE
from tests.metrics_capture import MetricsCapture
from tests.shared.helpers import Limits, held_ids, leases, queued, settle, wait_for
from tests.shared.redis_server import RedisServer, free_port

LEASE = {"lease_seconds": 0.8, "redis_timeout": 0.2}
SLOW = {"lease_seconds": 12.0, "redis_timeout": 0.5}  # a heartbeat every 4 s


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
    # (the renewal's thread clears the loss, then hands its log line to the loop)
    await wait_for(lambda: "counted again" in caplog.text, 2.0, "the holders logged as counted")
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
    await limit._store.acquire(None, [late], [])  # then the timed-out call runs: a lease
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
    assert left == {"limit", "configured", "state"}, client.keys("*")


async def test_a_lease_granted_before_its_call_failed_is_never_dropped(
    on_own: Limits, own_redis: RedisServer
) -> None:
    # A blocked loop can handle a waiter's grant (the mailbox) before its acquire's timeout:
    # the failed call must not take the lease it already holds out of Redis.
    client = own_redis.client()
    limit = on_own(2, **LEASE)
    assert await limit.enqueue() == "admitted"
    (held,) = held_ids(limit)
    limit._sync.drop_later([held])  # what a failed acquire does with the ids it sent
    await limit._sync.sync()
    assert leases(client, limit) == {held}
    limit.release()


async def test_leases_are_counted_lost_when_the_heartbeat_could_not_run_for_a_lease(
    on_own: Limits, own_redis: RedisServer
) -> None:
    # The process (or its heartbeat thread: a C extension holding the GIL) stopped for
    # longer than a lease while Redis ran on: the renewal after it works, and still the
    # leases were lost in between, their slots free for others.
    client = own_redis.client()
    lost: list[tuple[str, ...]] = []
    limit = on_own(2, **LEASE, on_lease_lost=lambda _, ids: lost.append(ids))
    assert await limit.enqueue() == "admitted"
    with limit._heartbeat._beat_lock:  # the heartbeat thread cannot renew meanwhile
        await asyncio.sleep(LEASE["lease_seconds"] * 1.5)
    await wait_for(lambda: limit.admission_lease_lost == 1, 2.0, "the lost lease counted")
    assert lost == [tuple(held_ids(limit))]
    await wait_for(lambda: limit.connected, 2.0, "its holders counted again")
    assert leases(client, limit) == held_ids(limit)
    limit.release()


async def test_a_user_redis_s_acl_denies_a_script_command_fails_the_start(
    own_redis: RedisServer, key: str
) -> None:
    client = own_redis.client()
    client.acl_setuser(
        "limits",
        enabled=True,
        passwords=["+secret"],
        keys=["*"],
        channels=["*"],
        categories=["+@all"],
        commands=["-info"],
    )
    url = f"redis://limits:secret@127.0.0.1:{own_redis.port}/0"
    limit = SharedLimit(2, redis_url=url, key=key, **LEASE)
    with pytest.raises(LimitConfigurationError, match="ACL") as caught:
        await limit.connect()
    assert "secret" not in str(caught.value)
    assert f"127.0.0.1:{own_redis.port}" in str(caught.value)


async def test_a_size_conflict_found_after_the_start_ends_with_a_resize(
    on_own: Limits, own_redis: RedisServer
) -> None:
    running = on_own(5, **LEASE)
    assert await running.connect()
    late = on_own(2, **LEASE)
    own_redis.pause()
    try:
        assert await late.connect() is False  # Redis away: the conflict is not seen yet
    finally:
        own_redis.resume()
    await wait_for(lambda: late._store.misconfigured is not None, 3.0, "the conflict found")
    assert await late.enqueue() == "unavailable"
    late.resize(5)  # the size in force: accepted
    await wait_for(lambda: late.connected, 3.0, "admitting again")
    assert await asyncio.wait_for(late.enqueue(), 3) == "admitted"
    late.release()


def _program_says(program: str, *args: str, within: float = 60) -> str:
    """What `program` (a Python program of its own, given `args`) prints; it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=within,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


NEW_LOOP_PROGRAM = """
import asyncio, sys, threading
from gym_concurrency import SharedLimit

limit = SharedLimit(1, redis_url=sys.argv[1], key=sys.argv[2], lease_seconds=0.8,
                    redis_timeout=0.2)
name = limit._describe() + " heartbeat"

def heartbeats():
    return len([t for t in threading.enumerate() if t.name == name])

async def once():
    assert await limit.enqueue() == "admitted"
    limit.release()

async def on_a_new_loop():  # the old loop closed: the limit starts again here
    try:
        await once()
        for _ in range(300):
            if heartbeats() == 1:
                break
            await asyncio.sleep(0.01)
        print(heartbeats())
    finally:
        await limit.close()

asyncio.run(once())  # (never closed: asyncio.run's shutdown must still end its tasks)
asyncio.run(on_a_new_loop())
"""


def test_a_new_event_loop_ends_the_heartbeat_of_the_old_one(
    own_redis: RedisServer, key: str
) -> None:
    # A program of its own: two asyncio.run() calls, the limit started again on the second.
    # the first loop's heartbeat thread ended:
    assert _program_says(NEW_LOOP_PROGRAM, own_redis.url, key) == "1"


UNCLOSED_PROGRAM = """
import asyncio, sys
from gym_concurrency import SharedLimit

limit = SharedLimit(1, redis_url=sys.argv[1], key=sys.argv[2], lease_seconds=4.5,
                    redis_timeout=2.0)

async def once():
    assert await limit.enqueue() == "admitted"  # (after the young Redis's grace period)
    limit.release()

asyncio.run(once())  # never closed: asyncio.run's shutdown cancels the mailbox
print("exited")
"""


def test_asyncio_run_ends_with_a_limit_never_closed(own_redis: RedisServer, key: str) -> None:
    """A program whose limit is never closed still ends: asyncio.run cancels the mailbox's
    pop in flight, which redis-py 8 can swallow (the mailbox popped on, forever)."""
    assert _program_says(UNCLOSED_PROGRAM, own_redis.url, key) == "exited"


STUCK_OLD_HEARTBEAT_PROGRAM = """
import asyncio, os, signal, sys, time
from gym_concurrency import SharedLimit

url, key, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
lease = 4.5
limit = SharedLimit(1, redis_url=url, key=key, lease_seconds=lease, redis_timeout=2.0)
other = SharedLimit(1, redis_url=url, key=key, lease_seconds=lease, redis_timeout=2.0)

async def once():
    assert await limit.enqueue() == "admitted"
    limit.release()

async def on_a_new_loop():
    # Starts the limit on this loop while the old thread waits on the stopped Redis (given
    # up on after 2 s); then Redis answers, the old call returns, the old thread ends.
    held = limit.enqueue()
    os.kill(pid, signal.SIGCONT)
    try:
        assert await held == "admitted"
        await asyncio.sleep(2 * lease)  # renewed by the new thread, or expired
        print(await other.enqueue(deadline=1.0))  # the one slot is still held
        limit.release()
    finally:
        await other.close()
        await limit.close()

asyncio.run(once())  # (never closed)
os.kill(pid, signal.SIGSTOP)
time.sleep(1.6)  # the old heartbeat thread is in a renewal that waits on the stopped Redis
asyncio.run(on_a_new_loop())  # ends the old thread: it gives up waiting for it after 2 s
"""


def test_a_new_event_loop_renews_though_the_old_heartbeat_ends_later(
    own_redis: RedisServer, key: str
) -> None:
    """The limit starts again on a new event loop while the old loop's heartbeat thread is
    still in a call (Redis stopped): the new heartbeat renews with a client of its own after
    the old thread ends and closes its client. A held slot stays held, never expires."""
    assert own_redis.process is not None
    pid = str(own_redis.process.pid)
    try:
        said = _program_says(STUCK_OLD_HEARTBEAT_PROGRAM, own_redis.url, key, pid, within=90)
    finally:
        own_redis.resume()  # (if the program failed before it did)
    assert said == "deadline"  # (the slot still held: its own deadline, since 63add9c)


async def _just_after_a_heartbeat(client: redis.Redis, limit: SharedLimit) -> str:
    """The id of `limit`'s one lease, once its heartbeat has just renewed it."""
    (held,) = held_ids(limit)
    renewed = client.zscore(limit.redis_keys["leases"], held)
    await wait_for(
        lambda: client.zscore(limit.redis_keys["leases"], held) != renewed, 6.0, "a heartbeat"
    )
    return held


async def test_a_holder_renews_at_once_when_redis_restarts(
    own_redis: RedisServer, key: str
) -> None:
    # With a 12 s lease a heartbeat comes every 4 s; the first new connection after a
    # restart (the mailbox's) finds the state missing and asks for a renewal at once.
    client = own_redis.client()
    holder = SharedLimit(1, redis_url=own_redis.url, key=key, **SLOW)
    try:
        assert await holder.enqueue() == "admitted"
        held = await _just_after_a_heartbeat(client, holder)
        own_redis.restart()
        await wait_for(lambda: leases(client, holder) == {held}, 1.5, "the lease back")
        holder.release()
    finally:
        await holder.close()


async def test_a_process_joining_a_restarted_redis_waits_for_the_holders(
    own_redis: RedisServer, key: str
) -> None:
    # The newcomer restores the lost state first (so the holder's reconnection finds it
    # there): the young Redis's grace must outlast the holder's next heartbeat (4 s away).
    client = own_redis.client()
    holder = SharedLimit(1, redis_url=own_redis.url, key=key, **SLOW)
    joined = SharedLimit(1, redis_url=own_redis.url, key=key, **SLOW)
    try:
        assert await holder.enqueue() == "admitted"
        held = await _just_after_a_heartbeat(client, holder)
        own_redis.restart()
        waiting = joined.enqueue()
        await wait_for(lambda: leases(client, holder) == {held}, 5.0, "the lease back")
        await asyncio.sleep(0.5)
        assert not waiting.done()  # never two holders of a limit of 1
        holder.release()
        assert await asyncio.wait_for(waiting, 5) == "admitted"
        joined.release()
    finally:
        await joined.close()
        await holder.close()


async def test_scripts_flushed_or_connections_killed_cost_no_admission(
    limits: Limits, redis_server: RedisServer
) -> None:
    """The loop's script calls run on connections kept out of the pool (`_lane.py`): a
    script Redis forgot (SCRIPT FLUSH, as after a restart) is loaded again, and a connection
    Redis closed (CLIENT KILL) is replaced, each by the usual call, with nothing refused."""
    limit = limits(2)
    client = redis_server.client()
    assert await limit.enqueue() == "admitted"
    limit.release()
    client.script_flush()
    assert await limit.enqueue() == "admitted"  # NOSCRIPT: loaded, then run
    limit.release()
    await settle(limit)
    client.client_kill_filter(_type="normal", skipme=True)  # every client connection
    for _ in range(3):
        assert await limit.enqueue() == "admitted"
        limit.release()
        await settle(limit)
    assert (limit.admission_unavailable, limit.active, limit.global_active) == (0, 0, 0)
    assert leases(client, limit) == set()


async def test_a_call_cancelled_mid_reply_gives_its_connection_back(
    on_own: Limits, own_redis: RedisServer
) -> None:
    """A script call cut off by the Redis timeout (Redis stopped: SIGSTOP) leaves its kept
    connection mid-reply: it goes back to the pool closed, none is lost, and admissions work
    again once Redis does."""
    limit = on_own(2, **LEASE)
    assert await limit.enqueue() == "admitted"
    limit.release()
    await settle(limit)
    lane = limit._store._lane
    assert lane is not None
    own_redis.pause()
    try:
        assert await limit.enqueue() == "unavailable"  # its call timed out mid-reply
    finally:
        own_redis.resume()
    assert len(lane._broken) >= 1
    await wait_for(lambda: limit.connected, 5.0, "Redis answering again")
    for _ in range(3):
        assert await limit.enqueue() == "admitted"
        limit.release()
        await settle(limit)
    assert lane._broken == []  # given back to the pool, closed
    pool = limit._store._client.connection_pool
    assert len(pool._in_use_connections) <= len(lane._free) + 1, "a connection leaked"


async def test_a_client_error_that_is_no_redis_error_fails_the_call_and_strands_nothing(
    limits: Limits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py writing to a connection the peer reset can raise a plain AttributeError
    (python/cpython#136234): the call failed like any other. Its waiter ends
    "unavailable" at once (never waits forever), and admissions work again after."""
    limit = limits(2, **LEASE)
    assert await limit.enqueue() == "admitted"
    limit.release()
    await settle(limit)
    lane = limit._store._lane
    assert lane is not None
    usual_call = lane.call

    async def broken_once(name: str, args: list[object], *more: object) -> object:
        monkeypatch.setattr(lane, "call", usual_call)
        raise AttributeError("'NoneType' object has no attribute '_add_writer'")

    monkeypatch.setattr(lane, "call", broken_once)
    assert await asyncio.wait_for(limit.enqueue(), 5) == "unavailable"
    assert (limit.queue_depth, limit.active) == (0, 0)
    await wait_for(lambda: limit.connected, 5.0, "admissions again")
    assert await limit.enqueue() == "admitted"
    limit.release()


async def test_a_client_error_of_the_heartbeat_counts_as_redis_away(limits: Limits) -> None:
    """The heartbeat thread's own call failing with an error that is no Redis error (as
    redis-py's can on a reset connection) counts as Redis away, as any failed renewal does:
    nothing is admitted until a renewal works again, and the heartbeat goes on."""
    limit = limits(2, lease_seconds=30.0, redis_timeout=0.5)  # (its own beats 10 s apart)
    assert await limit.enqueue() == "admitted"
    await settle(limit)
    scripts = limit._store._blocking_scripts
    renewal = scripts["sync"]

    def broken_once(*args: object, **kwargs: object) -> object:
        scripts["sync"] = renewal
        raise AttributeError("'NoneType' object has no attribute '_add_writer'")

    scripts["sync"] = broken_once
    await limit._sync.sync()
    assert not limit.connected
    assert await limit.enqueue() == "unavailable"
    await wait_for(lambda: limit.connected, 5.0, "a renewal that works")
    limit.release()


async def test_a_registration_cancelled_in_flight_ends_its_waiters(
    on_own: Limits, own_redis: RedisServer
) -> None:
    """A registration cancelled while its call waits (asyncio.run cancels what is left at
    shutdown) ends its waiters "unavailable": none waits for an answer that cannot come."""
    limit = on_own(2, redis_timeout=5.0, lease_seconds=20.0)
    assert await limit.enqueue() == "admitted"
    limit.release()
    await settle(limit)
    own_redis.pause()
    try:
        waiting = limit.enqueue()
        await asyncio.sleep(0.2)  # its call waits on the stopped Redis
        for task in limit._sync.background:
            task.cancel()
        assert await asyncio.wait_for(waiting, 2) == "unavailable"
        assert limit.queue_depth == 0
    finally:
        own_redis.resume()


async def test_a_release_sent_with_an_acquire_that_fails_is_removed_later(
    on_own: Limits, own_redis: RedisServer
) -> None:
    """A release and an acquire of one moment travel in one call; if that call fails (Redis
    stopped), the released lease is removed by the renewals once Redis answers: never left
    held in Redis."""
    client = own_redis.client()
    limit = on_own(2, **LEASE)
    assert await limit.enqueue() == "admitted"
    await settle(limit)
    own_redis.pause()
    try:
        limit.release()
        assert await limit.enqueue() == "unavailable"  # the call with both timed out
    finally:
        own_redis.resume()
    await wait_for(lambda: limit.connected, 5.0, "Redis answering again")
    await limit._sync.sync()
    assert leases(client, limit) == set()
    assert limit.active == 0


async def wait_connected(limit: SharedLimit, attempts: int = 10) -> None:
    """`limit.connect()` until Redis answered it (each try bounded by its redis_timeout)."""
    for _ in range(attempts):
        if await limit.connect():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{limit!r} never reached Redis")


async def test_a_cluster_node_that_took_over_grants_nothing_on_a_connection_kept_from_before(
    tmp_path: Path, key: str
) -> None:
    """A Redis Cluster node promoted with an idle copy of the limit (a replica held back, its
    primary crashed) may first be reached on a connection a process kept from before (its
    node was the slot's primary once already, or a replica when the connection's check ran):
    no CHECK_SERVER runs there. The scripts compare the node that wrote the state (`id`)
    with their own: another node's copy starts the grace, and the holder re-registers
    (before: granted at once, the holder's slot twice; 1 in 5 runs of the cluster failover
    test, peak 6 for 3)."""
    cluster = {"--cluster-enabled": "yes", "--cluster-port": str(free_port())}  # (as cluster.py)
    server = RedisServer(tmp_path, *(word for option in cluster.items() for word in option))
    client = server.client()
    made = Limits(f"redis+cluster://127.0.0.1:{server.port}", key)
    try:
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        await wait_for(lambda: client.cluster("info")["cluster_state"] == "ok", 10, "the slots")
        while int(client.info("server")["uptime_in_seconds"]) < 1:  # noqa: ASYNC110 - as on_own
            await asyncio.sleep(0.05)
        holder, other = made(1, **LEASE), made(1, **LEASE)
        for limit in (other, holder):  # connections made, and checked, now: a first call to
            await wait_connected(limit)  # a cluster may outlast redis_timeout (seen in CI)
        await other.acquire()
        other.release()
        await settle(other)
        names = list(holder.redis_keys.values())
        raw = redis.Redis(host="127.0.0.1", port=server.port)  # (DUMP is binary)
        idle = {name: raw.dump(name) for name in names if raw.exists(name)}
        await holder.acquire()
        await settle(holder)
        # The promotion: the node now keeps the idle copy another node wrote, in one step.
        # (redis-py's cluster client has no MULTI: a script does the same.)
        copy = raw.register_script(
            "for i, name in ipairs(KEYS) do redis.call('DEL', name) end "
            "for i = 1, #ARGV, 2 do "
            "  redis.call('RESTORE', KEYS[tonumber(ARGV[i])], 0, ARGV[i + 1]) "
            "end "
            "redis.call('HSET', KEYS[#KEYS], 'id', string.rep('0', 40))"
        )
        args = [x for i, n in enumerate(names, 1) if n in idle for x in (i, idle[n])]
        state = holder.redis_keys["state"]
        copy(keys=[*names, state], args=args)
        with pytest.raises(TimeoutError):  # the grace, then the holder's lease re-registered
            async with asyncio.timeout(2 * LEASE["lease_seconds"]):
                await other.acquire()
        assert leases(client, holder) == held_ids(holder)
        holder.release()
    finally:
        await made.close()
        server.stop()
