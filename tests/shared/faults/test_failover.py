"""A global limit on Redis Sentinel (`redis+sentinel://`) and on a Redis Cluster
(`redis+cluster://`), failed over during a flood while
one process holds every slot and others' clients queue: planned (`SENTINEL FAILOVER`), and
after a crash that loses the writes of the holder's admissions (the replica was held back,
then the master killed) while the holder is slow to come back (stopped until a quarter lease
after the promotion). The processes follow the new master; finding the limit's state
kept by another Redis (its last writes may be missing), they grant nothing for one lease
while the holders re-register, so the witness never sees more holders than the limit;
full again within 2 leases after the holders' work ends."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.shared.faults.cluster import ClusterDeployment
from tests.shared.faults.fleet import Fleet, unreconciled
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
from tests.shared.faults.sentinel import SentinelDeployment
from tests.shared.faults.witness import Witness

HOLD = [0.03, 0.08]


Deployment = SentinelDeployment | ClusterDeployment


@pytest.fixture(params=["sentinel", "cluster"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    folder = tmp_path / request.param
    folder.mkdir()
    made: Deployment = (
        SentinelDeployment(folder) if request.param == "sentinel" else ClusterDeployment(folder)
    )
    yield made
    made.stop()


def test_a_failover_during_a_flood_never_admits_over_the_limit(
    fleet: Fleet, witness: Witness, deployment: Deployment, key: str
) -> None:
    limit = 3
    holder = fleet.start("holder", deployment.url, limit, **FAST)
    waiting = fleet.start("waiting", deployment.url, limit, **FAST)
    flooding = fleet.start("flooding", deployment.url, limit, weights=[1, 2], flows=FLOWS, **FAST)
    windows = []
    for run in range(runs(4)):
        way = ("crash", "planned")[run % 2]
        for agent in (waiting, flooding):  # (fair queuing would keep giving them a share)
            agent.ask("demand", clients=0, hold=HOLD)
        if way == "crash":  # the replica keeps an idle limit; what follows never reaches it
            time.sleep(0.3)
            deployment.hold_back_replica(key)
        assert holder.ask("hold", slots=limit) == {"held": limit}
        for agent in (waiting, flooding):  # queued behind the holder
            agent.ask("demand", clients=limit + 1, hold=HOLD)
        start = witness.mark(f"failover {run} ({way})")
        if way == "crash":  # the holder is slow to come back: its clients queue elsewhere
            os.kill(holder.process.pid, signal.SIGSTOP)
            try:
                deployment.crash(key)
                time.sleep(LEASE / 4)
            finally:
                os.kill(holder.process.pid, signal.SIGCONT)
            deployment.rejoin()
        else:
            deployment.failover(key)
        time.sleep(LEASE)  # the holder's work goes on past the failover
        holder.ask("release")
        end = witness.mark(f"failover {run} end")
        time.sleep(2 * LEASE)
        windows.append((way, start, end))
    finals = fleet.stop()

    timeline = witness.timeline()
    rows = [
        measure(timeline, "failover", way, limit, start, end, settle=2 * LEASE)
        for way, start, end in windows
    ]
    kind = type(deployment).__name__.removesuffix("Deployment")
    line = summary(f"{kind} failover during a flood", limit, rows)
    check(line, rows, recovered_within=2 * LEASE)
    assert unreconciled(finals) == []
    assert leftover_keys(deployment.primary(key).client()) == []
