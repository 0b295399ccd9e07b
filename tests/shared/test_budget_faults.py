"""A global limit's rate budget under faults and at its edges, on a real redis-server (a review
of issue 35; each defect's test failed before its fix, and two guard what must not change):

- while Redis cannot be reached, `redis_unavailable="local"` admits nothing of a limit with a
  budget through its fallback (the budget is kept only in Redis: 4 asks of 100 tokens were
  admitted on a 100-a-minute budget), refuses "unavailable" and says why once;
- a global route's budget refusal answers the Retry-After the process route answers (it said
  the queue timeout, 2, where the process route said 61);
- a waiter whose own deadline passes behind a waiter the budget holds up ends "deadline"
  (it ended "budget"); one ended by the limit's timeout ends "budget";
- a settlement whose call never reached Redis (no connection could be made) goes with a later
  call (it was lost: an overrun never charged); one whose call was sent and timed out, or
  whose reply was lost after it ran, goes again and is applied once (a refund was applied
  twice); one sent again after its call broke before Redis read it is applied (it was lost);
  one that redis-py's own retry sends twice is applied once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from redis import exceptions as redis_errors
from redis.asyncio.connection import Connection
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from gym_concurrency import SharedLimit
from gym_concurrency.limits import registered_limits
from gym_concurrency.limits.rate_budget import RateBudget
from gym_concurrency.limits.shared import scripts
from gym_concurrency.limits.shared._budget import SharedReservation
from gym_concurrency.upstream_view import budget_wait
from tests.servers import free_port
from tests.shared.helpers import Limits, kept, settle, until_aged, wait_for
from tests.shared.redis_server import RedisServer


def tpm(n: int) -> RateBudget:
    return RateBudget(tokens_per_minute=n)


async def endpoint(_: Request) -> JSONResponse:
    return JSONResponse({"usage": {"prompt_tokens": 50, "completion_tokens": 50}})


# --- Redis away: no fallback for a budget -----------------------------------------------


async def test_local_mode_refuses_a_budgeted_admission_while_redis_is_away(
    on_own: Limits, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "gym_concurrency.limits.shared")
    limit = on_own(4, budget=tpm(100), redis_unavailable="local", local_max_concurrent=4, timeout=1)
    assert await limit.connect()
    own_redis.stop()
    outcomes = []
    for _ in range(4):
        waiter = limit.enqueue(tokens=100)
        outcomes.append(await waiter)
        assert limit.settle(waiter) is None
    assert outcomes == ["unavailable"] * 4  # (before: 4 admitted on a budget of 100)
    assert (limit.admission_unavailable, limit.active, limit.available) == (4, 0, 0)
    said = [r.getMessage() for r in caplog.records if "rate budget" in r.getMessage()]
    assert len(said) == 1, said
    assert "refused" in said[0]
    assert "only in Redis" in said[0]


async def test_local_mode_without_a_budget_still_admits_through_its_fallback(
    on_own: Limits, own_redis: RedisServer
) -> None:
    limit = on_own(4, redis_unavailable="local", local_max_concurrent=2, timeout=1)
    assert await limit.connect()
    own_redis.stop()
    assert [await limit.enqueue() for _ in range(2)] == ["admitted"] * 2
    limit.release()
    limit.release()


# --- Retry-After of a global route ------------------------------------------------------


async def test_a_global_routes_budget_refusal_says_when_the_budget_holds_it(
    redis_server: RedisServer, key: str
) -> None:
    await until_aged(redis_server, 5)  # (a 10 s lease: a Redis under 3.9 s old gives a grace)

    retry_after: dict[str, int] = {}
    try:
        for scope in ("process", "global"):
            settings = ConcurrencySettings(
                component=f"{key}-{scope}",
                redis_url=redis_server.url,
                routes=[
                    RouteLimit(
                        path="/x",
                        limit_name="x",
                        max_concurrent=4,
                        scope=scope,
                        failure="openai",
                        queue_timeout_seconds=2,
                        tokens_per_minute=100,
                        tokens="json:est",
                    )
                ],
            )
            app = ConcurrencyLimitMiddleware(
                Starlette(routes=[Route("/x", endpoint, methods=["POST"])]), settings=settings
            )
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                first = await client.post("/x", json={"est": 100})
                refused = await client.post("/x", json={"est": 100})
            assert (first.status_code, refused.status_code) == (200, 429), scope
            retry_after[scope] = int(refused.headers["retry-after"])
    finally:
        for limit in registered_limits():
            if isinstance(limit, SharedLimit) and limit.component == f"{key}-global":
                await limit.close()
    assert 59 <= retry_after["process"] <= 61
    assert abs(retry_after["global"] - retry_after["process"]) <= 2, retry_after  # (before: 2)


async def test_budget_wait_of_a_global_limit_is_its_estimates_as_last_seen(
    limits: Limits, redis_server: RedisServer
) -> None:
    await until_aged(redis_server)
    limit = limits(4, budget=tpm(1000), timeout=1)
    assert budget_wait(limit, 100) == 0.0  # room for it, as last seen
    held = limit.enqueue(tokens=900)
    assert await held == "admitted"
    assert await limit.enqueue(tokens=200) == "budget"
    wait = budget_wait(limit, 200)
    assert wait is not None
    assert 58 < wait <= 61
    await settle(limit)  # the refused waiter is gone from the queue: none waits
    assert budget_wait(limit, 100) == 0.0  # the newest answer has room for 100
    reservation = limit.settle(held)
    assert reservation is not None
    reservation.cancel()
    limit.release()
    await settle(limit)


# --- a deadline stays a deadline --------------------------------------------------------


async def test_a_deadline_behind_a_waiter_held_up_by_the_budget_ends_deadline(
    limits: Limits, redis_server: RedisServer
) -> None:
    await until_aged(redis_server)
    holder, head = limits(4, budget=tpm(1000)), limits(4, budget=tpm(1000))
    by_deadline, by_timeout = limits(4, budget=tpm(1000)), limits(4, budget=tpm(1000), timeout=1)
    assert await holder.enqueue(tokens=900) == "admitted"
    first = head.enqueue(tokens=1000)  # waits ~60 s for the budget, the slots kept for it
    await settle(holder, head)
    # It fits alone, but cannot pass a head that needs the whole minute (`pass_by`).
    late = by_deadline.enqueue(tokens=50, deadline=1.0)
    timed = by_timeout.enqueue(tokens=50)
    assert await asyncio.wait_for(late, 3) == "deadline"  # (before: "budget")
    assert await asyncio.wait_for(timed, 3) == "budget"  # the limit's timeout: the budget's
    assert (by_deadline.admission_timeouts, by_deadline.admission_budget) == (1, 0)
    assert (by_timeout.admission_timeouts, by_timeout.admission_budget) == (1, 1)
    assert not first.done()
    head.leave(first)
    holder.release()
    await settle(holder, head, by_deadline, by_timeout)


# --- settlements whose call failed ------------------------------------------------------


def _addresses(limit: SharedLimit) -> list[str]:
    """`ip:port` of every connection the limit's admissions client has open."""
    pool = limit._store._client.connection_pool
    found = []
    for connection in [*pool._available_connections, *pool._in_use_connections]:
        writer = getattr(connection, "_writer", None)
        if writer is not None:
            host, port = writer.get_extra_info("sockname")[:2]
            found.append(f"{host}:{port}")
    return found


