"""One shared limit's Redis, as this process sees it: the scripts (answering the typed replies
of `_replies`), and the global state as last seen, written here and nowhere else.

Every script call carries the same head of arguments (see `scripts`) and answers the same
head of values; `RedisStore` keeps the newest answer's figures as plain numbers, so that
the observer and the status view read them without a Redis call. Admissions call the scripts
from the event loop; the heartbeat thread calls `sync` and `configure` with a blocking client
of its own (`*_blocking`), so that the state kept here is guarded by a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from ...safe_urls import safe_url
from ..limit import LimitConfigurationError
from . import scripts
from ._budget import SharedBudget
from ._connection import Connection, misconfiguration
from ._lane import ScriptLane
from ._replies import (
    AcquireReply,
    ConfigureReply,
    Reply,
    SyncReply,
    acquire_reply,
    common_reply,
    configure_reply,
    sync_reply,
)

__all__ = ["RECHECK_SECONDS", "PendingSize", "RedisStore"]

_log = logging.getLogger("gym_concurrency.limits.shared")

RECHECK_SECONDS: Final = 1.0  # the longest a lost notification can delay a waiter
_EXPIRY_MARGIN: Final = 0.005  # re-check this long after a lease is due to expire
_STAMP_STEP_BACK: Final = 1_000_000  # µs: an older stamp by more than this is a clock stepped back
_BUDGET_ARG: Final = 5  # where `_args` puts the budgets' argument

_R = TypeVar("_R", bound=Reply)


@dataclass(frozen=True, slots=True)
class PendingSize:
    """A size not yet written to Redis: this process's configured size at start, or a
    `resize()` (which, unlike a configured size, also overrides a size set at runtime)."""

    size: int
    kind: Literal["configure", "resize"]


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
        budget: SharedBudget | None = None,
    ) -> None:
        self.keys = [base_key + name for name in scripts.KEY_NAMES]
        self.engine_keys = [base_key + name for name in scripts.ENGINE_KEY_NAMES]
        self.budget = budget  # the rate budgets kept in Redis, with their figures as last seen
        self.mailbox_prefix = base_key + "mbox:"
        self.lease_ms = max(1, round(lease_seconds * 1000))
        self.limit = limit  # the global size as last seen (or as this process set it)
        self.held = 0  # weight held across all processes, as last seen
        self.queued = 0  # waiters queued across all processes, as last seen
        self.queued_weight = 0  # the weight they ask for, as last seen
        self.flows = 0  # flows with a waiter, as last seen
        self.next_expiry = math.inf  # (monotonic) when the next lease expires, as last seen
        self.state_missing = False  # a new connection found no state (a restart): renew now
        self.pending: PendingSize | None = PendingSize(limit, "configure")
        self.down = False  # Redis is known to be unreachable
        self.misconfigured: str | None = None  # why, once a misconfiguration fails the limit
        self.misconfiguration_seen: str | None = None  # the last call that failed said so
        self.failures: tuple[type[BaseException], ...] = (OSError, TimeoutError)
        self.proc = ""  # this process's id on the limit (set by start())
        self.redis_url = safe_url(redis_url)  # for messages
        # In a Redis Cluster every script also checks which node wrote the state (`id`): a
        # connection kept from before its node was promoted never sent CHECK_SERVER there.
        cluster = redis_url.startswith("redis+cluster://")
        self._cluster = "c" if cluster else ""
        self._connection = Connection(
            redis_url,
            redis_timeout=redis_timeout,
            max_connections=max_connections,
            check=_check_server(
                dict(zip(scripts.KEY_NAMES, self.keys, strict=True)), self.lease_ms, cluster
            ),
            on_state_missing=self._state_gone,
        )
        self._redis_timeout = redis_timeout
        self._fallback_note = fallback_note  # what admissions do while Redis is away
        self._describe = describe
        self._lock = threading.Lock()  # the figures, `down`: the loop and the heartbeat thread
        self._stamp = 0  # Redis's clock (µs) of the newest answer seen
        self._contacted = False  # Redis answered this process before
        self._client: Any = None
        self._mailbox_client: Any = None
        self._blocking: Any = None
        self._scripts: dict[str, Any] = {}
        self._lane: ScriptLane | None = None  # the event loop's script calls (made by start)
        self._blocking_scripts: dict[str, Any] = {}
        self._logged_errors: set[str] = set()
        self._eviction_checked = False  # the maxmemory-policy was looked at (once)

    @property
    def started(self) -> bool:
        """True once `start()` made the connections (and until `aclose()`)."""
        return self._client is not None

    @property
    def blocking_started(self) -> bool:
        """True while the heartbeat thread's client is open."""
        return self._blocking is not None

    def start(self, proc: str) -> None:
        """Make the connection pool, the mailbox's own connection and the scripts, for this
        process's id `proc`."""
        from redis.exceptions import RedisError

        self.proc = proc
        self._lock = threading.Lock()  # (new: a forked child must not inherit a held one)
        self.failures = (RedisError, OSError, TimeoutError)
        self._client = self._connection.admissions()
        self._mailbox_client = self._connection.mailbox(RECHECK_SECONDS)
        self._scripts = _register(self._client)
        self._lane = ScriptLane(self._client, self._scripts, self.keys)

    def start_blocking(self) -> Any:
        """Make a heartbeat thread's own blocking client and its scripts, used from now on;
        the client (the thread closes it as it ends)."""
        client = self._connection.blocking()
        self._blocking_scripts = _register(client)
        self._blocking = client
        return client

    # --- the scripts -----------------------------------------------------------------

    async def acquire(
        self, max_queue: int | None, ids: list[str], removals: list[str]
    ) -> AcquireReply:
        """Remove `removals` (as `remove`), then queue (or admit, or shed) waiters `ids`, in
        this order."""
        bound = -1 if max_queue is None else max_queue
        args = [bound, len(removals), *removals, *ids]
        return await self._call("acquire", args, acquire_reply)

    async def remove(self, ids: list[str]) -> Reply:
        """Remove leases given back and waiters that left; their slots pass on."""
        return await self._call("remove", ids, common_reply)

    async def leave(self, ids: list[str]) -> Reply:
        """This process closes: remove `ids`, leave the members, drop the mailbox."""
        return await self._call("leave", ids, common_reply)

    async def engine_size(self, args: list[Any]) -> Reply:
        """The engine's holder sizes the limit (`scripts.ENGINE_SIZE`; status 0: the engine
        lease is another's, nothing changed)."""
        keys = [*self.keys, *self.engine_keys]
        return await self._call("engine_size", args, common_reply, keys)

    async def configure(self, pending: PendingSize) -> ConfigureReply:
        """Write a configured size or a resize."""
        reply = await self._call("configure", [pending.size, pending.kind], configure_reply)
        return self._eviction_said(reply)

    def sync_blocking(self, held: list[str], queued: list[str], drops: list[str]) -> SyncReply:
        """Renew `held` and `queued`, drop `drops`; learn of grants and of what Redis lost
        (from the heartbeat thread)."""
        args = [len(held), *held, len(queued), *queued, *drops]
        return self._call_blocking("sync", args, sync_reply)

    def configure_blocking(self, pending: PendingSize) -> ConfigureReply:
        """`configure`, from the heartbeat thread."""
        reply = self._call_blocking("configure", [pending.size, pending.kind], configure_reply)
        return self._eviction_said(reply)

    def _eviction_said(self, reply: ConfigureReply) -> ConfigureReply:
        """Say once (the first size written, at start) if Redis may evict the limit's keys:
        each key lost starts a grace period in which this limit admits nothing."""
        if self._eviction_checked:
            return reply
        self._eviction_checked = True
        if reply.eviction.startswith("allkeys-"):
            _log.warning(
                "gym_concurrency: %s: Redis at %s has maxmemory-policy %s: under memory "
                "pressure it may evict this limit's keys, and each key lost stops admissions "
                "for up to lease_seconds while holders re-register; use noeviction (or a "
                "Redis of the limit's own); see docs/reliability.md",
                self._describe,
                self.redis_url,
                reply.eviction,
            )
        return reply

    async def next_grant(self, box: str) -> str | None:
        """The next lease granted to this process's mailbox `box`, waiting at most a re-check."""
        item = await self._mailbox_client.blpop([box], timeout=RECHECK_SECONDS)
        return None if item is None else str(item[1])

    async def beside(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run `script` of a part kept beside the limit's state (the engine's, on keys of its
        own) on the admissions' pool within redis_timeout: its raw reply. Raises as Redis and
        the client do; changes nothing this store knows."""
        assert self._lane is not None, "start() makes the lane"
        try:
            async with asyncio.timeout(self._redis_timeout):
                return await self._lane.call(script, args, keys)
        except self.failures:
            raise
        except Exception as error:
            raise _client_failed(error) from error

    def _args(self, args: list[Any]) -> list[Any]:
        contacted = "1" if self._contacted else "0"  # (a missing limit then means it was lost)
        contacted += self._cluster
        budget = "" if self.budget is None else self.budget.argument(not self.down)
        return [self.mailbox_prefix, self.lease_ms, self.limit, self.proc, contacted, budget, *args]

    def _give_back(self, sent: list[Any]) -> None:
        """A call sent with `sent` failed: the settlements and readings it carried go with a
        later call (Redis applies each batch once, if this one ran too)."""
        if self.budget is not None:
            self.budget.give_back(sent[_BUDGET_ARG])

    async def _call(
        self,
        script: str,
        args: list[Any],
        unpack: Callable[[list[Any]], _R],
        keys: list[str] | None = None,
    ) -> _R:
        assert self._lane is not None, "start() makes the lane"
        sent = self._args(args)
        try:
            async with asyncio.timeout(self._redis_timeout):
                raw: list[Any] = await self._lane.call(script, sent, keys)
        except BaseException as error:  # (a timeout, a cancellation: it may have run)
            self._give_back(sent)
            if isinstance(error, Exception) and not isinstance(error, self.failures):
                raise _client_failed(error) from error
            raise
        return self._answered(unpack(raw))

    def _call_blocking(self, script: str, args: list[Any], unpack: Callable[[list[Any]], _R]) -> _R:
        sent = self._args(args)
        try:
            raw: list[Any] = self._blocking_scripts[script](keys=self.keys, args=sent)
        except BaseException as error:
            self._give_back(sent)
            if isinstance(error, Exception) and not isinstance(error, self.failures):
                raise _client_failed(error) from error
            raise
        return self._answered(unpack(raw))

    def _state_gone(self) -> None:
        self.state_missing = True

    def _answered(self, answer: _R) -> _R:
        """Keep the newest answer's figures (an older one that arrives later is ignored);
        Redis answers: it is up. Returns `answer`."""
        with self._lock:
            self._contacted = True
            self.misconfiguration_seen = None
            if self.down:
                self.down = False
                _log.warning("gym_concurrency: %s reaches Redis again", self._describe)
            if answer.stamp < self._stamp and answer.stamp >= self._stamp - _STAMP_STEP_BACK:
                return answer
            self._stamp = answer.stamp
            if self.budget is not None:
                self.budget.seen(answer.budget)
            self.held, self.queued = answer.held, answer.queued
            self.queued_weight, self.flows = answer.queued_weight, answer.flows
            if self.pending is None or self.pending.kind != "resize":
                self.limit = answer.limit  # (else this process's resize, not yet applied, wins)
            self.next_expiry = (
                time.monotonic() + answer.expiry_ms / 1000 + _EXPIRY_MARGIN
                if answer.expiry_ms >= 0
                else math.inf
            )
        return answer

    # --- the size and the state's health ------------------------------------------------

    def resize(self, limit: int) -> None:
        """This process sets the global size: in force here at once, and over the sizes Redis
        answers until it is written (`pending`)."""
        self.limit = limit
        self.pending = PendingSize(limit, "resize")

    def sized(self, pending: PendingSize, reply: ConfigureReply) -> LimitConfigurationError | None:
        """The configure script answered for `pending`: written (pending no longer, unless a
        newer size is), or in conflict with the size live processes use: the error, and this
        limit misconfigured until a size is accepted."""
        if reply.status == scripts.CONFLICT:
            message = (
                f"{self._describe}: redis_url {self.redis_url}: this process is configured "
                f"with size {pending.size}, but processes that share the limit use size "
                f"{reply.limit}"
                + (f" (configured {reply.configured})" if reply.configured is not None else "")
                + ": change a shared limit's size with resize() (or a settings reload), or "
                "stop the processes with the other size first"
            )
            self.pending = None
            self.misconfigured = message
            return LimitConfigurationError(message)
        if self.pending == pending:
            self.pending = None
        if self.misconfigured is not None:  # a size conflict (nothing else gets an answer)
            _log.warning(
                "gym_concurrency: %s: size %d accepted: admitting again",
                self._describe,
                pending.size,
            )
            self.misconfigured = None
        return None

    def misconfigure(self, message: str) -> None:
        """A start failed on a misconfiguration: admissions are refused from now on."""
        self.misconfigured = message

    def restore_state(self) -> None:
        """A full renewal is sent: it restores the limit's state if Redis had lost it."""
        self.state_missing = False

    # --- failures and closing --------------------------------------------------------

    def failed(self, what: str, error: BaseException) -> None:
        """A call failed: Redis is down from now on (logged once); a misconfiguration or a
        script error is logged as an error, once per call site."""
        reason = misconfiguration(error)
        with self._lock:
            if not self.down:
                self.down = True
                _log.warning(
                    "gym_concurrency: %s cannot reach Redis at %s (%s: %r); admissions are "
                    "%s until it answers again",
                    self._describe,
                    self.redis_url,
                    what,
                    error,
                    self._fallback_note,
                )
            logged = what in self._logged_errors
            self._logged_errors.add(what)
        if reason is not None:
            self.misconfiguration_seen = self.explain(reason)
            if not logged:
                _log.error("gym_concurrency: %s", self.misconfiguration_seen)
            return
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        unexpected = isinstance(error, RedisError) and not isinstance(
            error, RedisConnectionError | RedisTimeoutError
        )
        if unexpected and not logged:  # a script error: a bug, say so
            _log.error("gym_concurrency: %s: %s failed", self._describe, what, exc_info=error)

    def explain(self, reason: str) -> str:
        """A misconfiguration's message: the limit, its Redis (no password), what is wrong."""
        return f"{self._describe}: redis_url {self.redis_url}: {reason}"

    def misconfigured_by(self, error: BaseException) -> LimitConfigurationError | None:
        """The error to fail a start with, if `error` (or the last failure, perhaps the
        heartbeat's) is a misconfiguration."""
        reason = misconfiguration(error)
        if reason is not None:
            return LimitConfigurationError(self.explain(reason))
        seen = self.misconfiguration_seen
        return None if seen is None else LimitConfigurationError(seen)

    async def aclose(self) -> None:
        """Close every connection (errors ignored: the process may be stopping)."""
        for client in (self._client, self._mailbox_client):
            with contextlib.suppress(Exception):  # closing is best effort
                await client.aclose()
        self._client = self._mailbox_client = None

    def close_blocking(self, client: Any) -> None:
        """Close `client`, a heartbeat thread's own (from that thread, as it ends); forgotten
        unless a newer thread (a new event loop's) made one since."""
        with contextlib.suppress(Exception):
            client.close()
        if self._blocking is client:
            self._blocking = None


def _client_failed(error: Exception) -> ConnectionError:
    """The failure a client's own error of a script call counts as. redis-py writing to a
    connection the peer reset can raise AttributeError (its `writelines` on a transport whose
    connection was lost, python/cpython#136234): a call that failed like any other, never an
    escape that strands waiters or skips the heartbeat's account of lost leases."""
    return ConnectionError(f"the Redis client failed: {error!r}")


def _check_server(keys: dict[str, str], lease_ms: int, cluster: bool) -> list[Any]:
    """`scripts.CHECK_SERVER`'s command, as every new connection sends it."""
    mode = "c" if cluster else ""
    return ["EVAL", scripts.CHECK_SERVER, 2, keys["limit"], keys["state"], lease_ms, mode]


def _register(client: Any) -> dict[str, Any]:
    return {
        "acquire": client.register_script(scripts.ACQUIRE),
        "remove": client.register_script(scripts.REMOVE),
        "leave": client.register_script(scripts.LEAVE),
        "sync": client.register_script(scripts.SYNC),
        "configure": client.register_script(scripts.CONFIGURE),
        "engine_turn": client.register_script(scripts.ENGINE_TURN),
        "engine_size": client.register_script(scripts.ENGINE_SIZE),
    }
