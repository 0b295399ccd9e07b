"""Flows in a limit shared across processes, on a real redis-server: the next waiter is the
head of the flow holding the least weight across every process (ties: the oldest head), FIFO
within a flow, the waiter chosen next never passed, a quiet flow never queued behind another
process's flood, nothing kept in Redis for a flow once it is idle, and the flows' order
rebuilt when Redis loses one of its keys."""

from __future__ import annotations

import asyncio

import pytest

from gym_concurrency import SharedLimit
from gym_concurrency.limits.limit import Admission
from tests.shared.helpers import Limits, leases, settle, wait_for

FLOW_KEYS = ("fq", "ready", "fheld", "dq")


async def queue_in_order(
    *waits: tuple[SharedLimit, int, str | None],
) -> list[asyncio.Future[Admission]]:
    """Enqueue each (limit, weight, flow) after the one before is queued in Redis."""
    futures = []
    for limit, weight, flow in waits:
        futures.append(limit.enqueue(weight, flow))
        await settle(limit)
    return futures


def admitted(futures: list[asyncio.Future[Admission]]) -> list[int]:
    """The indexes of the futures admitted so far."""
    return [
        i
        for i, f in enumerate(futures)
        if f.done() and not f.cancelled() and f.result() == "admitted"
    ]


async def test_a_quiet_flow_is_not_queued_behind_another_processs_flood(limits: Limits) -> None:
    flood, quiet = limits(2), limits(2)
    assert [await flood.enqueue(1, "flood"), await flood.enqueue(1, "flood")] == ["admitted"] * 2
    backlog = await queue_in_order(*[(flood, 1, "flood")] * 6)
    calm = quiet.enqueue(1, "quiet")
    await settle(flood, quiet)
    shared = quiet.statistics().shared
    assert shared is not None
    assert (shared.queue_depth, shared.flows) == (7, 2)
    flood.release(1, "flood")  # the quiet flow holds 0, the flood 1: the quiet one first
    assert await asyncio.wait_for(calm, 3) == "admitted"
    assert admitted(backlog) == []
    flood.release(1, "flood")  # flood holds 0 now, quiet 1: the flood's oldest next
    await wait_for(lambda: admitted(backlog) == [0], 3, "the flood's oldest admitted")
    quiet.release(1, "quiet")
    await wait_for(lambda: admitted(backlog) == [0, 1], 3, "FIFO within the flood")


async def test_the_least_held_flow_goes_first_and_ties_go_to_the_oldest_head(
    limits: Limits,
) -> None:
    a, b, c = limits(3), limits(3), limits(3)
    assert await a.enqueue(1, "x") == "admitted"
    assert await a.enqueue(1, "x") == "admitted"
    assert await b.enqueue(1, "y") == "admitted"
    waits = await queue_in_order((c, 1, "x"), (a, 1, "z"), (b, 1, "y"), (c, 1, "w"))
    a.release(1, "x")  # x 1, y 1, z 0, w 0: z's head is older than w's
    await wait_for(lambda: admitted(waits) == [1], 3, "z first")
    a.release(1, "x")  # x 0, y 1, z 1, w 0: x's head (oldest) before w
    await wait_for(lambda: admitted(waits) == [0, 1], 3, "x next")
    c.release(1, "x")  # x 0, y 1, z 1, w 0: only w waits at 0
    await wait_for(lambda: admitted(waits) == [0, 1, 3], 3, "w next")
    a.release(1, "z")
    await wait_for(lambda: admitted(waits) == [0, 1, 2, 3], 3, "y last")


async def test_the_waiter_chosen_next_is_never_passed(limits: Limits) -> None:
    a, b, c = limits(4), limits(4), limits(4)
    assert await a.enqueue(3, "busy") == "admitted"
    heavy, light = await queue_in_order((b, 3, "heavy"), (c, 1, "light"))
    await asyncio.sleep(0.2)  # 1 free: heavy (held 0, oldest) is chosen and does not fit
    assert not heavy.done()
    assert not light.done()
    a.release(3, "busy")
    assert await asyncio.wait_for(heavy, 3) == "admitted"
    assert await asyncio.wait_for(light, 3) == "admitted"


