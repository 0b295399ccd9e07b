"""A MeteredSemaphore that follows an engine (`engine=EngineSignal(...)`): admission waits
while the engine's reading says it is loaded, a scrape wakes the waiters (no release needed),
a timeout while the engine holds the head back ends "saturated", a stale reading admits up to
the floor; against the fake engine's real /metrics too. The scrapes come from the signal's
`fetch=` (its documented injection point: tests/engines/bodies.py) or from the fake engine
(benchmarks/_fake_engine.py) over HTTP."""

from __future__ import annotations

import asyncio
import gc
import weakref

import httpx
import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.engines import EngineSignal
from gym_concurrency.engines.poller import _POLLERS
from gym_concurrency.limits import UpstreamCapacityError
from gym_concurrency.limits.rate_budget import RateBudget
from tests.engines.bodies import Bodies, engine_url, vllm
from tests.engines.engine_process import fake_engine
from tests.servers import eventually


async def scraped(signal: EngineSignal, more_than: int = 0) -> None:
    await eventually(lambda: signal.statistics().scrapes > more_than, "a scrape")


async def test_a_loaded_engine_holds_admission_until_a_scrape_says_otherwise() -> None:
    bodies = Bodies(vllm(waiting=5))
    signal = EngineSignal(engine_url(), waiting_max=2, interval_seconds=0.05, fetch=bodies)
    sem = MeteredSemaphore(8, engine=signal)
    assert sem.engine is signal
    assert sem.budget is None
    signal.start()
    await scraped(signal)
    assert not sem.try_acquire()
    waiter = asyncio.ensure_future(sem.acquire())
    await asyncio.sleep(0.2)  # several scrapes, all loaded
    assert not waiter.done()
    assert sem.queue_depth == 1
    assert sem.active == 0
    bodies.body = vllm(waiting=0)  # the next scrape wakes it: nothing is released
    await eventually(waiter.done, "admission after the scrape")
    assert sem.active == 1
    assert signal.statistics().admitted_since_scrape >= 1
    sem.release()
    await signal.aclose()


async def test_a_timeout_while_the_engine_holds_the_head_back_ends_saturated() -> None:
    bodies = Bodies(vllm(waiting=9))
    signal = EngineSignal(engine_url(), waiting_max=2, interval_seconds=0.05, fetch=bodies)
    sem = MeteredSemaphore(4, engine=signal, timeout=0.3)
    signal.start()
    await scraped(signal)
    with pytest.raises(UpstreamCapacityError) as refused:
        await sem.acquire()
    assert refused.value.reason == "saturated"
    assert refused.value.retry_after is None
    assert "engine-" in str(refused.value)
    statistics = sem.statistics()
    assert (statistics.admission_saturated, statistics.admission_timeouts) == (1, 1)
    assert (statistics.admission_budget, statistics.queue_depth) == (0, 0)
    await signal.aclose()


async def test_a_stale_reading_admits_up_to_the_floor() -> None:
    bodies = Bodies(vllm(waiting=0))
    signal = EngineSignal(
        engine_url(), waiting_max=50, interval_seconds=0.05, stale_after_seconds=0.2, fetch=bodies
    )
    sem = MeteredSemaphore(8, engine=signal)
    signal.start()
    await scraped(signal)
    bodies.error = ConnectionError("engine gone")
    await eventually(lambda: signal.statistics().stale, "a stale reading", seconds=4)
    first = asyncio.ensure_future(sem.acquire())
    second = asyncio.ensure_future(sem.acquire())
    await eventually(first.done, "the first, within the floor (1)")
    await asyncio.sleep(0.2)
    assert not second.done()
    assert sem.active == 1
    sem.release()  # in flight drops under the floor: the next one goes
    await eventually(second.done, "the second, after the release")
    sem.release()
    await signal.aclose()


async def test_budget_and_engine_are_taken_together_or_not_at_all() -> None:
    bodies = Bodies(vllm(waiting=9))
    signal = EngineSignal(engine_url(), waiting_max=2, interval_seconds=0.05, fetch=bodies)
    budget = RateBudget(tokens_per_minute=1000)
    sem = MeteredSemaphore(4, budget=budget, engine=signal)
    signal.start()
    await scraped(signal)
    waiter = asyncio.ensure_future(sem.acquire(tokens=300))
    await asyncio.sleep(0.15)
    statistics = budget.statistics().tokens
    assert statistics is not None
    assert statistics.remaining == 1000
    bodies.body = vllm(waiting=0)
    await eventually(waiter.done, "admission")
    statistics = budget.statistics().tokens
    assert statistics is not None
    assert statistics.remaining == 700
    sem.release()
    await signal.aclose()


async def test_a_dropped_limit_stops_listening_to_its_engine() -> None:
    bodies = Bodies(vllm(waiting=0))
    url = engine_url()
    signal = EngineSignal(url, waiting_max=2, interval_seconds=0.02, fetch=bodies)
    sem = MeteredSemaphore(2, engine=signal)
    signal.start()
    await scraped(signal)
    poller = _POLLERS[url]
    assert len(poller._listeners) == 1
    ref = weakref.ref(sem)
    del sem
    gc.collect()
    assert ref() is None
    assert poller._listeners == []
    scrapes = signal.statistics().scrapes
    await scraped(signal, scrapes + 2)  # the poller lives on for the signal, quietly
    await signal.aclose()


async def test_a_limit_follows_the_fake_engines_real_metrics() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    with fake_engine("--batch", "4", "--service-ms", "100") as engine:
        signal = EngineSignal(
            engine.metrics_url, waiting_max=2, batch_size=4, interval_seconds=0.05
        )
        sem = MeteredSemaphore(64, engine=signal, timeout=60)

        async def call(client: httpx.AsyncClient) -> None:
            async with sem:
                answer = await client.post(f"{engine.base}/v1/chat/completions", json=chat)
                answer.raise_for_status()

        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(*(call(client) for _ in range(40)))
        await signal.aclose()
        stats = engine.stats()
    assert stats["served"] == 40
    # batch 4 + waiting_max 2: the engine's own queue never held more than a scrape's lag
    # Its batch full (4), and its own queue within waiting_max (2) and a scrape's lag.
    assert stats["max_running"] == 4
    assert stats["max_waiting"] <= 2 + 2, stats["max_waiting"]
    assert sem.admission_timeouts == 0
    assert sem.active == 0


async def test_with_an_engine_every_async_with_asks_it_not_the_budgets_allowance() -> None:
    bodies = Bodies(vllm(waiting=0))
    signal = EngineSignal(engine_url(), waiting_max=2, interval_seconds=0.05, fetch=bodies)
    # The budget's clock stands still: its allowance stays open for the whole test.
    budget = RateBudget(tokens_per_minute=1000, clock=lambda: 100.0)
    sem = MeteredSemaphore(4, budget=budget, engine=signal, timeout=0.3)
    signal.start()
    await scraped(signal)
    async with sem:  # the engine admits it, and the budget's allowance opens
        pass
    assert budget.allowance.is_open
    bodies.body = vllm(waiting=9)
    await scraped(signal, signal.statistics().scrapes)
    with pytest.raises(UpstreamCapacityError) as refused:
        async with sem:
            pass
    assert refused.value.reason == "saturated"
    statistics = budget.statistics().tokens
    assert statistics is not None
    assert statistics.remaining == 999
    await signal.aclose()
