"""One shared limit's Redis, as this process sees it: the connections, the scripts, a typed
reply per script (unpacked here and nowhere else), and the global state as last seen.

Every script call carries the same head of arguments (see `scripts`) and answers the same
head of values; `RedisStore` keeps the newest answer's figures as plain numbers, so that
the observer and the status view read them without a Redis call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Final, Literal

from . import scripts

__all__ = ["AcquireReply", "PendingSize", "RedisStore", "Reply", "SyncReply"]

_log = logging.getLogger("gym_concurrency.limits.shared")

RECHECK_SECONDS: Final = 1.0  # the longest a lost notification can delay a waiter
_EXPIRY_MARGIN: Final = 0.005  # re-check this long after a lease is due to expire
_STAMP_STEP_BACK: Final = 1_000_000  # µs: an older stamp by more than this is a clock stepped back

# Per waiter id, in the acquire script's reply.
QUEUED: Final = 0
ADMITTED: Final = 1
SHED: Final = 2


@dataclass(frozen=True, slots=True)
class Reply:
    """What every script answers: the global size and counts, Redis's clock (µs) and the
    milliseconds until the next lease expires (-1: none)."""

    limit: int
    held: int
    queued: int
    stamp: int
    expiry_ms: int


@dataclass(frozen=True, slots=True)
class AcquireReply(Reply):
    """The acquire script's answer: a status per waiter id sent (QUEUED, ADMITTED, SHED)."""

    statuses: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SyncReply(Reply):
    """The sync script's answer: waiters of this process handed a slot, held leases Redis
    had lost (re-registered), waiters Redis had lost (re-queued at the back)."""

    granted: tuple[str, ...]
    reclaimed: tuple[str, ...]
    requeued: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PendingSize:
    """A size not yet written to Redis: this process's configured size at start, or a
    `resize()` (which, unlike a configured size, also overrides a size set at runtime)."""

    size: int
    kind: Literal["configure", "resize"]


def _head(raw: list[Any]) -> tuple[int, int, int, int, int]:
    """The common head of a script's reply: limit, held, queued, stamp, expiry_ms."""
    limit, held, queued, stamp, expiry_ms = (int(v) for v in raw[1:6])
    return limit, held, queued, stamp, expiry_ms