async def test_a_named_flow_is_served_before_the_default_flows_backlog(
    limits: Limits, redis_server: object
) -> None:
    client = redis_server.client()  # type: ignore[attr-defined]
    plain, tenant = limits(2), limits(2)
    assert [await plain.enqueue(), await plain.enqueue()] == ["admitted"] * 2
    backlog = await queue_in_order(*[(plain, 1, None)] * 4)  # the default flow, FIFO
    late = await queue_in_order((plain, 1, None), (tenant, 1, "tenant"), (plain, 1, None))
    plain.release()  # default holds 1, tenant 0: the tenant first, then the default's oldest
    assert await asyncio.wait_for(late[1], 3) == "admitted"
    plain.release()
    await wait_for(lambda: admitted(backlog) == [0], 3, "the default flow's oldest")
    tenant.release(1, "tenant")
    await wait_for(lambda: admitted(backlog) == [0, 1], 3, "FIFO within the default flow")
    assert not any(client.exists(tenant.redis_keys[k]) for k in ("fq", "ready", "dq"))
    plain.release()
    plain.release()
    await wait_for(lambda: admitted(backlog) == [0, 1, 2, 3], 3, "the default's backlog")
    plain.release()
    assert await asyncio.wait_for(late[0], 3) == "admitted"
    plain.release()
    assert await asyncio.wait_for(late[2], 3) == "admitted"
    while plain.active:
        plain.release()
    await settle(plain, tenant)


async def test_nothing_is_kept_in_redis_for_an_idle_flow(
    limits: Limits, redis_server: object
) -> None:
    client = redis_server.client()  # type: ignore[attr-defined]
    a, b = limits(2), limits(2)
    assert await a.enqueue(2, "one") == "admitted"
    waits = await queue_in_order(*[(b, 1, f"flow-{i}") for i in range(20)])
    assert client.zcard(a.redis_keys["ready"]) == 20
    a.release(2, "one")
    await wait_for(lambda: len(admitted(waits)) == 2, 3, "two admitted")
    for future in waits[2:]:
        future.cancel()
    for i in admitted(waits):
        b.release(1, f"flow-{i}")
    await settle(a, b)
    await wait_for(lambda: not any(client.exists(a.redis_keys[k]) for k in FLOW_KEYS), 3, "idle")
    assert b.statistics().shared.flows == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("lost", FLOW_KEYS)
async def test_a_lost_flow_key_is_rebuilt_and_admits_nothing_more(
    limits: Limits, redis_server: object, lost: str
) -> None:
    client = redis_server.client()  # type: ignore[attr-defined]
    a, b = limits(3), limits(3)
    assert await a.enqueue(1, "x") == "admitted"
    assert await a.enqueue(1) == "admitted"
    assert await a.enqueue(1, "y") == "admitted"
    waits = await queue_in_order((b, 1, None), (b, 2, "x"), (b, 1, "z"), (b, 1, None))
    client.delete(a.redis_keys[lost])
    await asyncio.sleep(0.7)  # a renewal (a third of 1.5 s) finds it and rebuilds the order
    assert client.zcard(a.redis_keys["ready"]) == 3  # the heads of the default, x and z
    a.release(1, "y")  # z (0) before the default (1) and x (1)
    await wait_for(lambda: admitted(waits) == [2], 3, "z first")
    a.release(1)  # default 0: its oldest
    await wait_for(lambda: admitted(waits) == [0, 2], 3, "the default's oldest")
    a.release(1, "x")  # 1 free: x's head (2) is chosen and waits; nothing passes it
    await asyncio.sleep(0.2)
    assert admitted(waits) == [0, 2]
    b.release(1, "z")
    await wait_for(lambda: admitted(waits) == [0, 1, 2], 3, "x's head")
    assert a.global_active <= 3
    b.release(1)
    await wait_for(lambda: admitted(waits) == [0, 1, 2, 3], 3, "the last")
    b.release(2, "x")
    b.release(1)


