"""EngineSignal's admission question: the waiting queue plus the admissions since the scrape
under waiting_max, the cache under cache_max, free batch slots first with batch_size, and the
floor whenever the reading is stale or missing; its statistics; its settings checked."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.engines import EngineMetrics, EngineSignal, Gauge
from gym_concurrency.engines.gauges import EngineLoad
from tests.engines.bodies import Bodies, engine_url, vllm
from tests.servers import eventually


async def following(bodies: Bodies, **options: object) -> EngineSignal:
    """A signal over `bodies`, with its first scrape landed."""
    options.setdefault("waiting_max", 4)
    options.setdefault("interval_seconds", 0.02)
    signal = EngineSignal(engine_url(), fetch=bodies, **options)  # type: ignore[arg-type]
    signal.start()
    await eventually(lambda: signal.statistics().scrapes >= 1, "the first scrape")
    return signal


def now() -> float:
    return asyncio.get_running_loop().time()


async def admissions(signal: EngineSignal, most: int = 100) -> int:
    """Admit (and count) while the signal admits; how many it took."""
    n = 0
    while n < most and signal.admits(now(), in_flight=n):
        signal.admitted(1)
        n += 1
    return n


async def test_it_admits_while_waiting_and_admissions_since_the_scrape_stay_under_the_max():
    bodies = Bodies(vllm(1))
    signal = await following(bodies, interval_seconds=30)
    assert await admissions(signal) == 3  # 1 waiting + 3 admitted reaches 4
    assert signal.statistics().admitted_since_scrape == 3
    bodies.body = vllm(0)
    await signal.aclose()
    signal = await following(bodies, interval_seconds=30)
    assert await admissions(signal) == 4
    await signal.aclose()


async def test_a_new_scrape_restarts_the_count_from_the_admissions_made_while_it_was_in_flight():
    bodies = Bodies(vllm(0))
    signal = await following(bodies, interval_seconds=0.05)
    bodies.hold()
    await eventually(lambda: bodies.in_flight == 1, "a scrape in flight")
    signal.admitted(3)  # after the held scrape was sent: it cannot have seen them
    bodies.release()
    scrapes = signal.statistics().scrapes
    await eventually(lambda: signal.statistics().scrapes > scrapes, "the held scrape to land")
    assert signal.statistics().admitted_since_scrape == 3
    assert await admissions(signal) == 1
    await signal.aclose()


async def test_a_cache_over_its_max_refuses_and_a_missing_cache_gauge_means_stale():
    bodies = Bodies(vllm(0, cache=0.95))
    signal = await following(bodies, cache_max=0.9, interval_seconds=30, floor=2)
    assert await admissions(signal) == 0
    await signal.aclose()
    bodies.body = vllm(0, cache=0.5)
    signal = await following(bodies, cache_max=0.9, interval_seconds=30, floor=2)
    assert await admissions(signal) == 4
    await signal.aclose()
    bodies.body = vllm(0)  # no cache gauge: the signal cannot judge the cache
    signal = await following(bodies, cache_max=0.9, interval_seconds=30, floor=2)
    assert signal.statistics().stale
    assert await admissions(signal) == 2  # the floor
    await signal.aclose()


async def test_with_no_reading_or_a_stale_one_it_admits_up_to_the_floor_never_more():
    bodies = Bodies(vllm(0))
    bodies.hold()
    signal = EngineSignal(engine_url(), waiting_max=4, floor=2, fetch=bodies)
    assert signal.statistics().stale
    assert [signal.admits(now(), n) for n in range(4)] == [True, True, False, False]
    bodies.release()
    await eventually(lambda: signal.statistics().scrapes == 1, "a scrape")
    at = now()
    assert signal.admits(at, in_flight=100)  # fresh: in-flight calls are the engine's to judge
    stale_at = at + 3.0 + 0.01  # the default: 3 intervals of 1 s
    assert not signal.admits(stale_at, in_flight=2)
    assert signal.admits(stale_at, in_flight=1)
    assert signal.statistics(stale_at).stale
    await signal.aclose()
    never = EngineSignal(engine_url(), waiting_max=4, floor=0, fetch=Bodies())
    assert not never.admits(now(), in_flight=0)
    await never.aclose()


async def test_with_a_batch_size_the_free_batch_slots_fill_first():
    bodies = Bodies(vllm(0, running=60))
    signal = await following(bodies, batch_size=64, interval_seconds=30)
    assert await admissions(signal) == 4 + 4  # the 4 free slots, then 4 in the queue
    await signal.aclose()
    bodies.body = vllm(2, running=60)  # requests wait: whatever the count says, none is free
    signal = await following(bodies, batch_size=64, interval_seconds=30)
    assert await admissions(signal) == 2
    await signal.aclose()


async def test_with_a_batch_size_the_callers_calls_in_flight_never_pass_batch_and_queue():
    """Calls admitted before a scrape was served but not at the engine yet are in no reading
    and no count: the caller's own calls in flight bound them."""
    signal = await following(Bodies(vllm(0, running=0)), batch_size=64, interval_seconds=30)
    assert signal.admits(now(), in_flight=64 + 3)
    assert not signal.admits(now(), in_flight=64 + 4)
    await signal.aclose()


