"""The two background loops of a shared limit in one process: the heartbeat (renewals,
re-checks, sizes to write), on a thread of its own, and the mailbox (grants pushed by
whoever freed a slot), a task on the event loop.

The heartbeat runs beside the event loop, as Redisson's lock watchdog does, with a blocking
Redis connection of its own: a loop blocked for any length of time (a handler calling
`time.sleep`, CPU-bound work) keeps its leases while the process lives, and `kill -9` still
frees them within the lease. What it learns (grants, leases it could not renew) is handed
to the event loop with `call_soon_threadsafe`. Both read this process's side of the limit
through `Waiting` (whether waiters queue in Redis; whether the limit closed).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from typing import Final, Protocol

from ._store import RECHECK_SECONDS, RedisStore
from ._sync import RedisSync

__all__ = ["Heartbeat", "Waiting", "mailbox"]

_log = logging.getLogger("gym_concurrency.limits.shared")

_PROBE_SECONDS: Final = 0.25  # how often an unreachable Redis is tried again (at most)
_TICK_SECONDS: Final = 0.1  # the heartbeat's nap between looks at what is due (no Redis call)
_JOIN_SECONDS: Final = 2.0  # how long stop() waits for a call in flight


class Waiting(Protocol):
    """What the loops read of this process's side of the limit."""

    @property
    def queued_in_redis(self) -> bool:
        """True while any waiter of this process queues (or is being queued) in Redis."""
        ...

    @property
    def closed(self) -> bool:
        """True once the limit closed."""
        ...


class Heartbeat:
    """The heartbeat of one shared limit in one process: a full renewal every `period`;
    while waiters queue also a re-check every second and when a lease is due to expire;
    while Redis is away a probe every `probe` seconds (at most a quarter of a second, at
    most an eighth of the lease, so that the holders re-register soon after it is back)."""

    def __init__(
        self,
        store: RedisStore,
        sync: RedisSync,
        here: Waiting,
        *,
        lease_seconds: float,
        describe: str,
    ) -> None:
        self._store = store
        self._sync = sync
        self._here = here
        self._period = lease_seconds / 3
        self._probe = min(_PROBE_SECONDS, lease_seconds / 8)
        self._describe = describe
        self._stopped = threading.Event()
        self._beat_lock = threading.Lock()  # one renewal at a time (the thread's, or sync())
        self._first = threading.Event()  # the first renewal ended (either way)
        self._thread: threading.Thread | None = None

    def end_previous(self) -> None:
        """End the thread of an earlier event loop of this process, if any, before the
        limit starts again on a new one (it closes the blocking connection as it ends).
        Blocks for at most the call it has in flight."""
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(_JOIN_SECONDS)

    def start(self) -> None:
        """Start the thread (daemon: it never keeps a process alive)."""
        # New events and lock: a forked child must not inherit one its parent's thread held.
        stopped = self._stopped = threading.Event()
        self._first = threading.Event()
        self._beat_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._run, args=(stopped,), name=f"{self._describe} heartbeat", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end after the call in flight, if any."""
        self._stopped.set()

    async def join(self) -> None:
        """Stop, and wait (off the event loop) for the thread to end."""
        self.stop()
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, _JOIN_SECONDS)

    async def first_renewal(self, within: float) -> None:
        """Wait (off the event loop) until the first renewal ended, at most `within` s."""
        await asyncio.to_thread(self._first.wait, within)

    def beat(self, full: bool = True) -> None:
        """One renewal now (from the thread, or from a worker thread for `sync()`)."""
        with self._beat_lock:
            if self._store.blocking_started:
                self._sync.renew(full)

    def _run(self, stopped: threading.Event) -> None:
        store = self._store
        # A client of this thread's own: the thread of an earlier event loop may still be in
        # a call on its client, and closes that one as it ends.
        client = None
        while client is None:  # (a cluster's client asks a node at once)
            try:
                client = store.start_blocking()
            except Exception as error:  # the admissions report an unusable URL too
                store.failed("heartbeat", error)
                self._first.set()
                if stopped.wait(self._probe):
                    return
        recheck = min(self._period, RECHECK_SECONDS)
        last = last_full = -math.inf
        while not stopped.is_set():
            try:
                now = time.monotonic()
                full = self._sync.renew_now or now >= last_full + self._period
                if full or now >= self._recheck_due(last, recheck):
                    last = now
                    if full:
                        last_full = now
                    self.beat(full)
            except Exception:  # the heartbeat must outlive anything
                _log.exception("gym_concurrency: %s: heartbeat failed", self._describe)
            self._first.set()
            if self._sync.renew_now:
                pause = self._probe
            else:  # short naps (no Redis call): waiters that arrive meanwhile are seen soon
                due = min(last_full + self._period, self._recheck_due(last, recheck))
                pause = min(_TICK_SECONDS, due - time.monotonic())
            stopped.wait(max(0.0, pause))
        store.close_blocking(client)

    def _recheck_due(self, last: float, recheck: float) -> float:
        """When waiters of this process should look for a lost notification or an expired
        lease (never, without waiters)."""
        if self._here.queued_in_redis:
            return min(last + recheck, self._store.next_expiry)
        return float("inf")


async def mailbox(
    store: RedisStore, sync: RedisSync, here: Waiting, box: str, *, describe: str
) -> None:
    """Wake this process's waiters until the limit closes: Redis pushes each lease it grants
    them to `box`, read here with a blocking pop and handed to `sync.notified(lease)`; a pop
    that fails (Redis restarted or away) asks the heartbeat to renew at once."""
    backoff = 0.05
    task = asyncio.current_task()
    while not here.closed:
        try:
            lease = await store.next_grant(box)
        except Exception as error:  # Redis away or restarted: renew now; try again soon
            if task is not None and task.cancelling():  # a cancel the client made an error
                raise asyncio.CancelledError from error  # (asyncio.run's shutdown waits on it)
            _log.debug("gym_concurrency: %s: mailbox: %r", describe, error)
            sync.renew_at_once()
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, RECHECK_SECONDS)
            continue
        backoff = 0.05
        if lease is not None:
            sync.notified(lease)
        if task is not None and task.cancelling():
            # A cancel the client swallowed (redis-py 8 can, on a pop in flight): each pop
            # ends within a re-check, so the loop would pop on and asyncio.run's shutdown,
            # which waits for it, would never end.
            raise asyncio.CancelledError
