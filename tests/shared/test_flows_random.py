"""Flows across processes under random arrivals, releases and cancellations, on a real
redis-server: after every step the limit's keys agree with its state (the counts, each
flow's held weight, one `ready` head per waiting flow scored by what its flow holds), the
held weight is never over the limit, nothing that fits is left waiting (work-conserving), and
once everything ends nothing is kept for any flow."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from gym_concurrency import SharedLimit
from gym_concurrency.limits.limit import Admission
from gym_concurrency.limits.shared._held import lease_flow, lease_weight
from tests.shared.helpers import Limits, settle

LIMIT = 5
FLOWS = [None, "a", "b", "c"]


def check_keys(client: Any, limit: SharedLimit) -> None:
    """The state hash and the keys tell the same story."""
    keys = limit.redis_keys
    state = client.hgetall(keys["state"])
    leases = client.zrange(keys["leases"], 0, -1)
    queue = client.zrange(keys["queue"], 0, -1, withscores=True)
    held = sum(lease_weight(lease) for lease in leases)
    if not state:  # (no call reached Redis yet)
        assert not leases
        assert not queue
        return
    assert int(state["n"]) == held <= LIMIT
    assert int(state["q"]) == len(queue)
    assert int(state["w"]) == sum(lease_weight(i) for i, _ in queue)
    by_flow = Counter[str | None]()
    for lease in leases:
        by_flow[lease_flow(lease)] += lease_weight(lease)
    fheld = {flow: int(w) for flow, w in client.hgetall(keys["fheld"]).items()}
    assert fheld == {flow: w for flow, w in by_flow.items() if flow is not None and w}
    named = [i for i, _ in queue if lease_flow(i) is not None]
    assert int(state.get("fw", 0)) == len(named) == client.zcard(keys["fq"])
    heads: dict[str | None, tuple[float, str]] = {}
    for ident, ticket in queue:
        heads.setdefault(lease_flow(ident), (ticket, ident))
    ready = client.zrange(keys["ready"], 0, -1, withscores=True)
    if not named:
        assert ready == []
        return
    assert int(state["fn"]) == len(ready)
    expected = sorted((by_flow[f], f"{int(t):015d}{i}") for f, (t, i) in heads.items())
    assert sorted((int(score), member) for member, score in ready) == expected


def check_work_conserving(client: Any, limit: SharedLimit) -> None:
    """With waiters queued, the one to serve next does not fit (else it would be admitted)."""
    keys = limit.redis_keys
    state = client.hgetall(keys["state"])
    queue = client.zrange(keys["queue"], 0, -1)
    if not queue or float(state.get("g", 0)) > float(state["t"]):
        return  # (nothing waits, or a grace period: a young Redis hands out nothing yet)
    chosen = state.get("x", "")
    if chosen not in queue:
        top = client.zrange(keys["ready"], 0, 0)
        chosen = top[0][15:] if top else queue[0]
    assert int(state["n"]) + lease_weight(chosen) > LIMIT, (chosen, state)


@pytest.mark.parametrize("seed", range(4))
async def test_random_arrivals_keep_every_flow_invariant(
    limits: Limits, redis_server: Any, seed: int
) -> None:
    rng = random.Random(seed)
    client = redis_server.client()
    processes = [limits(LIMIT, lease_seconds=5.0, redis_timeout=1.0) for _ in range(3)]
    waiting: list[tuple[SharedLimit, int, str | None, asyncio.Future[Admission]]] = []
    holding: list[tuple[SharedLimit, int, str | None]] = []
    for _ in range(120):
        step = rng.random()
        if step < 0.5:
            process, weight, flow = (
                rng.choice(processes),
                rng.choice([1, 1, 2, 3]),
                rng.choice(FLOWS),
            )
            waiting.append((process, weight, flow, process.enqueue(weight, flow)))
        elif step < 0.85 and holding:
            process, weight, flow = holding.pop(rng.randrange(len(holding)))
            process.release(weight, flow)
        elif waiting:
            process, *_, future = waiting.pop(rng.randrange(len(waiting)))
            process.leave(future)  # (a slot handed to it in this moment passes on)
        await settle(*processes)
        for entry in [w for w in waiting if w[3].done()]:
            waiting.remove(entry)
            if not entry[3].cancelled() and entry[3].result() == "admitted":
                holding.append(entry[:3])
        assert sum(p.active for p in processes) <= LIMIT
        check_keys(client, processes[0])
        check_work_conserving(client, processes[0])
    for process, *_, future in waiting:
        process.leave(future)
    for process, weight, flow in holding:
        process.release(weight, flow)
    await settle(*processes)
    assert [p.active for p in processes] == [0, 0, 0]
    keys = processes[0].redis_keys
    for name in ("queue", "leases", "fq", "ready", "fheld", "dq"):
        assert not client.exists(keys[name]), name
