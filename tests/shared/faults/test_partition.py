"""One process cut off from Redis (a TCP proxy that blackholes, drops every reply, or resets)
for 2x the lease while it holds every slot and its own clients keep arriving: it knows its
leases are lost (`admission_lease_lost`), it admits nothing new until it is back, the limit is
exceeded only by the work it had already started (the bound that remains: its holders run on
beside those Redis admitted in their place), and once that work ends the limit is full again
within 2 leases, never over."""

from __future__ import annotations

import time

from tests.shared.faults.fleet import Fleet, hold_all, unreconciled
from tests.shared.faults.proxy import Proxy
from tests.shared.faults.runs import FAST, FLOWS, LEASE, leftover_keys, measure, runs, summary
from tests.shared.faults.witness import Witness
from tests.shared.redis_server import RedisServer

HOLD = [0.03, 0.08]


def test_a_process_cut_off_longer_than_its_lease_admits_nothing_new(
    fleet: Fleet, witness: Witness, store: RedisServer, proxy: Proxy
) -> None:
    limit = 3
    cut = fleet.start("cut", proxy.url, limit, **FAST)
    other = fleet.start("other", store.url, limit, weights=[1, 2], flows=FLOWS, **FAST)
    other.ask("demand", clients=limit + 1, hold=HOLD)
    windows = []
    lost_before = 0
    for run in range(runs(6)):
        mode = ("blackhole", "drop", "reset")[run % 3]
        hold_all(cut, limit, [(other, {"clients": limit + 1, "hold": HOLD})])
        cut.ask("demand", clients=2, hold=HOLD)  # its own new arrivals, queued behind
        start = witness.mark(f"cut {run} ({mode})")
        proxy.mode = mode
        time.sleep(2 * LEASE)
        proxy.mode = "pass"
        healed = witness.mark(f"cut {run} healed")
        time.sleep(LEASE)  # the cut-off holders' remaining work
        cut.ask("release")
        done = witness.mark(f"cut {run} done")
        cut.ask("demand", clients=0, hold=HOLD)
        time.sleep(2 * LEASE)
        lost = cut.ask("counts")["counted"]["lease_lost"]
        windows.append((mode, start, healed, done, lost, lost_before))
        lost_before = lost or 0
    finals = fleet.stop()

    timeline = witness.timeline()
    rows, wrong = [], []
    for mode, start, healed, done, lost, lost_before in windows:
        rows.append(measure(timeline, "partition", mode, limit, start, done, settle=2 * LEASE))
        # Over only by the holders it had when cut off: without them, never over.
        beyond = timeline.over(limit, start, done + 2 * LEASE, exclude={"cut.hold": limit})
        if beyond:
            wrong.append(f"{mode}: over the limit beyond the cut-off holders")
            for i in beyond:
                print(
                    f"  {mode}: at {i.start - start:.3f} s after the cut ({healed - start:.3f}"
                    f" healed, {done - start:.3f} done), {i.seconds:.3f} s, {i.holders}"
                )
        if timeline.over(limit, done, done + 2 * LEASE):
            wrong.append(f"{mode}: over the limit after the cut-off holders' work ended")
        if timeline.entries("cut", start, healed):
            wrong.append(f"{mode}: a new grant to the cut-off process")
        if lost is None or lost - lost_before < limit:
            wrong.append(f"{mode}: lease_lost counted {lost} (before: {lost_before})")
    line = summary("one process cut off for 2x the lease (blackhole / drop / reset)", limit, rows)
    print("\n".join(wrong))
    assert wrong == [], line
    assert all(
        r.recovered_seconds is not None and r.recovered_seconds <= 2 * LEASE for r in rows
    ), (line, rows)
    assert unreconciled(finals) == []
    assert leftover_keys(store.client()) == []
