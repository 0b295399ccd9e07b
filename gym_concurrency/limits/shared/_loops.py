"""The two background loops of a shared limit in one process: the heartbeat (renewals,
re-checks, sizes to write) and the mailbox (grants pushed by whoever freed a slot)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Final

from ._store import RECHECK_SECONDS, RedisStore

__all__ = ["heartbeat", "mailbox"]

_log = logging.getLogger("gym_concurrency.limits.shared")

_PROBE_SECONDS: Final = 0.25  # how often an unreachable Redis is tried again
_TICK_SECONDS: Final = 0.1  # the heartbeat's nap between looks at what is due (no Redis call)


async def heartbeat(
    store: RedisStore,
    *,
    period: float,
    sync: Callable[[bool], Awaitable[None]],
    apply_size: Callable[[], Awaitable[None]],
    recheck_due: Callable[[float, float], float],
    closed: Callable[[], bool],
    describe: str,
) -> None:
    """The one heartbeat of a limit in this process: a full `sync(True)` every `period`; while
    waiters queue also a re-check `sync(False)` every second and when a lease is due to expire
    (`recheck_due(last, recheck)`); every 0.25 s while Redis is away."""
    recheck = min(period, RECHECK_SECONDS)
    last = last_full = -math.inf
    while not closed():  # (a cancel swallowed inside a client call ends it too)
        try:
            now = time.monotonic()
            full = store.down or store.answered_again or now >= last_full + period
            if full or now >= recheck_due(last, recheck):
                last = now
                if full:
                    last_full = now
                    store.answered_again = False
                    if store.pending is not None:
                        await apply_size()
                await sync(full)
        except Exception:  # the heartbeat must outlive anything
            _log.exception("gym_concurrency: %s: heartbeat failed", describe)
        if store.down:
            pause = _PROBE_SECONDS
        else:  # short naps (no Redis call): waiters that arrive meanwhile are seen soon
            due = min(last_full + period, recheck_due(last, recheck))
            pause = min(_TICK_SECONDS, due - time.monotonic())
        await asyncio.sleep(max(0.0, pause))


async def mailbox(
    store: RedisStore,
    box: str,
    *,
    granted: Callable[[str], None],
    closed: Callable[[], bool],
    describe: str,
) -> None:
    """Wake this process's waiters: Redis pushes each lease it grants them to `box`, read
    here with a blocking pop and handed to `granted(lease)`."""
    backoff = 0.05
    while not closed():
        try:
            lease = await store.next_grant(box)
        except Exception as error:  # Redis away: the heartbeat notices; try again soon
            _log.debug("gym_concurrency: %s: mailbox: %r", describe, error)
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, RECHECK_SECONDS)
            continue
        backoff = 0.05
        if lease is not None:
            granted(lease)