async def test_a_waiter_sent_twice_keeps_its_ticket_and_nothing_spins(
    limits: Limits, redis_server: object
) -> None:
    """An ACQUIRE run twice (its reply lost, the call sent again) must not give a queued
    waiter a second ticket: the flows' order would name a ticket the queue no longer has and
    the next hand-off would loop in Redis (BUSY) for good."""
    client = redis_server.client()  # type: ignore[attr-defined]
    a = limits(1)
    assert await a.enqueue() == "admitted"
    store = a._store
    first, second = f"{store.proc}:900@f", f"{store.proc}:901@g"
    await store.acquire(None, [first, second], [])
    ticket = client.zscore(a.redis_keys["queue"], first)
    await store.acquire(None, [first], [])  # the same call again
    assert client.zscore(a.redis_keys["queue"], first) == ticket
    await store.remove([first])  # it leaves
    a.release()  # the hand-off: to the other flow's waiter, at once (spinning: BUSY)
    # (granted, then given back at once: this process never waited for that id)
    await wait_for(lambda: client.zcard(a.redis_keys["queue"]) == 0, 3, "the hand-off")
    assert client.hget(a.redis_keys["state"], "fw") == "0"


async def test_a_lost_queue_key_with_flows_waiting_never_spins(
    limits: Limits, redis_server: object
) -> None:
    client = redis_server.client()  # type: ignore[attr-defined]
    a = limits(2)
    assert await a.enqueue(2) == "admitted"
    store = a._store
    await store.acquire(None, [f"{store.proc}:900@f", f"{store.proc}:901@g"], [])
    client.delete(a.redis_keys["queue"])  # the waiters go with it; the flows' keys stay
    a.release(2)  # answered (no endless hand-off); nothing admitted from the lost queue
    await settle(a)
    assert leases(client, a) == set()
    assert a.global_active == 0


async def test_a_waiter_queued_behind_another_flow_is_granted_when_it_is_the_fair_next(
    limits: Limits,
) -> None:
    """Arrivals of one moment are one ACQUIRE: a light waiter queued behind a heavy one of a
    flow holding more is the fair next and fits, so it is admitted in that call, not at the
    next re-check."""
    holder, other = limits(3, lease_seconds=6.0, redis_timeout=1.0), limits(3)
    assert await holder.enqueue(2, "f") == "admitted"
    heavy, light = other.enqueue(3, "f"), other.enqueue(1)  # sent together: one call
    assert await asyncio.wait_for(light, 0.5) == "admitted"  # the default flow holds 0
    assert not heavy.done()
    other.release()
    holder.release(2, "f")
    assert await asyncio.wait_for(heavy, 3) == "admitted"
    other.release(3, "f")


def by_flow(limit: SharedLimit) -> set[tuple[str | None, int, int, int]]:
    """`limit.flow_statistics()` as (flow, held, waiters, queued weight)."""
    return {(f.flow, f.held, f.queue_depth, f.queued_weight) for f in limit.flow_statistics()}


async def test_flow_statistics_are_this_processs_holders_and_waiters_by_flow(
    limits: Limits,
) -> None:
    a, b = limits(4), limits(4)
    assert await a.enqueue(2, "x") == "admitted"
    assert await a.enqueue(1) == "admitted"
    assert await b.enqueue(1, "y") == "admitted"
    waits = await queue_in_order((b, 2, "x"), (b, 1, None), (b, 1, "x"))
    assert by_flow(a) == {("x", 2, 0, 0), (None, 1, 0, 0)}
    assert by_flow(b) == {("y", 1, 0, 0), ("x", 0, 2, 3), (None, 0, 1, 1)}
    a.release(2, "x")  # x's head (2) first: the default flow holds 1, x 0 across processes
    await wait_for(lambda: admitted(waits) == [0], 3, "x's head admitted")
    assert by_flow(b) == {("y", 1, 0, 0), ("x", 2, 1, 1), (None, 0, 1, 1)}
    for future in waits[1:]:
        b.leave(future)
    await settle(a, b)
    a.release(1)
    b.release(1, "y")
    b.release(2, "x")
    assert by_flow(a) == by_flow(b) == set()  # nothing kept for a flow once it is idle
