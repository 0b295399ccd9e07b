"""Weights and flows in a MeteredSemaphore: what a caller sees (the hypothesis machine in
test_flows_stateful.py proves the order on random schedules)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Hashable

import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits import FlowStatistics


async def settle(rounds: int = 6) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


class Caller:
    """Tasks that acquire, note when they got in, and hold until released."""

    def __init__(self, sem: MeteredSemaphore) -> None:
        self.sem = sem
        self.order: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, name: str, weight: int = 1, flow: Hashable = None) -> None:
        self.gates[name] = gate = asyncio.Event()

        async def run() -> None:
            async with self.sem.hold(weight, flow):
                self.order.append(name)
                await gate.wait()

        self.tasks.append(asyncio.get_running_loop().create_task(run()))

    async def finish(self, *names: str) -> None:
        for name in names:
            self.gates[name].set()
        await settle()


async def test_weight_counts_in_limit_active_and_available() -> None:
    sem = MeteredSemaphore(10)
    await sem.acquire(weight=4, flow="a")
    async with sem.hold(weight=3):
        assert (sem.limit, sem.active, sem.available) == (10, 7, 3)
        assert not sem.locked()
    sem.release(weight=4, flow="a")
    assert (sem.active, sem.available) == (0, 10)


async def test_a_quiet_flow_goes_ahead_of_a_flood() -> None:
    sem = MeteredSemaphore(2)
    callers = Caller(sem)
    for i in range(6):
        callers.start(f"flood{i}", flow="flood")
    await settle()
    callers.start("quiet", flow="quiet")
    await settle()
    assert callers.order == ["flood0", "flood1"]
    await callers.finish("flood0")
    # The quiet flow holds nothing; the flood holds 1: the freed slot goes to the quiet one,
    # although five of the flood's requests came before it.
    assert callers.order[-1] == "quiet"
    await callers.finish(*callers.gates)
    assert (sem.active, sem.queue_depth, sem.flow_statistics()) == (0, 0, [])


async def test_within_a_flow_first_come_first_served() -> None:
    sem = MeteredSemaphore(1)
    callers = Caller(sem)
    for name in ("a1", "b1", "a2", "b2", "a3"):
        callers.start(name, flow=name[0])
    await settle()
    for name in ("a1", "b1", "a2", "b2"):
        await callers.finish(name)
    assert callers.order == ["a1", "b1", "a2", "b2", "a3"]
    await callers.finish("a3")


async def test_ties_go_to_the_longest_waiting_head() -> None:
    sem = MeteredSemaphore(1)
    callers = Caller(sem)
    callers.start("hold")
    await settle()
    for name in ("c", "b", "a"):
        callers.start(name, flow=name)
    await settle()
    await callers.finish("hold")
    assert callers.order == ["hold", "c"]
    await callers.finish(*callers.gates)


async def test_a_heavy_waiter_is_never_passed() -> None:
    sem = MeteredSemaphore(4)
    callers = Caller(sem)
    for name in ("h1", "h2", "h3", "h4"):
        callers.start(name, flow="light")
    await settle()
    callers.start("heavy", weight=4, flow="heavy")
    await settle()
    callers.start("light5", flow="light")
    callers.start("other", flow="other")
    await settle()
    # Freed slots are held for the heavy waiter until all four are free, although a light
    # request and a flow holding nothing wait behind it.
    await callers.finish("h1", "h2", "h3")
    assert (sem.active, sem.available, callers.order[-1]) == (1, 3, "h4")
    await callers.finish("h4")
    assert callers.order[-1] == "heavy"
    await callers.finish("heavy")
    assert callers.order[-2:] == ["light5", "other"]  # both flows hold nothing: arrival order
    await callers.finish(*callers.gates)


async def test_a_flow_alone_uses_the_whole_limit() -> None:
    sem = MeteredSemaphore(3)
    callers = Caller(sem)
    for i in range(5):
        callers.start(f"a{i}", flow="a")
    await settle()
    assert (sem.active, sem.queue_depth, sem.statistics().flows) == (3, 2, 1)
    await callers.finish(*callers.gates)


async def test_statistics_and_flow_statistics() -> None:
    sem = MeteredSemaphore(4)
    callers = Caller(sem)
    callers.start("a", weight=3, flow="a")
    callers.start("b", weight=2, flow="b")
    callers.start("c", weight=1)
    await settle()
    stats = sem.statistics()
    assert (stats.active, stats.queue_depth, stats.queued_weight, stats.flows) == (3, 2, 3, 2)
    by_flow = {s.flow: s for s in sem.flow_statistics()}
    assert by_flow == {
        "a": FlowStatistics("a", 3, 0, 0),
        "b": FlowStatistics("b", 0, 1, 2),
        None: FlowStatistics(None, 0, 1, 1),
    }
    await callers.finish(*callers.gates)
    assert sem.flow_statistics() == []


async def test_a_timed_out_heavy_waiter_frees_what_was_held_for_it() -> None:
    sem = MeteredSemaphore(3, timeout=0.2)
    await sem.acquire(weight=2, flow="a")
    heavy = asyncio.ensure_future(sem.acquire(weight=3, flow="b"))
    await asyncio.sleep(0.1)  # the light request's deadline is well after the heavy one's
    light = asyncio.ensure_future(sem.acquire(flow="c"))
    await settle()
    assert not light.done()  # the free slot is held for the heavy waiter
    with pytest.raises(TimeoutError):
        await heavy
    await light  # then it moves on
    assert (sem.active, sem.admission_timeouts) == (3, 1)


async def test_a_cancelled_heavy_waiter_frees_what_was_held_for_it() -> None:
    sem = MeteredSemaphore(3)
    await sem.acquire(weight=2)
    heavy = asyncio.ensure_future(sem.acquire(weight=3))
    await settle()
    light = asyncio.ensure_future(sem.acquire())
    await settle()
    heavy.cancel()
    await settle()
    assert light.done()
    assert (sem.active, sem.admission_cancelled) == (3, 1)


async def test_max_queue_holds_while_capacity_is_held_for_a_heavy_waiter() -> None:
    sem = MeteredSemaphore(3, max_queue=1)
    await sem.acquire(weight=2)
    heavy = asyncio.ensure_future(sem.acquire(weight=2))
    await settle()
    with pytest.raises(Exception, match="max_queue=1"):
        await sem.acquire()
    assert sem.admission_shed == 1
    heavy.cancel()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda s: s.try_acquire(weight=5), ValueError, "weight 5 is more than the limit 4"),
        (lambda s: s.try_acquire(weight=0), ValueError, "weight must be >= 1, got 0"),
        (lambda s: s.try_acquire(weight=1.5), TypeError, "weight must be an int, got 1.5"),
        (lambda s: s.release(weight=2, flow="x"), ValueError, "flow 'x', which holds 0"),
        (lambda s: s.release(), ValueError, "released with no slot held"),
    ],
)
async def test_bad_weights_name_what_was_wrong(call, error, message) -> None:  # type: ignore[no-untyped-def]
    sem = MeteredSemaphore(4, component="c", limit_name="n")
    with pytest.raises(error, match=message):
        call(sem)
    assert (sem.active, sem.flow_statistics()) == (0, [])


async def test_release_more_than_the_flow_holds_changes_nothing() -> None:
    sem = MeteredSemaphore(4)
    await sem.acquire(weight=2, flow="a")
    await sem.acquire(weight=1)
    with pytest.raises(ValueError, match="flow None, which holds 1"):
        sem.release(weight=2)
    with pytest.raises(ValueError, match="flow 'a', which holds 2"):
        sem.release(weight=3, flow="a")
    assert (sem.active, {s.flow: s.held for s in sem.flow_statistics()}) == (3, {"a": 2, None: 1})


async def test_memory_does_not_grow_with_flows_ever_seen() -> None:
    sem = MeteredSemaphore(2)
    for i in range(2000):
        async with sem.hold(flow=("caller", i)):
            pass
    blocker = await sem.acquire(weight=2)
    waiters = [asyncio.ensure_future(sem.acquire(flow=i)) for i in range(500)]
    await settle()
    assert sem.statistics().flows == 500
    for w in waiters:
        w.cancel()
    await settle()
    assert blocker
    assert (sem._queue._flows._heap, sem._held, sem._queue._asks) == ([], {}, {})
    assert sem.flow_statistics() == [FlowStatistics(None, 2, 0, 0)]  # only the blocker


async def test_flood_of_flows_the_choice_stays_fair() -> None:
    sem = MeteredSemaphore(4)
    served: dict[int, int] = {}

    async def caller(flow: int) -> None:
        for _ in range(20):
            async with sem.hold(flow=flow):
                served[flow] = served.get(flow, 0) + 1
                await asyncio.sleep(0)

    await asyncio.gather(*(caller(f) for f in range(8)))
    assert served == dict.fromkeys(range(8), 20)
    assert (sem._queue._flows._heap, sem.active) == ([], 0)


def test_flow_statistics_read_from_another_thread_never_show_phantom_weight() -> None:
    # An exporter thread reads while the loop takes and gives back weight in named flows
    # only: the default flow never appears, and no flow holds less than nothing.
    sem = MeteredSemaphore(1000)
    stop = threading.Event()
    wrong: list[object] = []

    def exporter() -> None:
        while not stop.is_set():
            wrong.extend(f for f in sem.flow_statistics() if f.flow is None or f.held < 0)

    thread = threading.Thread(target=exporter)
    thread.start()
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            for _ in range(1000):
                sem.try_acquire(3, "a")
                sem.try_acquire(2, "b")
                sem.release(3, "a")
                sem.release(2, "b")
    finally:
        stop.set()
        thread.join()
    assert wrong == []
