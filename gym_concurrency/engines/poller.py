"""One poller per engine URL in a process, shared by every EngineSignal that follows it: it
scrapes the engine's /metrics every `interval_seconds` on the event loop, keeps the last
reading, and counts the admissions made since the scrape that reading came from.

The count is what keeps scrape lag from over-admitting: a reading says how many requests
waited when its scrape was sent, not the ones admitted since. The count restarts at each new
reading from the admissions made after that scrape was *sent* (those made while it was in
flight may be missing from it, so they stay counted).

The poll task starts lazily, on the running loop, the first time a follower asks
(`ensure_running()`); it is started again on a later loop if the one it ran on ended. It never
dies of a scrape: any exception a fetch raises is a failed scrape (logged once per run of
failures). It stops when its last follower leaves (`unfollow`): cancelled wherever it is (a
connection being opened or read is closed; nothing is half-updated, as every update is made
between awaits).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from ..safe_urls import safe_url
from .fetch import Fetch
from .gauges import EngineLoad, EngineMetrics, read_load

__all__ = [
    "EnginePoller",
    "PollerConfig",
    "Reading",
    "ScrapeFailed",
    "end_if_cancelled",
    "follow",
    "scrape_load",
    "unfollow",
]

_log = logging.getLogger("gym_concurrency.engines")

Listener = Callable[[], None]


@dataclass(frozen=True, slots=True)
class PollerConfig:
    """How one URL is polled; every follower of the URL must ask for the same."""

    metrics: EngineMetrics
    interval_seconds: float
    timeout_seconds: float
    max_bytes: int
    fetch: Fetch


@dataclass(frozen=True, slots=True)
class Reading:
    """One scrape that gave a load: what it said and when it was sent (loop time)."""

    load: EngineLoad
    at: float


class EnginePoller:
    """The shared state of one engine URL: the last reading, the admissions since, the task."""

    def __init__(self, url: str, config: PollerConfig) -> None:
        self.url = url
        self.config = config
        self.reading: Reading | None = None
        self.scrapes = 0
        self.failures = 0
        self.last_error: str | None = None
        self.followers = 0
        self._admitted = 0  # every admission counted, ever
        self._base = 0  # `_admitted` when the scrape of `reading` was sent
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[], Listener | None]] = []
        self._closed = False

    # --- what followers read and count (O(1), no await) ------------------------------

    @property
    def admitted_since_scrape(self) -> int:
        """Admissions made since the scrape of the last reading was sent."""
        return self._admitted - self._base

    def admitted(self, n: int = 1) -> None:
        """Count `n` admissions to the engine."""
        self._admitted += n

    def add_listener(self, listener: Listener) -> None:
        """Call `listener()` on the loop after every scrape, landed or failed (a bound method
        is held weakly: the object it belongs to may go)."""
        self._listeners.append(_reference(listener))

    def remove_listener(self, listener: Listener) -> None:
        self._listeners = [ref for ref in self._listeners if ref() not in (listener, None)]

    # --- the task ----------------------------------------------------------------------

    def ensure_running(self) -> None:
        """Start polling on the running loop unless it runs already (or there is no running
        loop, or the poller is closed). Cheap when it runs."""
        task = self._task
        if task is not None and not task.done() and not task.get_loop().is_closed():
            return
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self._run(), name=f"engine poller {safe_url(self.url)}")

    def close(self) -> asyncio.Task[None] | None:
        """Stop polling for good: the task, cancelled (None if there was none running)."""
        self._closed = True
        task, self._task = self._task, None
        if task is None or task.done():
            return None
        loop = task.get_loop()
        if loop.is_closed():
            return None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task.cancel()
        else:  # from another thread (a finalizer run by the garbage collector)
            loop.call_soon_threadsafe(task.cancel)
        return task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.interval_seconds
        while True:
            sent = loop.time()
            await self._scrape(sent)
            end_if_cancelled()
            self._notify()
            await asyncio.sleep(max(0.0, sent + interval - loop.time()))

    async def _scrape(self, sent: float) -> None:
        base = self._admitted  # admissions made from here on may be missing from this scrape
        try:
            load = await scrape_load(self.url, self.config)
        except ScrapeFailed as failure:
            self._failed(str(failure))
            return
        self.landed(load, sent, base)

    def landed(self, load: EngineLoad, sent: float, base: int) -> None:
        """Take `load` as the reading: its scrape was sent at `sent` (loop time), when
        `base` admissions had been counted; the count restarts from there."""
        self.reading = Reading(load, sent)
        self._base = base
        self.scrapes += 1
        if self.last_error is not None:
            _log.info("engine %s: scraped again after: %s", safe_url(self.url), self.last_error)
            self.last_error = None

    @property
    def admitted_total(self) -> int:
        """Every admission counted, ever (what `landed` takes as `base`)."""
        return self._admitted

    def _failed(self, error: str) -> None:
        self.failures += 1
        if self.last_error is None:
            _log.warning(
                "engine %s: scrape failed: %s (once the last reading is stale, limits that "
                "follow it admit up to their floor)",
                safe_url(self.url),
                error,
            )
        self.last_error = error

    def _notify(self) -> None:
        for ref in list(self._listeners):
            if not self._call(ref):
                self._listeners.remove(ref)

    def _call(self, ref: Callable[[], Listener | None]) -> bool:
        """Call a listener if it is still there (False if it is gone). A frame of its own, so
        that a logged failure holds no other listener (nor the object it belongs to)."""
        listener = ref()
        if listener is None:
            return False
        try:
            listener()
        except Exception:  # one follower's bug must not stop the others or the poller
            _log.exception("engine %s: a listener failed", safe_url(self.url))
        return True


class ScrapeFailed(Exception):
    """A scrape that gave no load; its message says why, as the log says it."""


async def scrape_load(url: str, config: PollerConfig) -> EngineLoad:
    """One scrape of `url` as `config` says: the load it read (a gauge missing from it is
    None, but for the waiting queue), or ScrapeFailed saying why not."""
    try:
        async with asyncio.timeout(config.timeout_seconds):
            body = await config.fetch(url, config.timeout_seconds, config.max_bytes)
    except TimeoutError:
        raise ScrapeFailed(
            f"GET {safe_url(url)}: no answer within {config.timeout_seconds} s"
        ) from None
    except Exception as error:  # a Fetch may raise anything; a poll must live on
        raise ScrapeFailed(str(error) or type(error).__name__) from error
    load = read_load(body, config.metrics, config.max_bytes)
    if load is None:
        raise ScrapeFailed(f"a body over the cap of {config.max_bytes} bytes")
    if load.waiting is None:
        names = ", ".join(config.metrics.waiting.names)
        raise ScrapeFailed(f"no usable {names} in the scrape of {safe_url(url)}")
    return load


def end_if_cancelled() -> None:
    """Raise CancelledError if this task is being cancelled: a timeout or a client inside the
    scrape or turn may have turned the cancellation into an error or swallowed it (seen on
    Python 3.11 with a SharedLimit's engine turns; redis-py 8 can, see the mailbox in
    limits/shared/_loops.py); a poll must still end when it is stopped."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _reference(listener: Listener) -> Callable[[], Listener | None]:
    if inspect.ismethod(listener):
        return weakref.WeakMethod(listener)
    return lambda: listener


_POLLERS: dict[str, EnginePoller] = {}


def follow(url: str, config: PollerConfig) -> EnginePoller:
    """The poller of `url`, made on first use; ValueError if it is polled another way."""
    poller = _POLLERS.get(url)
    if poller is None:
        poller = _POLLERS[url] = EnginePoller(url, config)
    elif poller.config != config:
        raise ValueError(
            f"EngineSignal({safe_url(url)!r}): this process already follows it with "
            f"{_described(poller.config)}, not {_described(config)}: one poller per URL"
        )
    poller.followers += 1
    return poller


def unfollow(poller: EnginePoller) -> asyncio.Task[None] | None:
    """One follower fewer; the last one closes the poller: its task, cancelled (or None)."""
    poller.followers -= 1
    if poller.followers > 0:
        return None
    if _POLLERS.get(poller.url) is poller:
        del _POLLERS[poller.url]
    return poller.close()


def _described(config: PollerConfig) -> str:
    return (
        f"interval_seconds={config.interval_seconds}, timeout_seconds={config.timeout_seconds}, "
        f"max_bytes={config.max_bytes}, engine={config.metrics}, "
        f"fetch={getattr(config.fetch, '__qualname__', config.fetch)}"
    )
