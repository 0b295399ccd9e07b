"""A holder's event loop blocked (a handler calling `time.sleep`, as CPU-bound work does) for
0.5x to 10x the lease, while another process's clients queue for the slots it holds: the
blocked process keeps its leases (they are renewed off the event loop), so the witness never
sees more holders than the limit, and the limit is full again within 2 leases after."""

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
    multiples,
    summary,
)
from tests.shared.faults.witness import Witness
from tests.shared.redis_server import RedisServer


def test_a_blocked_event_loop_keeps_its_leases(
    fleet: Fleet, witness: Witness, store: RedisServer
) -> None:
    limit = 2
    holder = fleet.start("holder", store.url, limit, **FAST)
    other = fleet.start("other", store.url, limit, weights=[1, 2], flows=FLOWS, **FAST)
    other.ask("demand", clients=3, hold=[0.03, 0.08])
    windows = []
    for multiple in multiples():
        hold_all(holder, limit, [(other, {"clients": 3, "hold": [0.03, 0.08]})])
        start = witness.mark(f"stall {multiple}x")
        holder.ask("stall", seconds=multiple * LEASE, within=multiple * LEASE + 30)
        holder.ask("release")
        end = witness.mark(f"stall {multiple}x end")
        time.sleep(2 * LEASE)
        windows.append((multiple, start, end))
    finals = fleet.stop()

    timeline = witness.timeline()
    rows = [
        measure(timeline, "stall", f"{multiple}x", limit, start, end, settle=2 * LEASE)
        for multiple, start, end in windows
    ]
    line = summary("event loop blocked 0.5-10x the lease", limit, rows)
    check(line, rows, recovered_within=2 * LEASE)
    assert unreconciled(finals) == []
    assert leftover_keys(store.client()) == []
