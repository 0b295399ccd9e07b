"""Writing a shared limit's size to Redis: the configured size at connect, a resize later; a
size that live processes disagree with is a LimitConfigurationError, said once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from ._store import RedisStore

__all__ = ["Sizes"]

_log = logging.getLogger("gym_concurrency.limits.shared")


class Sizes:
    """Writes the store's pending size (configured, or a resize): `apply` on the event loop,
    or `after_renewal` on the heartbeat thread (holders are counted first), except while
    `connecting` (connect() applies the size and raises a conflict itself)."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._lock = asyncio.Lock()  # one write at a time on the event loop
        self._connecting = False

    def start(self) -> None:
        """A new event loop (or process): a lock of its own."""
        self._lock = asyncio.Lock()

    @contextlib.contextmanager
    def connecting(self) -> Iterator[None]:
        """While connect() writes the size, the heartbeat leaves it to connect()."""
        self._connecting = True
        try:
            yield
        finally:
            self._connecting = False

    async def apply(self) -> BaseException | None:
        """Write the pending size, if any; the error that kept it from Redis (a
        LimitConfigurationError if live processes use another size)."""
        store = self._store
        async with self._lock:
            pending = store.pending
            if pending is None:
                return None
            try:
                reply = await store.configure(pending)
            except store.failures as error:
                store.failed("resize", error)
                return error
            return store.sized(pending, reply)

    def after_renewal(self) -> None:
        """`apply`, from the heartbeat thread after a full renewal; a conflict is logged."""
        store = self._store
        pending = store.pending
        if pending is None or self._connecting:
            return
        try:
            reply = store.configure_blocking(pending)
        except store.failures as error:
            store.failed("resize", error)
            return
        conflict = store.sized(pending, reply)
        if conflict is not None:
            _log.error("gym_concurrency: %s", conflict)
