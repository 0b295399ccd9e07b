"""Redis restarted empty (no persistence) while one process holds every slot and another's
clients queue, then either a process that never talked to Redis starts (join) or a connected
one calls `resize()` with the same size: whoever finds the limit's state missing starts a
grace period in which nothing is granted while the holder re-registers its leases, so the
witness never sees more holders than the limit; full again within 2 leases after."""

from __future__ import annotations

import time

from tests.shared.faults.fleet import Fleet, hold_all, unreconciled
from tests.shared.faults.runs import (
    FAST,
    FLOWS,
    LEASE,
    check,
    leftover_keys,
    measure,
    runs,
    summary,
)
from tests.shared.faults.witness import Witness
from tests.shared.redis_server import RedisServer

HOLD = [0.03, 0.08]
# Twice the other faults' lease: a holder must re-register within the grace (a lease) of
# whoever restores the state first, and a 2-core CI box running five processes can delay
# one by most of 0.8 s (1 run in 50 here); the default lease is 10 s.
RESTART_LEASE = 2 * LEASE
OPTIONS = {**FAST, "lease_seconds": RESTART_LEASE}


def test_a_restart_then_a_join_or_a_resize_never_admits_over_the_limit(
    fleet: Fleet, witness: Witness, store: RedisServer
) -> None:
    limit = 4
    holder = fleet.start("holder", store.url, limit, **OPTIONS)
    waiting = fleet.start("waiting", store.url, limit, weights=[1, 2], flows=FLOWS, **OPTIONS)
    waiting.ask("demand", clients=limit, hold=HOLD)
    windows = []
    for run in range(runs(10)):
        way = ("join", "resize")[run % 2]
        hold_all(holder, limit, [(waiting, {"clients": limit, "hold": HOLD})])
        if way == "join":  # started now, connected only once Redis is back (empty)
            newcomer = fleet.start(
                f"new{run}", store.url, limit, connect=False, weights=[1, 2], flows=FLOWS, **OPTIONS
            )
        start = witness.mark(f"restart {run} ({way})")
        store.restart(down_seconds=0.1)
        if way == "join":
            assert newcomer.ask("connect") == {"connected": True}
            newcomer.ask("demand", clients=limit, hold=HOLD)
        else:
            waiting.ask("resize", size=limit)
        time.sleep(1.5 * RESTART_LEASE)  # the holder's work goes on past Redis's return
        holder.ask("release")
        end = witness.mark(f"restart {run} end")
        time.sleep(2 * RESTART_LEASE)
        if way == "join":
            newcomer.stop()
        windows.append((way, start, end))
    finals = fleet.stop()

    timeline = witness.timeline()
    rows = [
        measure(timeline, "restart", way, limit, start, end, settle=2 * RESTART_LEASE)
        for way, start, end in windows
    ]
    line = summary(
        f"Redis restarted empty, then a join or a resize (its lease {RESTART_LEASE} s)", limit, rows
    )
    check(line, rows, recovered_within=2 * RESTART_LEASE)
    assert unreconciled(finals) == []
    assert leftover_keys(store.client()) == []
