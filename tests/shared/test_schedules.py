"""Random schedules of admissions, releases, leaves, timeouts and resizes over three
SharedLimits (three processes) on a real redis-server. After every step: Redis holds exactly
the leases the processes hold (none lost, none phantom), never more than the limit unless a
shrink left them there, waiters are admitted in arrival order, and every arrival is counted
exactly once. At the end every lease and waiter is gone."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_concurrency.limits import Admission
from tests.shared.helpers import Limits, held_ids, leases, queued, settle
from tests.shared.redis_server import RedisServer

PROCESSES = 3
step = st.one_of(
    st.tuples(st.just("enqueue"), st.integers(0, PROCESSES - 1)),
    st.tuples(st.just("release"), st.integers(0, PROCESSES - 1)),
    st.tuples(st.just("leave"), st.integers(0, PROCESSES - 1), st.integers(0, 5)),
    st.tuples(st.just("resize"), st.integers(0, PROCESSES - 1), st.integers(0, 4)),
    st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.05, 0.15])),
)


class Schedule:
    def __init__(self, server: RedisServer) -> None:
        self.client = server.client()
        self.made = Limits(server.url, f"sched-{uuid.uuid4().hex[:10]}")
        options: list[dict[str, Any]] = [{}, {}, {"timeout": 0.1}]
        self.procs = [self.made(2, max_queue=4, **options[n]) for n in range(PROCESSES)]
        self.waiting: list[list[asyncio.Future[Admission]]] = [[] for _ in self.procs]
        self.arrivals: list[asyncio.Future[Admission]] = []  # every waiter, in arrival order
        self.admitted_at: dict[asyncio.Future[Admission], int] = {}
        self.arrived = [0] * PROCESSES
        self.admitted = [0] * PROCESSES
        self.step = 0
        self.leased = 0
        self.limit = 2

    async def run(self, steps: list[tuple[Any, ...]]) -> None:
        for proc in self.procs:
            assert await proc.connect()
        try:
            for action in steps:
                self.step += 1
                await getattr(self, action[0])(*action[1:])
                await self.check()
            await self.drain()
        finally:
            await self.made.close()

    async def enqueue(self, p: int) -> None:
        future = self.procs[p].enqueue()
        self.arrived[p] += 1
        self.waiting[p].append(future)
        self.arrivals.append(future)

    async def release(self, p: int) -> None:
        if self.procs[p].active:
            self.procs[p].release()

    async def leave(self, p: int, k: int) -> None:
        pending = [f for f in self.waiting[p] if not f.done()]
        if pending:
            future = pending[k % len(pending)]
            self.procs[p].leave(future)

    async def resize(self, p: int, size: int) -> None:
        self.procs[p].resize(size)
        self.limit = size

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def check(self) -> None:
        await settle(*self.procs)
        deadline = time.monotonic() + 1.5
        while leases(self.client, self.procs[0]) != held_ids(*self.procs):  # a grant in flight
            assert time.monotonic() < deadline, (
                leases(self.client, self.procs[0]),
                held_ids(*self.procs),
            )
            await asyncio.sleep(0.01)
        count = len(held_ids(*self.procs))
        assert count <= max(self.limit, self.leased), (count, self.limit, self.leased)
        self.leased = count
        for p, futures in enumerate(self.waiting):
            for future in futures:
                if future in self.admitted_at or not future.done() or future.cancelled():
                    continue
                if future.result() == "admitted":
                    self.admitted_at[future] = self.step
                    self.admitted[p] += 1
            self.waiting[p] = [f for f in futures if not f.done()]
        # FIFO: a waiter admitted in a later step than one that arrived after it was overtaken.
        steps = [self.admitted_at[f] for f in self.arrivals if f in self.admitted_at]
        assert steps == sorted(steps), steps
        for p, proc in enumerate(self.procs):
            ended = self.admitted[p] + proc.admission_timeouts + proc.admission_cancelled
            ended += proc.admission_shed
            assert ended + proc.queue_depth == self.arrived[p]

    async def drain(self) -> None:
        for p, proc in enumerate(self.procs):
            for future in list(self.waiting[p]):
                proc.leave(future)
        for proc in self.procs:
            while proc.active:
                proc.release()
        await settle(*self.procs)
        assert leases(self.client, self.procs[0]) == set()
        assert queued(self.client, self.procs[0]) == []


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(step, min_size=1, max_size=14))
def test_random_schedules_keep_the_global_limit_fifo_and_every_count(
    redis_server: RedisServer, steps: list[tuple[Any, ...]]
) -> None:
    asyncio.run(Schedule(redis_server).run(steps))


def test_a_schedule_with_every_kind_of_step(redis_server: RedisServer) -> None:
    steps: list[tuple[Any, ...]] = [
        ("enqueue", 0),
        ("enqueue", 1),
        ("enqueue", 2),
        ("enqueue", 0),
        ("enqueue", 1),
        ("enqueue", 2),
        ("enqueue", 0),
        ("enqueue", 1),  # 2 held, 4 queued, then shed
        ("leave", 0, 0),
        ("sleep", 0.15),
        ("release", 0),
        ("resize", 1, 4),
        ("resize", 2, 1),
        ("release", 1),
        ("release", 2),
        ("enqueue", 2),
        ("sleep", 0.15),
        ("resize", 0, 0),
        ("enqueue", 0),
        ("resize", 0, 3),
    ]
    asyncio.run(Schedule(redis_server).run(steps))
