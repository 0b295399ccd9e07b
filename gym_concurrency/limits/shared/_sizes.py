"""Writing a shared limit's size to Redis: the configured size at connect, a resize later; a
size that live processes disagree with is a LimitConfigurationError, said once."""

from __future__ import annotations

import asyncio
import logging

from ..limit import LimitConfigurationError
from . import scripts
from ._store import ConfigureReply, PendingSize, RedisStore

__all__ = ["SizeSync"]

_log = logging.getLogger("gym_concurrency.limits.shared")


class SizeSync:
    """The size half of RedisSync (a mixin: RedisSync sets these fields): the pending size
    (configured, or a resize) is written by `apply_size` on the event loop, or after a renewal
    by `apply_size_blocking` on the heartbeat thread, unless `connecting` (connect() raises a
    conflict itself)."""

    _store: RedisStore
    _describe: str
    _size_lock: asyncio.Lock
    connecting: bool

    async def apply_size(self) -> BaseException | None:
        """Write the pending size (configured, or a resize), if any; the error that kept it
        from Redis (a LimitConfigurationError if live processes use another size)."""
        async with self._size_lock:
            pending = self._store.pending
            if pending is None:
                return None
            try:
                reply = await self._store.configure(pending)
            except self._store.failures as error:
                self._store.failed("resize", error)
                return error
            return self._sized(pending, reply)

    def apply_size_blocking(self) -> None:
        """`apply_size`, from the heartbeat thread (after its renewal: holders first)."""
        pending = self._store.pending
        if pending is None:
            return
        try:
            reply = self._store.configure_blocking(pending)
        except self._store.failures as error:
            self._store.failed("resize", error)
            return
        conflict = self._sized(pending, reply)
        if conflict is not None:
            _log.error("gym_concurrency: %s", conflict)

    def _sized(self, pending: PendingSize, reply: ConfigureReply) -> BaseException | None:
        store = self._store
        if reply.status == scripts.CONFLICT:
            message = (
                f"{self._describe}: redis_url {store.redis_url}: this process is configured "
                f"with size {pending.size}, but processes that share the limit use size "
                f"{reply.limit}"
                + (f" (configured {reply.configured})" if reply.configured is not None else "")
                + ": change a shared limit's size with resize() (or a settings reload), or "
                "stop the processes with the other size first"
            )
            store.pending = None
            store.misconfigured = message
            return LimitConfigurationError(message)
        if store.pending == pending:
            store.pending = None
        if store.misconfigured is not None:  # a size conflict (nothing else gets an answer)
            _log.warning(
                "gym_concurrency: %s: size %d accepted: admitting again",
                self._describe,
                pending.size,
            )
            store.misconfigured = None
        return None
