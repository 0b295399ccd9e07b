"""A limit shrunk under a queued waiter heavier than the new size (a reload, a `resize()`, an
adaptive step): the waiter is admitted at the limit's size once that frees, counted in
`admission_capped`, and gives back what it was granted when it releases what it asked for;
the queue behind it moves on. A limit of 0 is a pause: nobody is capped at 0."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits.adaptive import AdaptiveLimiter, AimdController


async def settle(rounds: int = 6) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


class Holder:
    """A task that takes `weight` of `flow` with `hold()` (so releases what it asked for),
    and holds it until `done` is set."""

    def __init__(self, sem: MeteredSemaphore, weight: int = 1, flow: str | None = None) -> None:
        self.admitted = False
        self.done = asyncio.Event()

        async def run() -> None:
            async with sem.hold(weight, flow):
                self.admitted = True
                await self.done.wait()

        self.task = asyncio.ensure_future(run())

    async def finish(self) -> None:
        self.done.set()
        await asyncio.wait_for(self.task, 2)


async def test_a_waiter_heavier_than_a_shrunk_limit_is_admitted_at_its_size() -> None:
    sem = MeteredSemaphore(4)
    first = Holder(sem)
    await settle()
    heavy = Holder(sem, weight=4)  # 1 + 4 > 4: chosen next, capacity held for it
    later = [Holder(sem) for _ in range(3)]
    await settle()
    sem.resize(2)  # 4 can never fit in 2
    await first.finish()
    await settle()
    assert heavy.admitted  # at 2, the whole limit: it runs alone
    assert (sem.active, sem.queue_depth, sem.admission_capped) == (2, 3, 1)
    assert not any(h.admitted for h in later)
    await heavy.finish()  # hold() releases 4, what it asked for: 2 is given back
    await settle()
    assert [h.admitted for h in later] == [True, True, False]
    assert sem.active == 2
    for holder in later:
        await holder.finish()
    assert (sem.active, sem.queue_depth, sem.admission_capped) == (0, 0, 1)


async def test_a_capped_flow_holds_and_gives_back_what_it_was_granted() -> None:
    sem = MeteredSemaphore(6)
    first = Holder(sem, weight=2, flow="b")
    await settle()
    heavy = Holder(sem, weight=6, flow="a")
    behind = Holder(sem, weight=1, flow="b")
    await settle()
    sem.resize(3)
    await first.finish()
    await settle()
    assert heavy.admitted
    held = {s.flow: s.held for s in sem.flow_statistics() if s.held}
    assert held == {"a": 3}
    await heavy.finish()  # release(6, "a"): flow a held 3, gives back 3
    await settle()
    assert behind.admitted
    assert {s.flow: s.held for s in sem.flow_statistics() if s.held} == {"b": 1}
    await behind.finish()
    assert sem.active == 0
    assert sem.flow_statistics() == []


async def test_a_limit_grown_back_before_the_waiter_fits_admits_it_whole() -> None:
    sem = MeteredSemaphore(4)
    first = Holder(sem)
    await settle()
    heavy = Holder(sem, weight=4)
    await settle()
    sem.resize(2)
    sem.resize(4)  # back before anything freed: it asks no more than the limit again
    await first.finish()
    await settle()
    assert heavy.admitted
    assert (sem.active, sem.admission_capped) == (4, 0)
    await heavy.finish()
    assert sem.active == 0


async def test_zero_pauses_a_heavy_waiter_and_the_next_size_caps_it() -> None:
    sem = MeteredSemaphore(4)
    first = Holder(sem)
    await settle()
    heavy = Holder(sem, weight=4)
    await settle()
    sem.resize(0)  # a pause: nobody is admitted, nobody is capped at 0
    await first.finish()
    await settle()
    assert not heavy.admitted
    assert (sem.active, sem.queue_depth, sem.admission_capped) == (0, 1, 0)
    sem.resize(3)
    await settle()
    assert heavy.admitted
    assert (sem.active, sem.admission_capped) == (3, 1)
    await heavy.finish()
    assert sem.active == 0


async def test_a_capped_waiter_that_leaves_as_it_is_admitted_gives_back_its_grant() -> None:
    sem = MeteredSemaphore(4)
    assert sem.try_acquire()
    heavy = sem.enqueue(4)
    light = sem.enqueue(1)
    sem.resize(2)
    sem.release()
    assert heavy.result() == "admitted"  # handed 2; its task never resumes to take it
    assert sem.active == 2
    sem.leave(heavy)  # its task was cancelled in that same moment: 2 pass on
    assert light.result() == "admitted"
    sem.settle(light)
    assert (sem.active, sem.admission_cancelled) == (1, 1)
    sem.release()
    assert sem.active == 0


async def test_the_first_capped_waiter_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    sem = MeteredSemaphore(4, component="c", limit_name="judge")
    assert sem.try_acquire()
    heavy = [sem.enqueue(4), sem.enqueue(3)]
    sem.resize(1)
    with caplog.at_level(logging.WARNING, "gym_concurrency.limits"):
        sem.release()
        sem.settle(heavy[0])
        sem.release(4)
        sem.settle(heavy[1])
        sem.release(3)
    assert sem.admission_capped == 2
    assert sem.active == 0
    (record,) = caplog.records
    assert "limit c/judge" in record.getMessage()
    assert "weight 4" in record.getMessage()
    assert "admission_capped" in record.getMessage()


async def test_releases_of_capped_and_whole_holders_of_one_ask_add_up() -> None:
    # Two holders asked 4 in the default flow: one admitted whole, one capped at 2. Whichever
    # releases first, the two releases give back 6 together, and active never goes below 0.
    sem = MeteredSemaphore(4)
    assert sem.try_acquire(4)
    capped = sem.enqueue(4)
    sem.resize(2)
    sem.release(4)
    assert capped.result() == "admitted"
    sem.settle(capped)
    sem.resize(8)
    assert sem.try_acquire(4)
    assert sem.active == 6
    sem.release(4)
    assert sem.active >= 0
    sem.release(4)
    assert sem.active == 0
    with pytest.raises(ValueError, match="released with no slot held"):
        sem.release()


async def test_an_adaptive_step_under_a_heavy_waiter_does_not_wedge_the_queue() -> None:
    sem = MeteredSemaphore(8)
    limiter = AdaptiveLimiter(sem, AimdController(4, 64, 8, probe_seconds=None))
    holders = [Holder(sem) for _ in range(8)]
    await settle()
    heavy = Holder(sem, weight=8)
    later = Holder(sem)
    await settle()
    for i in range(10):  # a window of overloads: AIMD backs off, 8 -> 7
        limiter.record(float(i), i + 0.05, overload=True)
    assert sem.limit < 8
    for holder in holders:
        await holder.finish()
    await settle()
    assert heavy.admitted
    assert (sem.active, sem.admission_capped) == (sem.limit, 1)
    await heavy.finish()
    await settle()
    assert later.admitted
    await later.finish()
    assert sem.active == 0