async def _admitted_with_100(
    on_own: Limits, own_redis: RedisServer
) -> tuple[SharedLimit, SharedReservation]:
    """A limit on an aged Redis, admitted with a reservation of 100 tokens, settled."""
    await until_aged(own_redis)
    limit = on_own(4, budget=tpm(1000), lease_seconds=6, redis_timeout=1.0)
    waiter = limit.enqueue(tokens=100)
    assert await waiter == "admitted"
    reservation = limit.settle(waiter)
    assert isinstance(reservation, SharedReservation)
    await settle(limit)
    return limit, reservation


async def test_a_settlement_whose_call_never_reached_redis_goes_with_a_later_call(
    on_own: Limits, own_redis: RedisServer
) -> None:
    client = own_redis.client()
    limit, reservation = await _admitted_with_100(on_own, own_redis)
    assert kept(client, limit)["u"]["t"] == 100
    # Redis takes no new connection, and the admissions' own are closed: the next call of
    # the event loop cannot be made (the mailbox and the heartbeat keep theirs).
    client.config_set("maxclients", 1)
    try:
        for address in _addresses(limit):
            client.client_kill_filter(_type=None, addr=address)
        await asyncio.sleep(0.1)  # (the loop sees them closed)
        reservation.settle(300)  # 200 over the estimate: charged now
        await settle(limit)  # the call that carried it failed
    finally:
        client.config_set("maxclients", 10000)
    await wait_for(lambda: limit.connected, 5.0, "Redis answers again")
    limit.release()
    await wait_for(lambda: kept(client, limit)["u"]["t"] == 300, 3.0, "charged")
    await settle(limit)
    assert kept(client, limit)["u"]["t"] == 300


async def test_a_settlement_whose_call_was_sent_and_timed_out_is_charged_once(
    on_own: Limits, own_redis: RedisServer
) -> None:
    client = own_redis.client()
    limit, reservation = await _admitted_with_100(on_own, own_redis)
    client.script_load(scripts.REMOVE)  # (else its first call, held up, only loads it)
    own_redis.pause()
    try:
        reservation.settle(300)  # sent, and no answer within redis_timeout
        await wait_for(lambda: not limit.connected, 3.0, "the call timed out")
    finally:
        own_redis.resume()  # it runs what it had received: the overrun, once
    await wait_for(lambda: limit.connected, 5.0, "Redis answers again")
    limit.release()
    await settle(limit)
    await wait_for(lambda: kept(client, limit)["u"]["t"] == 300, 3.0, "charged")
    await limit._sync.sync()  # a renewal too: nothing more rides on it
    assert kept(client, limit)["u"]["t"] == 300


