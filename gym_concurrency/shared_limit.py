"""SharedLimit: one concurrency limit shared by every process that names it, through Redis.

A slot is a lease in Redis with a unique id; one heartbeat task per limit and process renews
all of this process's leases and waiters every `lease_seconds / 3`, so a process that dies
loses them within `lease_seconds`. Waiters queue across processes in ticket order and are
handed their slot by whichever process frees one (atomically, in a Lua script), then woken
through their process's mailbox (a blocking list), with a re-check at least every second.
The state read at export is plain numbers kept in process: no Redis call from the observer.

Needs the `redis` package (the `[redis]` extra), imported only when a limit first connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import time
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, Final, Literal, get_args

from . import observer, shared_scripts
from .limit import Admission, LimitScope, wait_in_queue
from .semaphore import MeteredSemaphore, QueueFullError

__all__ = ["LimitUnavailableError", "RedisUnavailable", "SharedLimit"]

RedisUnavailable = Literal["refuse", "local"]

_log = logging.getLogger(__name__)

_RECHECK_SECONDS: Final = 1.0  # the longest a lost notification can delay a waiter
_PROBE_SECONDS: Final = 0.25  # how often an unreachable Redis is tried again
_TICK_SECONDS: Final = 0.1  # the heartbeat's nap between looks at what is due (no Redis call)
_CLOSE_SECONDS: Final = 2.0  # how long close() waits for in-flight Redis calls
_BATCH: Final = 256  # waiters registered in one script call
_RECHECK_WAITERS: Final = 64  # the oldest waiters a re-check asks about
_EXPIRY_MARGIN: Final = 0.005  # re-check this long after a lease is due to expire


class LimitUnavailableError(Exception):
    """Raised by `SharedLimit.acquire()` when the shared limit's Redis cannot be reached
    (and `redis_unavailable="refuse"`)."""


class _Waiter:
    """One local wait: `id` while it queues in Redis (None once it waits in the fallback),
    `registered` once Redis has its ticket, `fallback` its future in the local fallback."""

    __slots__ = ("fallback", "future", "id", "registered", "timer")

    def __init__(self, ident: str | None, future: asyncio.Future[Admission]) -> None:
        self.id = ident
        self.future = future
        self.registered = False
        self.timer: asyncio.TimerHandle | None = None
        self.fallback: asyncio.Future[Admission] | None = None


class SharedLimit:
    """A FIFO concurrency limit shared across processes and hosts through Redis or Valkey.

    The same contract as MeteredSemaphore, globally: never more than `limit` leases across all
    processes, FIFO by ticket, `timeout` and `max_queue` (the global queue) per waiter, each
    failed admission counted once in the process where it happened. When Redis cannot be
    reached, `redis_unavailable="refuse"` ends an admission "unavailable" and `"local"` admits
    it through a process-local semaphore of `local_max_concurrent` slots; both are counted in
    `admission_unavailable`. Implements `gym_concurrency.limit.Limit`.
    """

    def __init__(
        self,
        value: int = 1,
        *,
        redis_url: str,
        component: str | None = None,
        limit_name: str | None = None,
        server: str | None = None,
        timeout: float | None = None,
        max_queue: int | None = None,
        key: str | None = None,
        key_prefix: str = "gym_concurrency",
        lease_seconds: float = 10.0,
        redis_unavailable: RedisUnavailable = "refuse",
        local_max_concurrent: int | None = None,
        redis_timeout: float = 1.0,
        max_connections: int = 64,
    ) -> None:
        _check_count("value", value)
        _check_seconds("timeout", timeout, optional=True)
        if max_queue is not None:
            _check_count("max_queue", max_queue)
        _check_url(redis_url)
        shared_key = key if key is not None else limit_name
        _check_key(key, shared_key)
        _check_name("key_prefix", key_prefix)
        _check_seconds("lease_seconds", lease_seconds)
        _check_seconds("redis_timeout", redis_timeout)
        if redis_timeout >= lease_seconds:
            raise ValueError(
                f"SharedLimit redis_timeout must be less than lease_seconds, got "
                f"redis_timeout={redis_timeout} with lease_seconds={lease_seconds}"
            )
        _check_mode(redis_unavailable, local_max_concurrent)
        _check_count("max_connections", max_connections, minimum=1)
        assert shared_key is not None
        self._limit = value  # the global size as last seen
        self._timeout = timeout
        self._max_queue = max_queue
        self._component = component
        self._limit_name = limit_name
        self._server = server
        self._key = shared_key
        self._redis_url = redis_url
        self._lease_seconds = float(lease_seconds)
        self._lease_ms = max(1, round(lease_seconds * 1000))
        self._grace_ms = max(1, self._lease_ms // 2)
        self._redis_timeout = float(redis_timeout)
        self._max_connections = max_connections
        self._mode: RedisUnavailable = redis_unavailable
        self._local_max = local_max_concurrent
        base = f"{key_prefix}:{{{shared_key}}}:"
        self._keys = [base + name for name in shared_scripts.KEY_NAMES]
        self._mbox_prefix = base + "mbox:"
        # counters (monotonic)
        self._timeouts = 0
        self._cancelled = 0
        self._shed = 0
        self._unavailable = 0
        # the global state as last seen
        self._global_held = 0
        self._global_queued = 0
        self._stamp = 0  # Redis's clock (µs) of the newest answer seen
        self._next_expiry = math.inf  # (monotonic) when the next lease expires, as last seen
        # this process's share
        self._held: dict[str, None] = {}  # lease ids held here, in the order taken
        self._waiting: dict[asyncio.Future[Admission], _Waiter] = {}
        self._ids: dict[str, _Waiter] = {}  # waiters queued (or queueing) in Redis, by id
        self._fallback = (
            MeteredSemaphore(local_max_concurrent, max_queue=max_queue)
            if local_max_concurrent is not None
            else None
        )
        # work with Redis
        self._pending_size: tuple[int, str] | None = (value, "configure")
        self._dropping: set[str] = set()  # ids to remove from Redis once it answers again
        self._inflight: set[str] = set()  # ids named by the sync in flight: removals wait
        self._deferred: list[str] = []
        self._unsent: list[_Waiter] = []  # waiters not yet sent to Redis, in arrival order
        self._registering = False
        self._unremoved: list[str] = []  # ids given back, not yet removed from Redis
        self._removing = False
        self._down = False
        self._sync_now = False  # Redis answered again: renew and re-register at once
        self._contacted = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._proc = ""
        self._counter: Iterator[int] = itertools.count(1)
        self._client: Any = None
        self._mailbox_client: Any = None
        self._scripts: dict[str, Any] = {}
        self._failures: tuple[type[BaseException], ...] = (OSError, TimeoutError)
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._size_lock: asyncio.Lock | None = None
        self._failed_before: set[str] = set()
        if component is not None and limit_name is not None:
            observer.register(self)

    # --- state -----------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The global number of slots, as last seen (every Redis answer carries it)."""
        return self._limit

    @property
    def active(self) -> int:
        """Slots held in this process now (leases, and fallback slots while Redis was away)."""
        fallback = self._fallback.active if self._fallback is not None else 0
        return len(self._held) + fallback

    @property
    def available(self) -> int:
        """Slots free across all processes, as last seen; 0 while a shrunk limit drains.
        While Redis cannot be reached: 0 ("refuse"), or the local fallback's free slots."""
        if self._down or self._closed:
            return self._fallback.available if self._fallback is not None else 0
        return max(0, self._limit - self._global_held)

    @property
    def queue_depth(self) -> int:
        """Tasks of this process waiting for a slot now."""
        return len(self._waiting)

    @property
    def global_active(self) -> int:
        """Leases held across all processes, as last seen."""
        return self._global_held

    @property
    def global_queue_depth(self) -> int:
        """Waiters queued across all processes, as last seen."""
        return self._global_queued

    @property
    def admission_timeouts(self) -> int:
        """Waits in this process that gave up after `timeout` seconds (monotonic)."""
        return self._timeouts

    @property
    def admission_cancelled(self) -> int:
        """Waits in this process that were cancelled (monotonic)."""
        return self._cancelled

    @property
    def admission_shed(self) -> int:
        """Admissions in this process refused because the global queue was full (monotonic)."""
        return self._shed

    @property
    def admission_unavailable(self) -> int:
        """Admissions in this process that could not reach Redis: refused, or admitted
        through the local fallback (monotonic)."""
        return self._unavailable

    @property
    def timeout(self) -> float | None:
        """Seconds a waiter may wait, or None to wait forever."""
        return self._timeout

    @property
    def max_queue(self) -> int | None:
        """How many may wait across all processes, or None for no bound."""
        return self._max_queue

    @property
    def scope(self) -> LimitScope:
        """Always "global": one limit shared by every process that names it."""
        return "global"

    @property
    def component(self) -> str | None:
        """The component this limit belongs to (a metric attribute)."""
        return self._component

    @property
    def limit_name(self) -> str | None:
        """The name of this limit within its component (a metric attribute)."""
        return self._limit_name

    @property
    def server(self) -> str | None:
        """The server this limit belongs to (a metric attribute), if any."""
        return self._server

    @property
    def key(self) -> str:
        """The name every process sharing this limit uses (default: `limit_name`)."""
        return self._key

    @property
    def redis_keys(self) -> dict[str, str]:
        """The Redis keys of this limit by role (mailboxes are `mailbox_prefix` + process)."""
        return dict(zip(shared_scripts.KEY_NAMES, self._keys, strict=True))

    @property
    def mailbox_prefix(self) -> str:
        return self._mbox_prefix

    @property
    def lease_seconds(self) -> float:
        """How long a lease outlives its process's last heartbeat."""
        return self._lease_seconds

    @property
    def redis_unavailable(self) -> RedisUnavailable:
        """What an admission does when Redis cannot be reached: "refuse" or "local"."""
        return self._mode

    @property
    def local_max_concurrent(self) -> int | None:
        """Slots of the process-local fallback ("local" mode), else None."""
        return self._local_max

    @property
    def connected(self) -> bool:
        """False while Redis is known to be unreachable."""
        return not self._down and not self._closed

    def locked(self) -> bool:
        """True if an admission would wait (or fail) rather than be admitted at once."""
        return self.available <= 0 or bool(self._waiting)

    def __repr__(self) -> str:
        name = f" {self._component}/{self._limit_name}" if self._limit_name else ""
        return (
            f"<{type(self).__name__}{name} key={self._key!r} limit={self._limit} "
            f"active={self.active} queue_depth={len(self._waiting)}>"
        )

    # --- admission -------------------------------------------------------------------

    def try_acquire(self) -> bool:
        """Always False: a shared slot needs a round trip to Redis, so every admission goes
        through `enqueue()` (which never admits beyond the global limit)."""
        return False

    def enqueue(self) -> asyncio.Future[Admission]:
        """Join the global queue: the future ends "admitted" (the slot is held), "timeout",
        "shed" (the global queue was full) or "unavailable" (Redis could not be reached and
        the mode is "refuse"). Never raises."""
        loop = asyncio.get_running_loop() if self._closed else self._bind()
        future: asyncio.Future[Admission] = loop.create_future()
        if self._down or self._closed:
            waiter = self._add(_Waiter(None, future), loop)
            self._unreachable(waiter)
            return future
        waiter = self._add(_Waiter(f"{self._proc}:{next(self._counter)}", future), loop)
        self._unsent.append(waiter)
        if not self._registering:
            self._registering = True
            self._spawn(self._register())
        return future

    def leave(self, waiter: asyncio.Future[Admission], *, cancelled: bool = True) -> None:
        """Give up waiting: counted as cancelled (unless `cancelled` is False: the request
        failed on its own) if the wait had not ended otherwise; a slot handed to `waiter` in
        that same moment passes on to the next waiter, never lost."""
        counted = int(cancelled)
        entry = self._waiting.get(waiter)
        if entry is not None:
            self._end(entry)
            self._cancelled += counted
            if not waiter.done():
                waiter.cancel()
            self._abandon(entry)
        elif waiter.cancelled():  # its task was cancelled while awaiting it, still queued
            self._cancelled += counted
        elif waiter.result() == "admitted":
            self._cancelled += counted
            self.release()

    def release(self) -> None:
        """Give a slot of this process back (a fallback slot first, else one of its leases,
        which Redis hands to the longest waiter). Raises ValueError if none is held."""
        fallback = self._fallback
        if fallback is not None and fallback.active > 0:
            fallback.release()
            return
        if not self._held:
            raise ValueError(f"{self._describe()} released with no slot held")
        lease, _ = self._held.popitem()
        if not self._closed:
            self._remove(lease)

    def resize(self, limit: int) -> None:
        """Set the global number of slots (in Redis: every process sees it). Growing hands
        the new slots to waiters at once in FIFO order; shrinking never revokes a held slot.
        Applied as soon as Redis answers (again)."""
        _check_count("limit", limit)
        self._limit = limit
        self._pending_size = (limit, "resize")
        if self._loop is not None and not self._closed:
            self._spawn(self._apply_size())

    async def acquire(self) -> Literal[True]:
        """Take a slot, waiting in FIFO order; raises TimeoutError, QueueFullError,
        LimitUnavailableError, or cancels (leaving the queue)."""
        result = await wait_in_queue(self)
        if result == "admitted":
            return True
        if result == "shed":
            raise QueueFullError(
                f"{self._describe()}: the global queue is full (max_queue={self._max_queue})"
            )
        if result == "unavailable":
            raise LimitUnavailableError(f"{self._describe()}: Redis cannot be reached")
        raise TimeoutError(f"{self._describe()}: no slot within {self._timeout} s")

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    # --- lifecycle -------------------------------------------------------------------

    async def connect(self) -> bool:
        """Start the heartbeat and the mailbox (done by the first admission anyway) and set
        the configured size; True if Redis answered. Never raises for an unreachable Redis."""
        if self._closed:
            return False
        self._bind()
        await self._apply_size()
        await self._sync()
        return not self._down

    async def close(self) -> None:
        """Stop the heartbeat, end this process's waiters "unavailable", remove its leases
        and waiters from Redis, and close the connections. Later admissions are refused
        "unavailable" (or go to the local fallback)."""
        if self._closed:
            return
        self._closed = True
        if self._loop is None:
            return
        for task in self._tasks:
            task.cancel()
        await asyncio.wait(self._tasks)  # (they also stop on their own once closed)
        self._tasks = []
        ids = list(self._held) + [i for i, w in self._ids.items() if w.registered]
        for waiter in list(self._waiting.values()):
            self._end(waiter)
            if waiter.fallback is not None and self._fallback is not None:
                self._fallback.leave(waiter.fallback)
            if not waiter.future.done():
                self._unavailable += 1
                waiter.future.set_result("unavailable")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CLOSE_SECONDS):
                while self._background:  # registrations in flight remove what they made
                    await asyncio.gather(*self._background, return_exceptions=True)
        ids += [*self._dropping, *self._deferred, *self._unremoved]
        if ids and not self._down:
            with contextlib.suppress(*self._failures):
                await self._call("remove", ids)
        for client in (self._client, self._mailbox_client):
            with contextlib.suppress(Exception):
                await client.aclose()
        self._client = self._mailbox_client = None

    aclose = close  # for contextlib.aclosing()

    # --- local waiters ---------------------------------------------------------------

    def _add(self, waiter: _Waiter, loop: asyncio.AbstractEventLoop) -> _Waiter:
        self._waiting[waiter.future] = waiter
        if waiter.id is not None:
            self._ids[waiter.id] = waiter
        if self._timeout is not None:
            waiter.timer = loop.call_later(self._timeout, self._expire, waiter)
        return waiter

    def _end(self, waiter: _Waiter) -> None:
        """Forget `waiter` locally (it was admitted, refused, timed out or left)."""
        self._waiting.pop(waiter.future, None)
        if waiter.id is not None:
            self._ids.pop(waiter.id, None)
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None

    def _current(self, waiter: _Waiter) -> bool:
        return self._waiting.get(waiter.future) is waiter

    def _abandon(self, waiter: _Waiter) -> None:
        """Undo what `waiter` holds or queues elsewhere, now that it has ended here."""
        if waiter.fallback is not None:
            if self._fallback is not None:
                self._fallback.leave(waiter.fallback)  # passes on a slot it was just handed
        elif waiter.id is not None and waiter.registered:
            self._remove(waiter.id)
        # not answered yet: _registered() removes what Redis made for it

    def _expire(self, waiter: _Waiter) -> None:
        waiter.timer = None
        if not self._current(waiter):
            return
        self._end(waiter)
        if not waiter.future.done():  # else cancelled with its task, counted when it leaves
            self._timeouts += 1
            waiter.future.set_result("timeout")
        self._abandon(waiter)

    def _admit(self, waiter: _Waiter, lease: str) -> None:
        self._end(waiter)
        self._held[lease] = None
        waiter.future.set_result("admitted")

    def _granted(self, lease: str) -> None:
        """Redis handed `lease` (a waiter's id) a slot: admit its waiter, or pass it on."""
        waiter = self._ids.get(lease)
        if waiter is None:
            if lease not in self._held:  # it ended here already: give the slot back
                self._remove(lease)
            return
        if waiter.future.done():  # cancelled with its task: counted when it leaves
            self._end(waiter)
            if waiter.registered:
                self._remove(lease)
            return
        self._admit(waiter, lease)

    def _unreachable(self, waiter: _Waiter) -> None:
        """End `waiter` as "unavailable", or admit it through the local fallback."""
        self._unavailable += 1
        fallback = self._fallback
        if fallback is None or self._mode == "refuse":
            self._end(waiter)
            waiter.future.set_result("unavailable")
            return
        if fallback.try_acquire():
            self._end(waiter)
            waiter.future.set_result("admitted")
            return
        inner = fallback.enqueue()
        if inner.done():  # the local queue is full too
            self._end(waiter)
            self._shed += 1
            waiter.future.set_result("shed")
            return
        waiter.fallback = inner
        inner.add_done_callback(lambda _: self._fallback_admitted(waiter))

    def _fallback_admitted(self, waiter: _Waiter) -> None:
        inner = waiter.fallback
        if not self._current(waiter) or inner is None:
            return  # it ended here (timeout, leave, close), which left the fallback
        self._end(waiter)
        if waiter.future.done() or inner.cancelled():  # cancelled with its task
            if self._fallback is not None:
                self._fallback.leave(inner)
            return
        waiter.future.set_result("admitted")

    # --- Redis -----------------------------------------------------------------------

    def _bind(self) -> asyncio.AbstractEventLoop:
        """The running loop; on first use (or in a forked child) connect and start tasks."""
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._pid == os.getpid():
            return loop
        if self._loop is not None and self._pid == os.getpid() and not self._loop.is_closed():
            raise RuntimeError(f"{self._describe()} is in use on another event loop")
        self._start(loop)
        return loop

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        import redis.asyncio as aioredis  # the [redis] extra, only when a limit connects
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import RedisError

        self._loop = loop
        self._pid = os.getpid()
        self._proc = uuid.uuid4().hex  # this process's part of every id: never reused
        self._counter = itertools.count(1)
        self._held.clear()
        self._waiting.clear()
        self._ids.clear()
        self._unsent.clear()
        self._registering = False
        self._unremoved.clear()
        self._removing = False
        self._failures = (RedisError, OSError, TimeoutError)
        common: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": self._redis_timeout,
            "retry": Retry(NoBackoff(), 1),  # one reconnect for a stale pooled connection
        }
        pool = aioredis.BlockingConnectionPool.from_url(
            self._redis_url,
            max_connections=self._max_connections,
            socket_timeout=self._redis_timeout,
            **common,
        )
        self._client = aioredis.Redis(connection_pool=pool)
        self._mailbox_client = aioredis.Redis.from_url(
            self._redis_url,
            socket_timeout=_RECHECK_SECONDS + self._redis_timeout,
            **common,
        )
        self._scripts = {
            "acquire": self._client.register_script(shared_scripts.ACQUIRE),
            "remove": self._client.register_script(shared_scripts.REMOVE),
            "sync": self._client.register_script(shared_scripts.SYNC),
            "configure": self._client.register_script(shared_scripts.CONFIGURE),
        }
        self._size_lock = asyncio.Lock()
        self._tasks = [
            loop.create_task(self._heartbeat(), name=f"{self._describe()} heartbeat"),
            loop.create_task(self._mailbox(), name=f"{self._describe()} mailbox"),
        ]

    async def _call(self, script: str, args: list[Any]) -> list[Any]:
        head = [
            self._mbox_prefix,
            self._lease_ms,
            self._limit,
            "1" if self._contacted else "0",
            self._grace_ms,
        ]
        async with asyncio.timeout(self._redis_timeout):
            reply: list[Any] = await self._scripts[script](keys=self._keys, args=head + args)
        self._contacted = True
        stamp = int(reply[4])
        if stamp >= self._stamp or stamp < self._stamp - 1_000_000:  # (a clock stepped back)
            self._stamp = stamp
            limit, self._global_held, self._global_queued = (int(v) for v in reply[1:4])
            if self._pending_size is None or self._pending_size[1] != "resize":
                self._limit = limit  # (else this process's resize, not yet applied, wins)
            expiry = int(reply[5])
            self._next_expiry = (
                time.monotonic() + expiry / 1000 + _EXPIRY_MARGIN if expiry >= 0 else math.inf
            )
        if self._down:
            self._down = False
            self._sync_now = True
            _log.warning("gym_concurrency: %s reaches Redis again", self._describe())
        return reply

    def _failed(self, what: str, error: BaseException) -> None:
        if not self._down:
            self._down = True
            _log.warning(
                "gym_concurrency: %s cannot reach Redis (%s: %r); admissions are %s until "
                "it answers again",
                self._describe(),
                what,
                error,
                "refused" if self._mode == "refuse" else "admitted through the local fallback",
            )
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        unexpected = isinstance(error, RedisError) and not isinstance(
            error, RedisConnectionError | RedisTimeoutError
        )
        if unexpected and what not in self._failed_before:  # a script error: a bug, say so
            self._failed_before.add(what)
            _log.error("gym_concurrency: %s: %s failed", self._describe(), what, exc_info=error)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _register(self) -> None:
        """Send waiters to Redis in this process's arrival order, a batch at a time, so that
        their tickets keep that order (pooled connections would not)."""
        try:
            while self._unsent:
                batch = self._unsent[:_BATCH]
                del self._unsent[:_BATCH]
                waiters = []
                for waiter in batch:
                    if not self._current(waiter):
                        continue  # ended before it was sent: nothing to undo
                    if waiter.future.done():  # cancelled with its task: counted when it leaves
                        self._end(waiter)
                    elif self._down or self._closed:
                        self._unsent_unreachable(waiter)
                    else:
                        waiters.append(waiter)
                if waiters:
                    await self._register_batch(waiters)
        finally:
            self._registering = False

    async def _register_batch(self, waiters: list[_Waiter]) -> None:
        ids = [w.id for w in waiters if w.id is not None]
        max_queue = -1 if self._max_queue is None else self._max_queue
        try:
            reply = await self._call("acquire", [max_queue, *ids])
        except self._failures as error:
            self._failed("acquire", error)
            self._dropping.update(ids)  # they may have run: removed once Redis answers
            for waiter in waiters:
                if self._current(waiter):
                    self._unsent_unreachable(waiter)
            return
        for waiter, status in zip(waiters, reply[6], strict=True):
            self._registered(waiter, int(status))

    def _unsent_unreachable(self, waiter: _Waiter) -> None:
        if waiter.id is not None:
            self._ids.pop(waiter.id, None)
            waiter.id = None
        if waiter.future.done():  # cancelled with its task: counted when it leaves
            self._end(waiter)
        else:
            self._unreachable(waiter)

    def _registered(self, waiter: _Waiter, status: int) -> None:
        """Redis answered for `waiter`: 1 admitted, 2 shed, 0 queued (a notification or the
        re-check admits it later)."""
        lease = waiter.id
        assert lease is not None
        waiter.registered = True
        if not self._current(waiter) or waiter.future.done():
            # It ended meanwhile (timeout, leave, cancel), or a notification was first.
            if lease not in self._held:
                self._end(waiter)
                if status != 2:
                    self._remove(lease)
            return
        if status == 1:
            self._admit(waiter, lease)
        elif status == 2:
            self._end(waiter)
            self._shed += 1
            waiter.future.set_result("shed")

    def _remove(self, lease: str) -> None:
        """Remove `lease` (a lease or a waiter) from Redis, passing its slot on."""
        if self._client is None:
            return
        if lease in self._inflight:  # the sync in flight names it: remove it after that
            self._deferred.append(lease)
            return
        self._unremoved.append(lease)
        if not self._removing:
            self._removing = True
            self._spawn(self._remove_pending())

    async def _remove_pending(self) -> None:
        """Remove what was given back, a batch per script call (one call in flight)."""
        try:
            while self._unremoved:
                ids = self._unremoved[:_BATCH]
                del self._unremoved[:_BATCH]
                if self._down:  # the heartbeat removes them once Redis answers again
                    self._dropping.update(ids)
                    continue
                try:
                    await self._call("remove", ids)
                except self._failures as error:
                    self._failed("remove", error)
                    self._dropping.update(ids)
        finally:
            self._removing = False

    async def _apply_size(self) -> None:
        assert self._size_lock is not None
        async with self._size_lock:
            pending = self._pending_size
            if pending is None:
                return
            try:
                await self._call("configure", list(pending))
            except self._failures as error:
                self._failed("resize", error)
                return
            if self._pending_size == pending:
                self._pending_size = None

    async def _sync(self, full: bool = True) -> None:
        """Renew this process's leases and waiters, drop what must go, learn of grants whose
        notification was lost, re-register what Redis lost. A re-check (not `full`) names only
        this process's oldest waiters, the first to be handed a slot (FIFO): it costs the same
        with ten waiters or ten thousand."""
        held = list(self._held) if full else []
        registered = (i for i, w in self._ids.items() if w.registered)
        queued = list(registered if full else itertools.islice(registered, _RECHECK_WAITERS))
        drops = list(self._dropping)
        self._inflight = {*held, *queued}
        try:
            reply = await self._call("sync", [len(held), *held, len(queued), *queued, *drops])
        except self._failures as error:
            self._failed("heartbeat", error)
            return
        finally:
            self._inflight = set()
            deferred, self._deferred = self._deferred, []
            for lease in deferred:
                self._remove(lease)
        self._dropping.difference_update(drops)
        granted, reclaimed, requeued = reply[6], reply[7], reply[8]
        for lease in granted:
            self._granted(lease)
        if reclaimed or requeued:
            _log.warning(
                "gym_concurrency: %s: Redis had lost %d leases and %d waiters of this "
                "process; re-registered them",
                self._describe(),
                len(reclaimed),
                len(requeued),
            )

    async def _heartbeat(self) -> None:
        """The one heartbeat of this limit in this process: every `lease_seconds / 3`; while
        waiters queue also every second (the re-check) and when a lease is due to expire;
        every 0.25 s while Redis is away."""
        period = self._lease_seconds / 3
        recheck = min(period, _RECHECK_SECONDS)
        last = last_full = -math.inf
        while not self._closed:  # (a cancel swallowed inside a client call ends it too)
            try:
                now = time.monotonic()
                full = self._down or self._sync_now or now >= last_full + period
                if full or now >= self._recheck_due(last, recheck):
                    last = now
                    if full:
                        last_full = now
                        self._sync_now = False
                        if self._pending_size is not None:
                            await self._apply_size()
                    await self._sync(full)
            except Exception:  # the heartbeat must outlive anything
                _log.exception("gym_concurrency: %s: heartbeat failed", self._describe())
            if self._down:
                pause = _PROBE_SECONDS
            else:  # short naps (no Redis call): waiters that arrive meanwhile are seen soon
                due = min(last_full + period, self._recheck_due(last, recheck))
                pause = min(_TICK_SECONDS, due - time.monotonic())
            await asyncio.sleep(max(0.0, pause))

    def _recheck_due(self, last: float, recheck: float) -> float:
        """When waiters of this process should look for a lost notification or an expired
        lease (never, without waiters)."""
        if self._ids:
            return min(last + recheck, self._next_expiry)
        return math.inf

    async def _mailbox(self) -> None:
        """Wake this process's waiters: Redis pushes each lease it grants them to this
        process's list, read here with a blocking pop."""
        box = self._mbox_prefix + self._proc
        backoff = 0.05
        while not self._closed:
            try:
                item = await self._mailbox_client.blpop([box], timeout=_RECHECK_SECONDS)
            except Exception as error:  # Redis away: the heartbeat notices; try again soon
                _log.debug("gym_concurrency: %s: mailbox: %r", self._describe(), error)
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, _RECHECK_SECONDS)
                continue
            backoff = 0.05
            if item is not None:
                self._granted(item[1])

    def _describe(self) -> str:
        if self._limit_name is None:
            return f"SharedLimit {self._key!r}"
        if self._component is None:
            return f"shared limit {self._limit_name}"
        return f"shared limit {self._component}/{self._limit_name}"


