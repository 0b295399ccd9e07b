"""One of the limit's keys lost while every slot is held and two other processes' clients
queue: deleted by hand (each key in turn, and every mailbox), or evicted by a Redis with a
small `maxmemory` and `allkeys-lru` under another writer's memory pressure. Losing any key
starts the grace a restart does, a lease is never re-registered over the limit, so the
witness never sees more holders than the limit; full again within a few leases after."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gym_concurrency.limits.shared.scripts import KEY_NAMES
from tests.shared.faults.fleet import Fleet, hold_all, unreconciled
from tests.shared.faults.runs import FAST, FLOWS, LEASE, check, measure, runs, summary
from tests.shared.faults.witness import Witness
from tests.shared.redis_server import RedisServer

HOLD = [0.03, 0.08]
# A holder re-registers within a grace (a lease) of whoever finds the loss: as for a
# restart, longer than the other faults' lease so that a 2-core box running four processes
# is not the thing measured.
LOSS_LEASE = 1.5 * LEASE
OPTIONS = {**FAST, "lease_seconds": LOSS_LEASE}
LOST = (*KEY_NAMES, "mbox")  # every key, and the mailboxes
WEIGHTS = [1, 1, 2, 3]  # what the flooding clients ask for (the witness counts weight)


def limit_keys(client: redis.Redis, key: str, name: str) -> list[str]:
    """The limit's Redis keys of role `name` (`mbox`: every process's mailbox)."""
    pattern = f"*{{{key}}}:mbox:*" if name == "mbox" else f"*{{{key}}}:{name}"
    return list(client.keys(pattern))


@pytest.mark.timeout(60 + 6 * runs(10) * len(LOST))  # about 2.5 s a run
def test_any_key_deleted_never_admits_over_the_limit(
    fleet: Fleet, witness: Witness, store: RedisServer, key: str
) -> None:
    limit = 4
    holder = fleet.start("holder", store.url, limit, **OPTIONS)
    others = [
        fleet.start(f"waiting{i}", store.url, limit, weights=WEIGHTS, flows=FLOWS, **OPTIONS)
        for i in range(2)
    ]
    demand = [(agent, {"clients": limit, "hold": HOLD}) for agent in others]
    for agent, asked in demand:
        agent.ask("demand", **asked)
    client = store.client()
    windows = []
    for run in range(runs(10)):
        for name in LOST:
            hold_all(holder, limit, demand)
            start = witness.mark(f"DEL {name} {run}")
            client.delete(*limit_keys(client, key, name) or [f"absent:{name}"])
            time.sleep(LOSS_LEASE)  # the holder's work goes on past the loss
            holder.ask("release")
            end = witness.mark(f"DEL {name} {run} end")
            time.sleep(LOSS_LEASE / 2)
            windows.append((name, start, end))
    finals = fleet.stop()

    timeline = witness.timeline()
    rows = [
        measure(timeline, "key lost", name, limit, start, end, settle=LOSS_LEASE / 2)
        for name, start, end in windows
    ]
    line = summary(f"one key deleted while full (its lease {LOSS_LEASE:.2g} s)", limit, rows)
    check(line, rows, recovered_within=3 * LOSS_LEASE)
    assert unreconciled(finals) == []


class MemoryPressure:
    """Another writer filling a Redis that evicts: values of random size under random keys,
    as a cache sharing the limit's Redis would, until stopped."""

    def __init__(self, store: RedisServer) -> None:
        self._client = store.client()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, daemon=True)
        self.writes = 0

    def _fill(self) -> None:
        rng = random.Random(1)
        while not self._stop.is_set():
            self._client.set(f"cache:{rng.randrange(1 << 30)}", b"x" * rng.randrange(1, 20_000))
            self.writes += 1

    def __enter__(self) -> MemoryPressure:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def evicting(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of 2 MB that evicts any key, least recently used first among a sample of one
    (so that the limit's keys, used often, are evicted often enough to be tested)."""
    folder = tmp_path / "evicting"
    folder.mkdir()
    server = RedisServer(
        folder, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru",
        "--maxmemory-samples", "1",
    )  # fmt: skip
    yield server
    server.stop()


@pytest.mark.timeout(60 + 25 * runs(10))
def test_lru_eviction_under_memory_pressure_never_admits_over_the_limit(
    fleet: Fleet, witness: Witness, evicting: RedisServer
) -> None:
    limit = 4
    holder = fleet.start("holder", evicting.url, limit, **OPTIONS)
    others = [
        fleet.start(f"waiting{i}", evicting.url, limit, weights=WEIGHTS, flows=FLOWS, **OPTIONS)
        for i in range(2)
    ]
    demand = [(agent, {"clients": limit, "hold": HOLD}) for agent in others]
    for agent, asked in demand:
        agent.ask("demand", **asked)
    windows = []
    for run in range(runs(10)):
        # (Generous: keys evicted in the run before may cost a grace or a re-queue or two.)
        hold_all(holder, limit, demand, wait=15 * LOSS_LEASE, within=15 * LOSS_LEASE + 30)
        start = witness.mark(f"pressure {run}")
        with MemoryPressure(evicting) as pressure:
            time.sleep(1.5 * LOSS_LEASE)
        holder.ask("release")
        end = witness.mark(f"pressure {run} end")
        assert pressure.writes > 100
        time.sleep(LOSS_LEASE)
        windows.append((f"run {run}", start, end))
    evicted = int(evicting.client().info("stats")["evicted_keys"])
    finals = fleet.stop()

    timeline = witness.timeline()
    rows = [
        measure(timeline, "evicted", detail, limit, start, end, settle=LOSS_LEASE)
        for detail, start, end in windows
    ]
    line = summary(f"allkeys-lru eviction ({evicted} keys evicted)", limit, rows)
    assert evicted > 0, line
    check(line, rows, recovered_within=4 * LOSS_LEASE)
    assert unreconciled(finals) == []
    assert "maxmemory-policy allkeys-lru" in fleet.log("holder")