_WAITING = 'vllm:num_requests_waiting{engine="%s",model_name="m"} %s\n'


@pytest.mark.parametrize(
    "body",
    [_WAITING % ("0", "+Inf"), _WAITING % ("0", "1e308") + _WAITING % ("1", "1e308")],
    ids=["+Inf", "a sum past the largest float"],
)
async def test_an_endless_queue_admits_nothing_and_raises_nothing(body: str) -> None:
    """+Inf waiting counts as a full engine: no room, a finite count (not an OverflowError out
    of an admission or of a release that hands the slot on)."""
    bodies = Bodies(vllm(0))
    signal = await following(bodies, interval_seconds=0.02)
    sem = MeteredSemaphore(8, engine=signal, timeout=0.2)
    await sem.acquire()  # admitted while the engine had room
    bodies.body = body
    scrapes = signal.statistics().scrapes
    await eventually(lambda: signal.statistics().scrapes > scrapes + 1, "the endless queue read")
    assert signal.room(EngineLoad(float("inf"), None, None)) < 0
    assert not signal.admits(now(), in_flight=0)
    waiter = asyncio.ensure_future(sem.acquire())
    await asyncio.sleep(0.05)
    sem.release()  # with a waiter queued: its admission asks the signal, which must not raise
    with pytest.raises(TimeoutError):
        await waiter
    assert (sem.active, sem.admission_timeouts) == (0, 1)
    await signal.aclose()


async def test_statistics_say_the_reading_its_age_and_the_scrapes() -> None:
    bodies = Bodies(vllm(2, cache=0.25, running=7))
    signal = await following(bodies, interval_seconds=0.02)
    signal.admitted(1)
    stats = signal.statistics()
    assert (stats.waiting, stats.cache_usage, stats.running) == (2.0, 0.25, 7.0)
    assert 0 <= stats.signal_age_seconds < 1  # type: ignore[operator]
    assert (stats.admitted_since_scrape, stats.stale, stats.failures) == (1, False, 0)
    assert stats.last_error is None
    bodies.body = "no such gauge 1\n"
    await eventually(lambda: signal.statistics().failures >= 2, "failed scrapes")
    stats = signal.statistics()
    assert stats.last_error == "no usable vllm:num_requests_waiting in the scrape of " + signal.url
    assert stats.waiting == 2.0  # the last reading stays until it is stale
    await signal.aclose()