async def test_a_settlement_whose_reply_was_lost_after_it_ran_is_charged_once(
    on_own: Limits, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane's call reached Redis and its connection broke before the reply was read: the
    lane sends it again on a fresh connection, with the settlement it carried, which Redis
    applies once (applied twice, a refund would free budget twice)."""
    client = own_redis.client()
    limit, reservation = await _admitted_with_100(on_own, own_redis)
    client.script_load(scripts.REMOVE)  # (else its first call only loads it)
    lane = limit._store._lane
    assert lane is not None
    lane_call, send = lane.call, Connection.send_packed_command
    in_lane: set[asyncio.Task[object] | None] = set()
    broken: list[str] = []

    async def call(*args: Any, **kw: Any) -> Any:
        in_lane.add(asyncio.current_task())
        return await lane_call(*args, **kw)

    async def send_then_break(self: Connection, command: bytes, *args: Any, **kw: Any) -> None:
        await send(self, command, *args, **kw)  # the script runs in Redis...
        if asyncio.current_task() in in_lane and b"EVALSHA" in command and not broken:
            broken.append("once")  # ... and the connection breaks before its reply
            await asyncio.sleep(0.2)  # (Redis has read and run it: an abort drops no input)
            raise ConnectionError("the connection broke before the reply was read")

    monkeypatch.setattr(lane, "call", call)
    monkeypatch.setattr(Connection, "send_packed_command", send_then_break)
    reservation.settle(50)  # 50 under the estimate: a refund of 50
    await settle(limit)
    assert broken == ["once"]
    assert kept(client, limit)["u"]["t"] == 50  # refunded once (twice: 0)
    limit.release()
    await settle(limit)


def test_the_start_says_a_budgeted_global_limit_refuses_while_redis_is_away(
    caplog: pytest.LogCaptureFixture, key: str
) -> None:
    caplog.set_level(logging.WARNING, "gym_concurrency")
    routes = [
        RouteLimit(path="/b", limit_name="budgeted", max_concurrent=4, scope="global",
                   tokens_per_minute=100),
        RouteLimit(path="/s", limit_name="slots", max_concurrent=4, scope="global"),
    ]  # fmt: skip
    settings = ConcurrencySettings(
        component=key,
        redis_url=f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        redis_unavailable="local",
        routes=routes,
    )
    served = [Route(path, endpoint, methods=["POST"]) for path in ("/b", "/s")]
    app = ConcurrencyLimitMiddleware(Starlette(routes=served), settings=settings)
    with TestClient(app):  # its lifespan: the start connects the global limits
        pass
    said = {r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()}
    assert any("'budgeted'" in line and "are refused until" in line for line in said), said
    assert any("'slots'" in line and "are local until" in line for line in said), said


async def test_a_refund_whose_call_broke_before_redis_read_it_goes_with_the_call_sent_again(
    on_own: Limits, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane's connection broke before Redis read the call: the call sent again on a fresh
    connection carries the refund, applied (it went without it, and the refund was lost)."""
    client = own_redis.client()
    limit, reservation = await _admitted_with_100(on_own, own_redis)
    client.script_load(scripts.REMOVE)  # (else its first call only loads it)
    send = Connection.send_packed_command
    broken: list[str] = []

    async def break_before(self: Connection, command: Any, *args: Any, **kw: Any) -> None:
        if isinstance(command, bytes) and b"EVALSHA" in command and not broken:
            broken.append("once")  # (the lane's own packed call: nothing of it is sent)
            raise ConnectionError("the connection broke before the call was sent")
        await send(self, command, *args, **kw)

    monkeypatch.setattr(Connection, "send_packed_command", break_before)
    reservation.settle(50)  # a refund of 50
    await settle(limit)
    assert broken == ["once"]
    assert kept(client, limit)["u"]["t"] == 50  # refunded (lost: 100)
    limit.release()
    await settle(limit)


async def test_a_settlement_redis_py_sends_twice_is_applied_once(
    on_own: Limits, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script Redis lost goes redis-py's way (NOSCRIPT, load, run), where redis-py's own
    retry sends a call whose reply was lost once more, settlements and all: Redis applies
    them once."""
    client = own_redis.client()
    limit, reservation = await _admitted_with_100(on_own, own_redis)
    client.script_flush()
    send = Connection.send_packed_command
    loaded: list[str] = []
    broken: list[str] = []

    async def send_then_break(self: Connection, command: Any, *args: Any, **kw: Any) -> None:
        await send(self, command, *args, **kw)
        packed = command if isinstance(command, bytes) else b"".join(command)
        if b"LOAD" in packed:
            loaded.append("loaded")
        elif loaded and b"EVALSHA" in packed and not broken:
            broken.append("once")  # the script ran; its reply is lost, as redis-py says it
            await asyncio.sleep(0.2)
            raise redis_errors.ConnectionError("Connection closed by server.")

    monkeypatch.setattr(Connection, "send_packed_command", send_then_break)
    reservation.settle(50)  # a refund of 50
    await settle(limit)
    await wait_for(lambda: limit.connected, 5.0, "Redis answers")
    assert broken == ["once"]
    limit.release()
    await settle(limit)
    assert kept(client, limit)["u"]["t"] == 50  # refunded once (twice: 0)