def _check_count(name: str, value: object, *, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"SharedLimit {name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"SharedLimit {name} must be >= {minimum}, got {value}")


def _check_seconds(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"SharedLimit {name} must be a number of seconds, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"SharedLimit {name} must be > 0 and finite, got {value}")


def _check_url(url: object) -> None:
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(
            f"SharedLimit redis_url must be a redis://, rediss:// or unix:// URL, got {url!r}"
        )


def _check_name(name: str, value: object) -> None:
    if not isinstance(value, str) or not value or any(c in value for c in "{}"):
        raise ValueError(
            f"SharedLimit {name} must be a non-empty string without braces, got {value!r}"
        )


def _check_key(key: object, shared_key: object) -> None:
    if shared_key is None:
        raise ValueError("SharedLimit needs limit_name or key: the name every process shares")
    _check_name("key" if key is not None else "limit_name", shared_key)


def _check_mode(mode: object, local_max_concurrent: object) -> None:
    if mode not in get_args(RedisUnavailable):
        raise ValueError(f"SharedLimit redis_unavailable must be 'refuse' or 'local', got {mode!r}")
    if mode == "local":
        if local_max_concurrent is None:
            raise ValueError(
                "SharedLimit local_max_concurrent is required with redis_unavailable='local'"
            )
        _check_count("local_max_concurrent", local_max_concurrent)
    elif local_max_concurrent is not None:
        raise ValueError(
            "SharedLimit local_max_concurrent applies only with redis_unavailable='local', "
            f"got {local_max_concurrent!r} with redis_unavailable={mode!r}"
        )
