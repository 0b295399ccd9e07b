"""Redis paused (SIGSTOP) for 0.5x to 10x the lease while one process holds every slot and
another's clients queue, in both `redis_unavailable` modes: Redis's clock jumps, but no lease
expires for the time Redis itself was stopped, so once it answers again it grants nothing
while the holders already fill the limit (with `local`, the fallback's holders are
registered as leases first). Full again within 2 leases after."""

from __future__ import annotations

import time

import pytest

from tests.shared.faults.fleet import Fleet, hold_all, unreconciled
from tests.shared.faults.runs import (
    FAST,
    FLOWS,
    LEASE,
    Run,
    check,
    leftover_keys,
    multiples,
    summary,
)
from tests.shared.faults.witness import Witness
from tests.shared.redis_server import RedisServer

HOLD = [0.03, 0.08]
# With `local`, the fallback's work outlasts the pause and the holder's work after it, so
# that it still runs when Redis next has slots to grant.
FALLBACK_HOLD = [1.5 * LEASE, 2.5 * LEASE]
LOCAL_MAX = 1


@pytest.mark.parametrize("mode", ["refuse", "local"])
def test_a_paused_redis_expires_no_lease_for_the_time_it_was_stopped(
    fleet: Fleet, witness: Witness, store: RedisServer, mode: str
) -> None:
    limit = 3
    options: dict[str, object] = dict(FAST, redis_unavailable=mode)
    if mode == "local":
        options["local_max_concurrent"] = LOCAL_MAX
    holder = fleet.start("holder", store.url, limit, **options)
    # queued through the pause, asking for weights 1 and 2
    waiting = fleet.start("waiting", store.url, limit, weights=[1, 2], flows=FLOWS, **options)
    demand = [(waiting, {"clients": limit + 1, "hold": HOLD})]
    if mode == "local":  # waiters that give up after a quarter lease and come again: arrivals
        # during the pause, admitted by the fallback
        arriving = fleet.start("arriving", store.url, limit, timeout=LEASE / 4, **options)
        demand.append((arriving, {"clients": 2, "hold": FALLBACK_HOLD}))
    for agent, asked in demand:
        agent.ask("demand", **asked)
    windows = []
    for multiple in multiples():
        hold_all(holder, limit, demand)
        start = witness.mark(f"pause {multiple}x")
        store.pause()
        time.sleep(multiple * LEASE)
        store.resume()
        resumed = witness.mark(f"pause {multiple}x resumed")
        time.sleep(LEASE / 2)  # the holder's work goes on after Redis is back
        holder.ask("release")
        end = witness.mark(f"pause {multiple}x end")
        time.sleep(2 * LEASE)
        windows.append((multiple, start, resumed, end))
    finals = fleet.stop()

    timeline = witness.timeline()
    rows = []
    for multiple, start, resumed, end in windows:
        if mode == "refuse":
            over = timeline.over(limit, start, end + 2 * LEASE)
            seconds = sum(i.seconds for i in over)
            peak = max([i.peak for i in over], default=limit)
        else:  # the fallback admits by design while Redis is away; Redis itself must not
            # grant a slot once it answers again while the holders (fallback's too) fill it
            bad = timeline.grants_over(limit, resumed, end + 2 * LEASE)
            over = timeline.over(limit, bad[0].at, end + 2 * LEASE) if bad else []
            seconds = sum(i.seconds for i in over) if bad else 0.0
            peak = max([i.peak for i in over], default=limit + 1) if bad else limit
        full = timeline.full_again(limit, end)
        rows.append(
            Run("pause", f"{multiple}x", peak, seconds, None if full is None else full - end)
        )
    line = summary(f"Redis paused 0.5-10x the lease, redis_unavailable={mode}", limit, rows)
    check(line, rows, recovered_within=2 * LEASE)
    if mode == "local":  # while Redis was away, each process stayed within its fallback
        outage = max(timeline.peak(start, resumed) for _, start, resumed, _ in windows)
        print(f"holders while Redis was paused: at most {outage} (limit {limit})")
        for multiple, start, resumed, _ in windows:
            if multiple >= 1:  # (a shorter pause may end before an arrival reaches it)
                assert len(timeline.entries("arriving", start, resumed, how="f")) > 0
            assert timeline.peak(start, resumed) <= limit + 3 * LOCAL_MAX
    assert unreconciled(finals) == []
    assert leftover_keys(store.client()) == []
