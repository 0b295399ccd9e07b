"""The poller behind every EngineSignal of a URL: one per URL in a process, started lazily on
the running loop (again on a later loop), listened to after every scrape, and stopped by its
last follower on every path: aclose while a scrape is in flight or while it sleeps, aclose's
own caller cancelled, the signal garbage-collected, the loop ended under it."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from gym_concurrency.engines import EngineSignal
from gym_concurrency.engines.poller import _POLLERS
from tests.engines.bodies import Bodies, engine_url, vllm
from tests.engines.raw_server import raw_server, sending
from tests.servers import eventually


def now() -> float:
    return asyncio.get_running_loop().time()


async def test_every_signal_of_a_url_shares_one_poller_and_one_count() -> None:
    url, bodies = engine_url(), Bodies(vllm(0))
    signals = [
        EngineSignal(url, waiting_max=w, interval_seconds=0.05, fetch=bodies) for w in (2, 3, 4)
    ]
    for signal in signals:
        signal.start()
    await asyncio.sleep(0.5)
    assert 5 <= bodies.calls <= 12, "one scrape an interval, not one per signal"
    signals[0].admitted(2)
    assert [s.admits(now(), 0) for s in signals] == [False, True, True]
    for signal in signals:
        await signal.aclose()


async def test_a_url_followed_another_way_is_refused_until_its_followers_are_gone() -> None:
    url, bodies = engine_url(), Bodies()
    first = EngineSignal(url, waiting_max=4, interval_seconds=1, fetch=bodies)
    with pytest.raises(
        ValueError, match=r"already follows it with interval_seconds=1\.0.*one poller per URL"
    ):
        EngineSignal(url, waiting_max=4, interval_seconds=2, fetch=bodies)
    await first.aclose()
    second = EngineSignal(url, waiting_max=4, interval_seconds=2, fetch=bodies)
    await second.aclose()
    assert url not in _POLLERS


async def test_polling_starts_at_the_first_question_and_stops_with_the_last_follower() -> None:
    url, bodies = engine_url(), Bodies(vllm(0))
    one = EngineSignal(url, waiting_max=4, interval_seconds=0.02, fetch=bodies)
    two = EngineSignal(url, waiting_max=4, interval_seconds=0.02, fetch=bodies)
    await asyncio.sleep(0.1)
    assert bodies.calls == 0, "nothing is polled before a follower asks"
    assert one.admits(now(), in_flight=0)  # stale: the floor; and the poller starts
    await eventually(lambda: one.statistics().scrapes >= 2, "scrapes")
    await one.aclose()
    await one.aclose()  # idempotent
    calls = bodies.calls
    await asyncio.sleep(0.1)
    assert bodies.calls > calls, "the other follower still follows"
    await two.aclose()
    calls = bodies.calls
    await asyncio.sleep(0.1)
    assert bodies.calls == calls
    assert url not in _POLLERS
    with pytest.raises(RuntimeError, match="is closed"):
        two.start()
    assert two.admits(now(), in_flight=0)
    assert not two.admits(now(), in_flight=1)


async def test_aclose_while_a_scrape_is_in_flight_closes_its_connection() -> None:
    async with raw_server(sending(then_hang=True)) as server:
        signal = EngineSignal(server.url, waiting_max=4, interval_seconds=30)
        signal.start()
        await eventually(lambda: bool(server.requests), "the scrape to be sent")
        started = time.monotonic()
        await signal.aclose()
        assert time.monotonic() - started < 1
        await asyncio.wait_for(server.client_closed.wait(), 5)
        assert signal.statistics().failures == 0  # cancelled, not failed


async def test_aclose_while_the_poller_sleeps_returns_at_once() -> None:
    bodies = Bodies(vllm(0))
    signal = EngineSignal(engine_url(), waiting_max=4, interval_seconds=30, fetch=bodies)
    signal.start()
    await eventually(lambda: signal.statistics().scrapes == 1, "the first scrape")
    started = time.monotonic()
    await signal.aclose()
    assert time.monotonic() - started < 1


async def test_a_cancelled_aclose_stays_cancelled_and_the_poller_still_stops() -> None:
    ending = asyncio.Event()

    async def slow_to_end(url: str, timeout_seconds: float, max_bytes: int) -> bytes:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await ending.wait()  # a fetch whose clean-up takes a while
            raise
        return b""

    signal = EngineSignal(engine_url(), waiting_max=4, interval_seconds=30, fetch=slow_to_end)
    url = signal.url
    signal.start()
    await asyncio.sleep(0.05)
    closing = asyncio.ensure_future(signal.aclose())
    await asyncio.sleep(0.05)
    assert not closing.done()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert url not in _POLLERS
    ending.set()
    await asyncio.sleep(0.05)
    assert all("engine poller" not in t.get_name() for t in asyncio.all_tasks())


async def test_a_signal_garbage_collected_stops_its_poller() -> None:
    bodies = Bodies(vllm(0))
    signal = EngineSignal(engine_url(), waiting_max=4, interval_seconds=0.02, fetch=bodies)
    url = signal.url
    signal.start()
    await eventually(lambda: bodies.calls >= 1, "a scrape")
    del signal
    gc.collect()
    assert url not in _POLLERS
    await asyncio.sleep(0.05)
    calls = bodies.calls
    await asyncio.sleep(0.1)
    assert bodies.calls == calls
    assert all("engine poller" not in t.get_name() for t in asyncio.all_tasks())


def test_a_signal_outlives_its_loop_and_polls_again_on_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bodies = Bodies(vllm(1))
    signal = EngineSignal(engine_url(), waiting_max=4, interval_seconds=0.02, fetch=bodies)
    assert signal.admits(time.monotonic(), in_flight=0)  # no running loop: the floor, no error
    assert bodies.calls == 0
    with pytest.raises(RuntimeError, match="no running event loop"):
        signal.start()

    async def scraped() -> float | None:
        signal.start()
        await eventually(lambda: signal.statistics().scrapes >= 1, "a scrape")
        return signal.statistics().waiting

    caplog.set_level(logging.ERROR, "asyncio")
    assert asyncio.run(scraped()) == 1.0  # the loop ends with the poller running
    bodies.body = vllm(3)
    scrapes = signal.statistics().scrapes

    async def again() -> float | None:
        assert signal.admits(asyncio.get_running_loop().time() + 3600, in_flight=0)  # stale
        await eventually(lambda: signal.statistics().scrapes > scrapes, "a scrape on this loop")
        waiting = signal.statistics().waiting
        await signal.aclose()
        return waiting

    assert asyncio.run(again()) == 3.0
    assert not [r for r in caplog.records if "destroyed" in r.getMessage()]


async def test_listeners_hear_every_scrape_and_a_failing_one_stops_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bodies = Bodies(vllm(0))
    signal = EngineSignal(engine_url(), waiting_max=4, interval_seconds=0.02, fetch=bodies)
    heard: list[int] = []

    class Limit:
        def wake(self) -> None:
            heard.append(signal.statistics().scrapes)

    def broken() -> None:
        raise RuntimeError("a listener's bug")

    limit = Limit()
    signal.add_listener(broken)
    signal.add_listener(limit.wake)
    signal.start()
    await eventually(lambda: len(heard) >= 2, "two scrapes heard")
    bodies.error = OSError("down")
    failures = signal.statistics().failures
    await eventually(lambda: signal.statistics().failures > failures + 1, "failed scrapes")
    assert len(heard) >= 4, "a failed scrape is heard too (the reading ages)"
    assert any("a listener failed" in r.getMessage() for r in caplog.records)
    del limit  # a bound method is held weakly: its limit may go
    gc.collect()
    signal.remove_listener(broken)
    count = len(heard)
    await eventually(lambda: signal.statistics().failures > failures + 4, "more scrapes")
    assert len(heard) == count
    await signal.aclose()