class RedisStore:
    """The Redis of one shared limit: scripts called with the common head of arguments, and
    the global state from their newest answer (`limit`, `held`, `queued`, `next_expiry`)."""

    def __init__(
        self,
        *,
        redis_url: str,
        base_key: str,
        lease_seconds: float,
        redis_timeout: float,
        max_connections: int,
        limit: int,
        fallback_note: str,
        describe: str,
    ) -> None:
        self.keys = [base_key + name for name in scripts.KEY_NAMES]
        self.mailbox_prefix = base_key + "mbox:"
        self.lease_ms = max(1, round(lease_seconds * 1000))
        self.limit = limit  # the global size as last seen (or as this process set it)
        self.held = 0  # leases held across all processes, as last seen
        self.queued = 0  # waiters queued across all processes, as last seen
        self.next_expiry = math.inf  # (monotonic) when the next lease expires, as last seen
        self.pending: PendingSize | None = PendingSize(limit, "configure")
        self.down = False  # Redis is known to be unreachable
        self.answered_again = False  # Redis answered after being down: renew at once
        self.failures: tuple[type[BaseException], ...] = (OSError, TimeoutError)
        self._redis_url = redis_url
        self._grace_ms = max(1, self.lease_ms // 2)
        self._redis_timeout = redis_timeout
        self._max_connections = max_connections
        self._fallback_note = fallback_note  # what admissions do while Redis is away
        self._describe = describe
        self._stamp = 0  # Redis's clock (µs) of the newest answer seen
        self._contacted = False
        self._client: Any = None
        self._mailbox_client: Any = None
        self._scripts: dict[str, Any] = {}
        self._logged_errors: set[str] = set()

    @property
    def started(self) -> bool:
        """True once `start()` made the connections (and until `aclose()`)."""
        return self._client is not None

    def start(self) -> None:
        """Make the connection pool, the mailbox's own connection and the scripts."""
        import redis.asyncio as aioredis  # the [redis] extra, only when a limit connects
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import RedisError

        self.failures = (RedisError, OSError, TimeoutError)
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
            self._redis_url, socket_timeout=RECHECK_SECONDS + self._redis_timeout, **common
        )
        self._scripts = {
            "acquire": self._client.register_script(scripts.ACQUIRE),
            "remove": self._client.register_script(scripts.REMOVE),
            "sync": self._client.register_script(scripts.SYNC),
            "configure": self._client.register_script(scripts.CONFIGURE),
        }

    # --- the scripts -----------------------------------------------------------------

    async def acquire(self, max_queue: int | None, ids: list[str]) -> AcquireReply:
        """Queue (or admit, or shed) waiters `ids`, in this order."""
        raw = await self._call("acquire", [-1 if max_queue is None else max_queue, *ids])
        return AcquireReply(*_head(raw), statuses=tuple(int(s) for s in raw[6]))

    async def remove(self, ids: list[str]) -> Reply:
        """Remove leases given back and waiters that left; their slots pass on."""
        return Reply(*_head(await self._call("remove", ids)))

    async def sync(self, held: list[str], queued: list[str], drops: list[str]) -> SyncReply:
        """Renew `held` and `queued`, drop `drops`; learn of grants and of what Redis lost."""
        raw = await self._call("sync", [len(held), *held, len(queued), *queued, *drops])
        return SyncReply(
            *_head(raw),
            granted=tuple(raw[6]),
            reclaimed=tuple(raw[7]),
            requeued=tuple(raw[8]),
        )

    async def configure(self, pending: PendingSize) -> Reply:
        """Write a configured size or a resize."""
        return Reply(*_head(await self._call("configure", [pending.size, pending.kind])))

    async def next_grant(self, box: str) -> str | None:
        """The next lease granted to this process's mailbox `box`, waiting at most a re-check."""
        item = await self._mailbox_client.blpop([box], timeout=RECHECK_SECONDS)
        return None if item is None else str(item[1])

    async def _call(self, script: str, args: list[Any]) -> list[Any]:
        contacted = "1" if self._contacted else "0"  # (a missing limit then means a restart)
        head = [self.mailbox_prefix, self.lease_ms, self.limit, contacted, self._grace_ms]
        async with asyncio.timeout(self._redis_timeout):
            raw: list[Any] = await self._scripts[script](keys=self.keys, args=head + args)
        self._contacted = True
        self._seen(Reply(*_head(raw)))
        if self.down:
            self.down = False
            self.answered_again = True
            _log.warning("gym_concurrency: %s reaches Redis again", self._describe)
        return raw

    def _seen(self, reply: Reply) -> None:
        """Keep the newest answer's figures (an older one that arrives later is ignored)."""
        if reply.stamp < self._stamp and reply.stamp >= self._stamp - _STAMP_STEP_BACK:
            return
        self._stamp = reply.stamp
        self.held, self.queued = reply.held, reply.queued
        if self.pending is None or self.pending.kind != "resize":
            self.limit = reply.limit  # (else this process's resize, not yet applied, wins)
        self.next_expiry = (
            time.monotonic() + reply.expiry_ms / 1000 + _EXPIRY_MARGIN
            if reply.expiry_ms >= 0
            else math.inf
        )

    # --- failures and closing --------------------------------------------------------

    def failed(self, what: str, error: BaseException) -> None:
        """A call failed: Redis is down from now on (logged once); a script error is a bug
        and is logged with its traceback, once per call site."""
        if not self.down:
            self.down = True
            _log.warning(
                "gym_concurrency: %s cannot reach Redis (%s: %r); admissions are %s until "
                "it answers again",
                self._describe,
                what,
                error,
                self._fallback_note,
            )
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        unexpected = isinstance(error, RedisError) and not isinstance(
            error, RedisConnectionError | RedisTimeoutError
        )
        if unexpected and what not in self._logged_errors:
            self._logged_errors.add(what)
            _log.error("gym_concurrency: %s: %s failed", self._describe, what, exc_info=error)

    async def aclose(self) -> None:
        """Close both connections (errors ignored: the process may be stopping)."""
        for client in (self._client, self._mailbox_client):
            with contextlib.suppress(Exception):  # closing is best effort
                await client.aclose()
        self._client = self._mailbox_client = None
