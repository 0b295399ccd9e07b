"""A shared limit that follows an engine's /metrics for every process that shares it: the
limit's size moves with the engine's room, so that admission (in Redis, one script call as
ever) counts the whole fleet's admissions since a scrape at no extra cost.

One process at a time scrapes: the one holding the engine lease (`ENGINE_TURN`, renewed every
interval, lasting `stale_after_seconds`). When its scrape lands it sizes the limit in one
script call (`ENGINE_SIZE`: nothing if the lease is no longer its), which keeps the reading
and sets the size to

    size = held + room    (at most the ceiling, and batch_size + waiting_max)

`held`: the weight the fleet holds as the script runs; `room`: what the reading leaves room
for (`EngineSignal.room`; negative for a queue over `waiting_max`: the size stays under the
calls held until it drains; 0 at `cache_max`, until a reading says otherwise). The calls
held are in the reading (at the engine) or on their way to it: admissions after the landing
raise the held weight and are in the size already; a call that ends frees a slot that the
engine freed too. Calls admitted but not yet at the engine when it was scraped count once
more than they should (the in-flight cap `batch_size + waiting_max` bounds them, as in a
process). A reading older than `stale_after_seconds` (no scrape landed, or the holder died
and the lease passed on) sets the size to the floor: the floor bounds the fleet's calls in
flight. Every other process reads the reading at its turn, for its statistics.

Weights count as calls to the engine here: give such a limit's calls weight 1.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from ...engines.gauges import EngineLoad
from ...engines.poller import ScrapeFailed, end_if_cancelled, scrape_load
from ...engines.signal import EngineSignal, EngineStatistics
from ...safe_urls import safe_url
from ._store import RedisStore

__all__ = ["FleetEngine"]

_log = logging.getLogger("gym_concurrency.engines")

_KEPT_FOR: Final = 20  # a reading is kept in Redis this many stale periods (then deleted)


class FleetEngine:
    """Follows `signal`'s engine for every process on one shared limit (see the module)."""

    def __init__(
        self,
        signal: EngineSignal,
        *,
        ceiling: int,
        store: RedisStore,
        describe: str,
    ) -> None:
        self.signal = signal
        self.ceiling = ceiling  # the most the engine may be given (the limit's configured size)
        self._store = store
        self._describe = describe
        self.holder = False  # this process scrapes for the fleet
        self.load: EngineLoad | None = None  # the last reading, this process's or read
        self.read_at: float | None = None  # when its scrape was sent (time.monotonic())
        self.scrapes = 0  # scrapes this process made that landed
        self.failures = 0  # ... and failed
        self.last_error: str | None = None

    @property
    def initial_size(self) -> int:
        """The size before any reading: the floor."""
        return min(self.ceiling, self.signal.floor)

    # --- the turns ---------------------------------------------------------------------

    async def follow(self) -> None:
        """Take a turn every interval until cancelled; an unreachable Redis skips turns (the
        limit says so itself)."""
        interval = self.signal.config.interval_seconds
        while True:
            started = time.monotonic()
            try:
                await self._turn()
            except Exception as error:  # Redis away, a client's own error: the next turn
                _log.debug("%s: engine turn failed: %r", self._describe, error)
            end_if_cancelled()
            await asyncio.sleep(max(0.0, started + interval - time.monotonic()))

    async def _turn(self) -> None:
        proc, lease_ms = self._store.proc, _ms(self.signal.stale_after_seconds)
        reply = await self._store.beside("engine_turn", self._store.engine_keys, [proc, lease_ms])
        mine, now_ms, waiting, cache, running, at = reply
        took_over = bool(int(mine)) and not self.holder
        self.holder = bool(int(mine))
        if not self.holder or took_over:  # the holder's reading, as Redis keeps it
            self._read(waiting, cache, running, at, int(now_ms))
        if not self.holder:
            return
        if took_over and self.stale():  # the last holder's reading is too old to go on
            await self._size("set", self.signal.floor)
        await self._scrape()

    async def _scrape(self) -> None:
        url, sent = self.signal.url, time.monotonic()
        try:
            load = await scrape_load(url, self.signal.config)
            if not self.signal.usable(load):
                raise ScrapeFailed(f"no cache or running gauge in the scrape of {safe_url(url)}")
        except ScrapeFailed as failure:
            end_if_cancelled()  # (a cancellation a timeout turned into a failure)
            await self._failed(str(failure))
            return
        room = self.signal.room(load)  # (None: the cache is full: none until it empties)
        kept, elapsed = (
            _ms(self.signal.stale_after_seconds * _KEPT_FOR),
            _ms(time.monotonic() - sent),
        )
        reading = [_text(load.waiting), _text(load.cache_usage), _text(load.running), kept, elapsed]
        if not await self._size("set" if room is None else "held", room or 0, reading):
            self.holder = False  # the lease passed on while this scrape was out
            return
        self.load, self.read_at = load, sent
        self.scrapes += 1
        if self.last_error is not None:
            url = safe_url(self.signal.url)
            _log.info("engine %s: scraped again after: %s", url, self.last_error)
            self.last_error = None

    def _read(self, waiting: Any, cache: Any, running: Any, at: Any, now_ms: int) -> None:
        if waiting in ("", b"") or at in ("", b""):
            return
        self.load = EngineLoad(float(waiting), _number(cache), _number(running))
        self.read_at = time.monotonic() - max(0, now_ms - int(at)) / 1000

    async def _failed(self, error: str) -> None:
        self.failures += 1
        if self.last_error is None:
            _log.warning(
                "engine %s: scrape failed: %s (once the last reading is stale, %s admits up "
                "to its floor across every process)",
                safe_url(self.signal.url),
                error,
                self._describe,
            )
        self.last_error = error
        if self.stale() and self._store.limit != self.initial_size:
            await self._size("set", self.signal.floor)

    async def _size(self, how: str, value: int, reading: list[Any] | None = None) -> bool:
        """Size the limit in Redis ("held": the weight held + `value`; "set": `value`), at
        most the ceiling and the in-flight cap, keeping `reading` (waiting, cache, running,
        ms kept, ms since sent); False if the engine lease is another's."""
        cap = self.signal.in_flight_cap
        most = self.ceiling if cap is None else min(self.ceiling, cap)
        args = [how, most, value, *(reading or ["", "", "", 1, 0])]
        return bool((await self._store.engine_size(args)).status)

    # --- what the limit reads --------------------------------------------------------

    def stale(self, now: float | None = None) -> bool:
        """Whether the last reading is missing or older than the signal allows."""
        if self.read_at is None:
            return True
        now = time.monotonic() if now is None else now
        return now - self.read_at > self.signal.stale_after_seconds

    def statistics(self) -> EngineStatistics:
        """The reading as last written or read (no Redis call): `admitted_since_scrape` is 0,
        as the fleet's admissions are in the limit's size instead."""
        load, now = self.load, time.monotonic()
        return EngineStatistics(
            waiting=None if load is None else load.waiting,
            cache_usage=None if load is None else load.cache_usage,
            running=None if load is None else load.running,
            signal_age_seconds=None if self.read_at is None else max(0.0, now - self.read_at),
            admitted_since_scrape=0,
            stale=self.stale(now),
            scrapes=self.scrapes,
            failures=self.failures,
            last_error=self.last_error,
        )


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _text(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _number(value: Any) -> float | None:
    return None if value in ("", b"", None) else float(value)
