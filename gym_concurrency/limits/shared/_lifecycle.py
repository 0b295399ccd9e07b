"""A shared limit's life in one process: the event loop (and process) it runs on, started on
first use (again in a forked child or on a new loop), its mailbox task, `connect()` and
`close()`. It owns the loop, the process id, the tasks and the heartbeat; the other parts it
starts are the limit's (`_store`, `_state`, `_sync`, the engine it follows)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Final

from ..limit import LimitConfigurationError
from ._engine import FleetEngine
from ._loops import Heartbeat, mailbox
from ._process_state import ProcessState
from ._store import RedisStore

__all__ = ["Lifecycle"]

_CLOSE_SECONDS: Final = 2.0  # how long close() waits for in-flight Redis calls


class Lifecycle:
    """Starts, connects and closes the parts of one shared limit on the running loop."""

    def __init__(
        self,
        store: RedisStore,
        state: ProcessState,
        *,
        lease_seconds: float,
        describe: Callable[[], str],
        engine: FleetEngine | None = None,
    ) -> None:
        self._store = store
        self._engine = engine  # its turns run as a task of the limit's loop
        self._state = state
        self._sync = state.sync
        self.heartbeat = self._heartbeat = Heartbeat(
            store, state.sync, state, lease_seconds=lease_seconds, describe=describe()
        )
        self._lease_seconds = lease_seconds
        self._describe = describe
        self.loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self.tasks: list[asyncio.Task[None]] = []

    def bind(self) -> asyncio.AbstractEventLoop:
        """The running loop; on first use (or in a forked child) connect and start tasks."""
        loop = asyncio.get_running_loop()
        if self.loop is loop and self._pid == os.getpid():
            return loop
        if self.loop is not None and self._pid == os.getpid() and not self.loop.is_closed():
            raise RuntimeError(f"{self._describe()} is in use on another event loop")
        self._start(loop)
        return loop

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._heartbeat.end_previous()  # (a new event loop: the old one closed)
        self.loop = loop
        self._pid = os.getpid()
        proc = self._state.start()
        self._sync.start(loop)
        self._store.start(proc)
        self._heartbeat.start()
        describe = self._describe()
        box = self._store.mailbox_prefix + proc
        self.tasks = [
            loop.create_task(
                mailbox(self._store, self._sync, self._state, box, describe=describe),
                name=f"{describe} mailbox",
            ),
        ]
        if self._engine is not None:
            self.tasks.append(loop.create_task(self._engine.follow(), name=f"{describe} engine"))

    async def connect(self) -> bool:
        """Start (if not yet) and set the configured size; True if Redis answered. Raises
        LimitConfigurationError (closing) for a misconfiguration, never for an outage."""
        if self._state.closed:
            return False
        with self._sync.sizes.connecting():  # the size is applied here, its conflict raised once
            self.bind()
            error = await self._sync.sizes.apply()
            if error is not None and not isinstance(error, LimitConfigurationError):
                # The heartbeat's first call may say more (a TLS handshake that outlasted
                # this call's timeout, say): a misconfiguration, or an outage after all.
                await self._heartbeat.first_renewal(self._lease_seconds)
                error = self._store.misconfigured_by(error)
        if error is not None:
            self._store.misconfigure(str(error))
            await self.close()
            raise error
        return not self._store.down

    async def close(self) -> None:
        """Stop the heartbeat, end this process's waiters "unavailable", remove its leases
        and waiters from Redis, and close the connections."""
        if self._state.closed:
            return
        self._state.close()
        if self.loop is None:
            return
        for task in self.tasks:
            task.cancel()
        await asyncio.wait(self.tasks)  # (they also stop on their own once closed)
        self.tasks = []
        await self._heartbeat.join()
        ids = self._state.end_waiters()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CLOSE_SECONDS):
                # Registrations in flight remove what they made. (A task that is done may
                # still be in the set until its callback runs: waiting on it would not yield.)
                while pending := [t for t in self._sync.background if not t.done()]:
                    await asyncio.wait(pending)
        ids += self._sync.unsent_ids()
        if not self._store.down:
            with contextlib.suppress(*self._store.failures):
                await self._store.leave(ids)
        await self._store.aclose()