@pytest.mark.parametrize(
    ("body", "error", "expected"),
    [
        (b"", None, "no usable vllm:num_requests_waiting"),
        (vllm(0) * 2000, None, "a body over the cap of 4096 bytes"),
        (vllm(0), RuntimeError("the fetch broke"), "the fetch broke"),
        (vllm(0), OSError(), "OSError"),
    ],
)
async def test_a_failed_scrape_is_counted_logged_once_and_the_poller_lives_on(
    body: str | bytes, error: BaseException | None, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    bodies = Bodies(body)
    bodies.error = error
    caplog.set_level(logging.INFO, "gym_concurrency.engines")
    signal = EngineSignal(
        engine_url(), waiting_max=4, interval_seconds=0.02, max_bytes=4096, fetch=bodies
    )
    signal.start()
    await eventually(lambda: signal.statistics().failures >= 3, "failed scrapes")
    assert expected in (signal.statistics().last_error or "")
    failed = [r for r in caplog.records if "scrape failed" in r.getMessage()]
    assert len(failed) == 1, "once per run of failures"
    assert expected in failed[0].getMessage()
    bodies.body, bodies.error = vllm(0), None
    await eventually(lambda: signal.statistics().scrapes >= 1, "a scrape after the failures")
    assert any("scraped again" in r.getMessage() for r in caplog.records)
    assert signal.statistics().last_error is None
    await signal.aclose()


async def test_a_fetch_that_overruns_its_timeout_is_a_failed_scrape() -> None:
    bodies = Bodies()
    bodies.hold()  # a Fetch that ignores its timeout: the poller bounds it anyway
    signal = EngineSignal(
        engine_url(), waiting_max=4, interval_seconds=0.05, timeout_seconds=0.05, fetch=bodies
    )
    signal.start()
    await eventually(lambda: signal.statistics().failures >= 1, "a timed-out scrape")
    assert "no answer within 0.05 s" in (signal.statistics().last_error or "")
    await signal.aclose()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"waiting_max": 0}, "waiting_max must be an int >= 1, not 0"),
        ({"waiting_max": True}, "waiting_max must be an int >= 1, not True"),
        ({"floor": -1}, "floor must be an int >= 0, not -1"),
        ({"cache_max": 1.5}, r"cache_max must be a fraction in \(0, 1\], not 1.5"),
        ({"cache_max": 0}, r"cache_max must be a fraction in \(0, 1\], not 0"),
        ({"interval_seconds": 0}, "interval_seconds must be a number of seconds > 0, not 0"),
        ({"interval_seconds": float("nan")}, "interval_seconds must be a number of seconds"),
        ({"timeout_seconds": -1}, "timeout_seconds must be a number of seconds > 0, not -1"),
        ({"stale_after_seconds": 0}, "stale_after_seconds must be a number of seconds > 0"),
        ({"stale_after_seconds": 1}, r"stale_after_seconds \(1.0\) must be longer than"),
        ({"batch_size": 0}, "batch_size must be an int >= 1, not 0"),
        ({"max_bytes": 0}, "max_bytes must be an int >= 1, not 0"),
        ({"engine": "tgi"}, "unknown engine 'tgi'"),
    ],
)
def test_a_bad_setting_is_named(options: dict[str, object], error: str) -> None:
    options.setdefault("waiting_max", 4)
    with pytest.raises(ValueError, match=error):
        EngineSignal(engine_url(), fetch=Bodies(), **options)  # type: ignore[arg-type]


def test_urls_the_default_fetch_cannot_get_and_a_batch_size_without_a_running_gauge() -> None:
    with pytest.raises(ValueError, match="plain http://host"):
        EngineSignal("https://engine/metrics", waiting_max=4)
    with pytest.raises(ValueError, match="no credentials"):
        EngineSignal("http://u:p@engine/metrics", waiting_max=4)
    no_running = EngineMetrics(Gauge(("q",)), Gauge(("c",), combine="max"))
    with pytest.raises(ValueError, match="batch_size needs the engine's running gauge"):
        EngineSignal(engine_url(), waiting_max=4, batch_size=8, engine=no_running, fetch=Bodies())
