"""An EngineSignal following a real engine process (the fake engine: batch capacity, a waiting
queue, vLLM's /metrics) with a plain loop of callers that admit only while `admits()` says so:
under a burst the engine's waiting queue stays within waiting_max and a little slack at every
scrape; an engine stopped or frozen makes the signal stale, and admission falls back to the
floor (never unlimited) until it answers again."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

import httpx
import pytest

from gym_concurrency.engines import EngineSignal
from tests.engines.engine_process import EngineProcess, fake_engine
from tests.servers import eventually

WAITING_MAX = 4
SLACK = 2  # calls admitted before a scrape was sent that reach the engine after it was served
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


@dataclass
class Callers:
    """Callers that each make one call to the engine, admitted by one plain loop: it admits
    the oldest caller while the signal admits, then waits for a scrape or a call's end."""

    signal: EngineSignal
    url: str
    pending: deque[asyncio.Future[None]] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    most_in_flight: int = 0
    answers: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def admit(self) -> None:
        loop = asyncio.get_running_loop()
        self.signal.add_listener(self.wake.set)
        try:
            while True:
                while self.pending and self.signal.admits(loop.time(), self.in_flight):
                    self.signal.admitted(1)
                    self.in_flight += 1
                    self.most_in_flight = max(self.most_in_flight, self.in_flight)
                    self.pending.popleft().set_result(None)
                await self.wake.wait()
                self.wake.clear()
        finally:
            self.signal.remove_listener(self.wake.set)

    async def call(self, client: httpx.AsyncClient) -> None:
        admitted = asyncio.get_running_loop().create_future()
        self.pending.append(admitted)
        self.wake.set()
        await admitted
        try:
            answer = await client.post(self.url, json=CHAT)
            self.answers.append(answer.status_code)
        except httpx.TransportError as error:
            self.answers.append(0)
            self.errors.append(repr(error))
        finally:
            self.in_flight -= 1
            self.wake.set()


async def burst(engine: EngineProcess, signal: EngineSignal, calls: int) -> Callers:
    callers = Callers(signal, engine.base + "/v1/chat/completions")
    admitting = asyncio.ensure_future(callers.admit())
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    try:
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:
            await asyncio.gather(*(callers.call(client) for _ in range(calls)))
    finally:
        admitting.cancel()
    return callers


@pytest.mark.parametrize(
    ("engine_args", "options", "calls"),
    [
        # the batch the bottleneck: admission is held by waiting + admitted_since_scrape
        (["--batch", "8", "--service-ms", "100"], {}, 300),
        # a batch of 64 filled first (batch_size), then the queue held as above
        (["--batch", "64", "--service-ms", "200"], {"batch_size": 64}, 1000),
    ],
)
async def test_a_burst_keeps_the_engines_queue_within_waiting_max_at_every_scrape(
    engine_args: list[str], options: dict[str, int], calls: int
) -> None:
    with fake_engine(*engine_args) as engine:
        signal = EngineSignal(
            engine.metrics_url,
            waiting_max=WAITING_MAX,
            interval_seconds=0.05,
            stale_after_seconds=1.0,
            **options,
        )
        signal.start()
        await eventually(lambda: signal.statistics().scrapes >= 1, "the first scrape", 10)
        before = engine.stats()
        callers = await burst(engine, signal, calls)
        after = engine.stats()
        await signal.aclose()
    assert callers.answers == [200] * calls, callers.errors[:3]
    scrapes = [s for s in after["scrapes"] if before["t"] < s["t"] < after["t"]]
    assert len(scrapes) >= 10
    waiting = [s["waiting"] for s in scrapes]
    assert max(waiting) <= WAITING_MAX + SLACK, waiting
    busy = (after["busy_seconds"] - before["busy_seconds"]) / (after["t"] - before["t"])
    print(
        f"{engine_args} {options}: max waiting at a scrape {max(waiting)}, "
        f"max waiting ever {after['max_waiting']}, batch utilisation {busy:.2f}"
    )


async def test_a_stopped_engine_goes_stale_and_admission_falls_back_to_the_floor() -> None:
    with fake_engine("--batch", "8", "--service-ms", "20") as engine:
        signal = EngineSignal(
            engine.metrics_url,
            waiting_max=WAITING_MAX,
            interval_seconds=0.05,
            stale_after_seconds=0.3,
            floor=2,
        )
        signal.start()
        await eventually(lambda: signal.statistics().scrapes >= 1, "the first scrape", 10)
        engine.stop()
    await eventually(lambda: signal.statistics().stale, "the signal to go stale", 5)
    stats = signal.statistics()
    assert "ConnectionRefusedError" in (stats.last_error or ""), stats.last_error
    assert (stats.signal_age_seconds or 0) > 0.3
    now = asyncio.get_running_loop().time()
    assert [signal.admits(now, n) for n in range(4)] == [True, True, False, False]
    callers = await burst(engine, signal, 40)  # every call fails at once: in flight <= floor
    assert callers.answers == [0] * 40
    assert callers.most_in_flight == 2
    await signal.aclose()


async def test_a_frozen_engine_times_out_goes_stale_and_is_followed_again_once_it_answers() -> None:
    with fake_engine("--batch", "8") as engine:
        signal = EngineSignal(
            engine.metrics_url,
            waiting_max=WAITING_MAX,
            interval_seconds=0.05,
            timeout_seconds=0.1,
            stale_after_seconds=0.3,
            floor=1,
        )
        signal.start()
        await eventually(lambda: signal.statistics().scrapes >= 1, "the first scrape", 10)
        engine.freeze()
        try:
            await eventually(lambda: signal.statistics().stale, "the signal to go stale", 5)
            assert "no answer within 0.1 s" in (signal.statistics().last_error or "")
            now = asyncio.get_running_loop().time()
            assert signal.admits(now, 0)
            assert not signal.admits(now, 1)
        finally:
            engine.thaw()
        await eventually(lambda: not signal.statistics().stale, "a fresh reading again", 10)
        assert signal.admits(asyncio.get_running_loop().time(), 100)
        await signal.aclose()
