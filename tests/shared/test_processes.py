"""Several OS processes sharing one SharedLimit through a real redis-server: a witness in the
held section proves never more than `limit` holders under a bounded flood; FIFO across
processes; `kill -9` of a holder passes its slots to another process's waiters within
lease_seconds; a chaos soak across 3 processes (cancellations, timeouts, a full queue, Redis
paused and restarted) reconciles every arrival exactly and leaves no lease behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.shared.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]


class Workers:
    """Starts `tests.shared.worker` processes on one limit key and collects their reports."""

    def __init__(self, server: RedisServer, key: str) -> None:
        self.server = server
        self.key = key
        self.client = server.client()
        self.started: list[subprocess.Popen[str]] = []

    def start(self, role: str, name: str, limit: int, **config: Any) -> subprocess.Popen[str]:
        config.update(url=self.server.url, key=self.key, role=role, name=name, limit=limit)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.shared.worker", json.dumps(config)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(process)
        return process

    def go(self, count: int) -> None:
        """Wait until `count` workers are connected, then let them all start at once."""
        deadline = time.monotonic() + 30
        while self.client.llen(f"{self.key}:ready") < count:
            assert time.monotonic() < deadline, "workers did not start"
            for process in self.started:
                assert process.poll() is None, process.communicate()[1]
            time.sleep(0.02)
        self.client.rpush(f"{self.key}:go", *["go"] * count)

    def report(self, process: subprocess.Popen[str], within: float = 30) -> dict[str, Any]:
        out, err = process.communicate(timeout=within)
        assert process.returncode == 0, err
        return dict(json.loads(out.strip().splitlines()[-1]))

    def wait_event(self, event: str, within: float = 10) -> None:
        deadline = time.monotonic() + within
        while event not in self.client.lrange(f"{self.key}:events", 0, -1):
            assert time.monotonic() < deadline, f"no {event!r}"
            time.sleep(0.01)

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.communicate()

    def leftovers(self) -> dict[str, int]:
        """How many leases, waiters and waiter deadlines Redis still holds for the key."""
        base = f"gym_concurrency:{{{self.key}}}:"
        return {name: self.client.zcard(base + name) for name in ("leases", "queue", "wexp")}


@pytest.fixture
def workers(redis_server: RedisServer, key: str) -> Iterator[Workers]:
    made = Workers(redis_server, key)
    yield made
    made.stop()


@pytest.fixture
def own_workers(own_redis: RedisServer, key: str) -> Iterator[Workers]:
    made = Workers(own_redis, key)
    yield made
    made.stop()


FAST = {"lease_seconds": 1.5, "redis_timeout": 0.7}  # (as helpers.FAST: a loaded machine)


def test_a_flood_across_three_processes_never_holds_more_than_the_limit(
    workers: Workers,
) -> None:
    procs = [
        workers.start("flood", f"p{n}", 3, requests=40, hold=[0.003, 0.012], options=FAST)
        for n in range(3)
    ]
    workers.go(3)
    reports = [workers.report(p) for p in procs]
    assert sum(r["admitted"] for r in reports) == 120
    assert max(r["max_witness"] for r in reports) == 3  # full, never more
    for report in reports:
        assert report["counted"] == {"timeouts": 0, "cancelled": 0, "shed": 0, "unavailable": 0}
    assert workers.leftovers() == {"leases": 0, "queue": 0, "wexp": 0}


def test_fifo_across_processes_a_waiter_is_not_overtaken_by_a_later_one(
    workers: Workers,
) -> None:
    holder = workers.start("hold", "holder", 1, slots=1, options=FAST)
    first = workers.start("wait", "a", 1, waiters=3, gap=0.12, hold=0.02, options=FAST)
    second = workers.start("wait", "b", 1, waiters=3, gap=0.12, delay=0.06, hold=0.02, options=FAST)
    workers.go(3)
    workers.wait_event("holding holder")
    deadline = time.monotonic() + 10
    while workers.client.llen(f"{workers.key}:arrivals") < 6:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.05)
    holder.kill()  # its slot passes on within the lease; then each waiter in turn
    workers.report(first)
    workers.report(second)
    arrivals = workers.client.lrange(f"{workers.key}:arrivals", 0, -1)
    admissions = workers.client.lrange(f"{workers.key}:admissions", 0, -1)
    assert arrivals == ["a-0", "b-0", "a-1", "b-1", "a-2", "b-2"]  # 60 ms apart
    assert admissions == arrivals


def test_kill_9_of_a_holder_passes_its_slots_to_another_process_within_lease_seconds(
    workers: Workers,
) -> None:
    lease = 1.5
    holder = workers.start("hold", "holder", 2, slots=2, options=FAST)
    waiter = workers.start("wait", "waiter", 2, waiters=2, delay=0.3, options=FAST)
    workers.go(2)
    workers.wait_event("holding holder")
    deadline = time.monotonic() + 10
    while workers.client.zcard(f"gym_concurrency:{{{workers.key}}}:queue") < 2:
        assert time.monotonic() < deadline, "the waiters never queued"
        time.sleep(0.01)
    killed_at = time.time()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    report = workers.report(waiter)
    handoffs = [at - killed_at for at in report["admitted_at"]]
    assert all(0 < h <= lease + 0.1 for h in handoffs), handoffs
    assert report["counted"] == {"timeouts": 0, "cancelled": 0, "shed": 0, "unavailable": 0}
    assert workers.client.lrange(f"{workers.key}:admissions", 0, -1) == ["waiter-0", "waiter-1"]
    assert workers.leftovers() == {"leases": 0, "queue": 0, "wexp": 0}


@pytest.mark.slow
def test_a_chaos_soak_across_three_processes_reconciles_every_arrival(
    own_workers: Workers, own_redis: RedisServer, redis_server: RedisServer
) -> None:
    limit = 3
    options = {"lease_seconds": 3.0, "redis_timeout": 0.25, "timeout": 0.4, "max_queue": 8}
    procs = [
        own_workers.start(
            "soak",
            f"p{n}",
            limit,
            seconds=5.0,
            rate=80,
            seed=n,
            options=options,
            witness_url=redis_server.url,  # not paused, not restarted
        )
        for n in range(3)
    ]
    own_workers.go(3)
    time.sleep(1.2)
    own_redis.pause()  # Redis stalls: admissions in that second are "unavailable"
    time.sleep(1.0)
    own_redis.resume()
    time.sleep(1.2)
    own_redis.restart()  # Redis loses everything: leases and waiters are re-registered
    reports = [own_workers.report(p, within=40) for p in procs]
    total = {
        "arrived": 0,
        "admitted": 0,
        "timeouts": 0,
        "cancelled": 0,
        "shed": 0,
        "unavailable": 0,
    }
    for report in reports:
        seen, counted = report["outcomes"], report["counted"]
        assert sum(seen.values()) == report["arrived"], report  # each task ended one way
        # Each arrival the limit did not admit it counted exactly once, by how its wait
        # ended. (A task cancelled just as its wait timed out or was shed sees a
        # cancellation; the limit counts the timeout or the shed, once.)
        assert seen["admitted"] + sum(counted.values()) == report["arrived"], report
        assert report["active"] == 0
        assert report["queue_depth"] == 0
        total["arrived"] += report["arrived"]
        total["admitted"] += seen["admitted"]
        for name, count in counted.items():
            total[name] += count
    assert max(r["max_witness"] for r in reports) <= limit
    assert total["arrived"] > 700
    assert all(total.values()), total  # every way an admission ends happened
    assert own_workers.leftovers() == {"leases": 0, "queue": 0, "wexp": 0}
    print("soak", total)
