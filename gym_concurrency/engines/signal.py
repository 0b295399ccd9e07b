"""EngineSignal: admission that follows a self-hosted engine's own load, read from its
Prometheus /metrics (vLLM, SGLang, TensorRT-LLM; see gauges.py).

A limit that follows an engine asks `admits(now, in_flight)` before each admission and calls
`admitted(n)` for each it makes; both are O(1) on plain numbers kept in process, no await:

- while the last reading is fresh, it admits while `waiting + admitted_since_scrape <
  waiting_max` and (with `cache_max`) `cache_usage < cache_max`. With `batch_size` (the most
  requests the engine runs at once: vLLM's `--max-num-seqs`, or fewer if its KV cache holds
  fewer of these requests), admissions first fill the batch slots the reading showed free
  (`batch_size - running`, when nothing waited), and only those past them count against
  `waiting_max`; and the caller never has more than `batch_size + waiting_max` calls in
  flight, whatever a scrape says (calls admitted before a scrape was served but not yet at
  the engine are in no reading and no count: this bounds them);
- while it is stale (older than `stale_after_seconds`, or none yet, or lacking a gauge the
  signal needs), it admits while `in_flight < floor`: the caller's own calls in flight to the
  engine. Never unlimited.

The scrapes are made by the URL's one poller in the process (poller.py), started lazily on the
running loop by the first `admits()` (or `start()`), shared by every signal that follows the
URL, and stopped when the last of them is closed (`aclose()`, or garbage-collected).
`add_listener(f)` calls `f()` after every scrape, so that a limit can wake its waiters.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from dataclasses import dataclass

from .exposition import DEFAULT_MAX_BYTES
from .fetch import Fetch, check_metrics_url, fetch_metrics
from .gauges import EngineLoad, EngineMetrics, engine_metrics
from .poller import EnginePoller, Listener, PollerConfig, Reading, follow, unfollow

__all__ = ["EngineSignal", "EngineStatistics"]

_MOST_OVER = 2**31  # the most `room()` says a queue is over: a number Redis and ceil() take


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    """An engine signal now: the last reading (None before the first), its age in seconds,
    the admissions made since its scrape, whether it is stale (admission falls back to the
    floor), the scrapes that landed and failed, and the last failure while it lasts."""

    waiting: float | None
    cache_usage: float | None
    running: float | None
    signal_age_seconds: float | None
    admitted_since_scrape: int
    stale: bool
    scrapes: int
    failures: int
    last_error: str | None


class EngineSignal:
    """Admission by an engine's waiting queue and cache usage, read from its /metrics."""

    def __init__(
        self,
        url: str,
        *,
        waiting_max: int,
        cache_max: float | None = None,
        interval_seconds: float = 1.0,
        stale_after_seconds: float | None = None,
        floor: int = 1,
        batch_size: int | None = None,
        engine: str | EngineMetrics = "vllm",
        timeout_seconds: float | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        fetch: Fetch | None = None,
    ) -> None:
        """`engine`: "vllm", "sglang", "trtllm-serve", "triton-trtllm" or an EngineMetrics.
        `stale_after_seconds` defaults to 3 intervals; `timeout_seconds` (one scrape) to
        `stale_after_seconds - interval_seconds`: a scrape sent an interval after the last
        reading may take until that reading would be stale anyway.
        `fetch` defaults to `fetch_metrics` (plain http). ValueError for a bad setting."""
        self._waiting_max = _count("waiting_max", waiting_max, least=1)
        self._floor = _count("floor", floor, least=0)
        self._batch_size = None if batch_size is None else _count("batch_size", batch_size, 1)
        self._cache_max = None if cache_max is None else _fraction("cache_max", cache_max)
        interval = _seconds("interval_seconds", interval_seconds)
        stale_after = 3 * interval if stale_after_seconds is None else stale_after_seconds
        self._stale_after = _seconds("stale_after_seconds", stale_after)
        if self._stale_after <= interval:
            raise ValueError(
                f"EngineSignal: stale_after_seconds ({self._stale_after}) must be longer than "
                f"interval_seconds ({interval}), or every reading goes stale before the next"
            )
        metrics = engine_metrics(engine)
        if self._batch_size is not None and metrics.running is None:
            raise ValueError("EngineSignal: batch_size needs the engine's running gauge")
        if fetch is None:
            fetch = fetch_metrics
            check_metrics_url(url)
        config = PollerConfig(
            metrics,
            interval,
            _seconds(
                "timeout_seconds",
                self._stale_after - interval if timeout_seconds is None else timeout_seconds,
            ),
            _count("max_bytes", max_bytes, least=1),
            fetch,
        )
        self.url = url
        self._poller: EnginePoller = follow(url, config)
        self._leave = weakref.finalize(self, unfollow, self._poller)

    # --- admission (O(1), no await) --------------------------------------------------

    def admits(self, now: float, in_flight: int) -> bool:
        """Whether one more call may go to the engine now (`now`: loop time; `in_flight`: the
        caller's calls to it in flight, which the floor bounds while the signal is stale)."""
        reading = self._poller.reading
        if reading is None or not self._fresh(reading, now):
            self._poller.ensure_running()
            return in_flight < self._floor
        cap = self.in_flight_cap
        if cap is not None and in_flight >= cap:
            return False  # the caller's own calls would fill the batch and the queue
        room = self.room(reading.load)
        return room is not None and self._poller.admitted_since_scrape < room

    def room(self, load: EngineLoad) -> int | None:
        """How many calls the engine has room for beyond the load a scrape read: the free
        batch slots (with `batch_size`, when nothing waits) and `waiting_max` less the waiting
        queue (negative: that many over); None while its cache is at `cache_max` (none until
        a reading says otherwise)."""
        cache = load.cache_usage
        if self._cache_max is not None and (cache is None or cache >= self._cache_max):
            return None
        waiting = load.waiting or 0.0
        free = 0.0
        if self._batch_size is not None and waiting == 0:  # (none while requests wait)
            free = max(0.0, self._batch_size - (load.running or 0.0))
        # +Inf waiting (or a sum of queues that overflowed) is as over as can be: a finite count.
        return math.ceil(max(free + self._waiting_max - waiting, -_MOST_OVER))

    @property
    def in_flight_cap(self) -> int | None:
        """The most calls a caller has in flight to the engine whatever a scrape says
        (`batch_size + waiting_max`; None without `batch_size`)."""
        return None if self._batch_size is None else self._batch_size + self._waiting_max

    def admitted(self, n: int = 1) -> None:
        """Count `n` admissions made to the engine (every follower of the URL sees them)."""
        self._poller.admitted(n)

    def _fresh(self, reading: Reading, now: float) -> bool:
        return now - reading.at <= self._stale_after and self.usable(reading.load)

    # --- state -----------------------------------------------------------------------

    @property
    def config(self) -> PollerConfig:
        """How the engine is scraped (the metrics, interval, timeout, body cap, fetch)."""
        return self._poller.config

    @property
    def stale_after_seconds(self) -> float:
        """Age past which a reading is not used (admission falls back to the floor)."""
        return self._stale_after

    def usable(self, load: EngineLoad) -> bool:
        """Whether `load` has every gauge the signal reads (else it counts as stale)."""
        return (self._cache_max is None or load.cache_usage is not None) and (
            self._batch_size is None or load.running is not None
        )

    @property
    def floor(self) -> int:
        """In-flight calls admitted while the signal is stale."""
        return self._floor

    def statistics(self, now: float | None = None) -> EngineStatistics:
        """The signal now (`now`: loop time; default `time.monotonic()`, the clock of
        asyncio's and uvloop's loops); safe to call from an exporter's thread."""
        poller = self._poller
        reading = poller.reading
        now = time.monotonic() if now is None else now
        load = None if reading is None else reading.load
        return EngineStatistics(
            waiting=None if load is None else load.waiting,
            cache_usage=None if load is None else load.cache_usage,
            running=None if load is None else load.running,
            signal_age_seconds=None if reading is None else max(0.0, now - reading.at),
            admitted_since_scrape=poller.admitted_since_scrape,
            stale=reading is None or not self._fresh(reading, now),
            scrapes=poller.scrapes,
            failures=poller.failures,
            last_error=poller.last_error,
        )

    # --- lifecycle -------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """Call `listener()` on the loop after every scrape of the engine, landed or failed
        (a bound method is held weakly)."""
        self._poller.add_listener(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._poller.remove_listener(listener)

    def start(self) -> None:
        """Start polling now on the running loop (else the first `admits()` does);
        RuntimeError outside a running loop or once closed."""
        if not self._leave.alive:
            raise RuntimeError(f"EngineSignal({self.url!r}) is closed")
        asyncio.get_running_loop()  # "no running event loop" rather than nothing at all
        self._poller.ensure_running()

    async def aclose(self) -> None:
        """Stop following the engine; the last follower of its URL stops the poller and waits
        for its task to end (a scrape in flight is cancelled). Idempotent."""
        task = self._leave()
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({task})

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<EngineSignal {self.url} waiting_max={self._waiting_max} "
            f"waiting={s.waiting} cache_usage={s.cache_usage} stale={s.stale}>"
        )


def _count(name: str, value: object, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"EngineSignal: {name} must be an int >= {least}, not {value!r}")
    return value


def _seconds(name: str, value: object) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"EngineSignal: {name} must be a number of seconds > 0, not {value!r}")
    return float(value)


def _fraction(name: str, value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
        raise ValueError(f"EngineSignal: {name} must be a fraction in (0, 1], not {value!r}")
    return float(value)
