"""What a renewal of a shared limit that learned something says in the log: holders counted
again after Redis was away, leases and waiters Redis had lost (re-registered, over the limit
too), the local fallback's slots now leases in Redis."""

from __future__ import annotations

import logging

from ._replies import SyncReply

__all__ = ["log_renewal"]

_log = logging.getLogger("gym_concurrency.limits.shared")


def log_renewal(
    describe: str, reply: SyncReply, held: int, reclaimed: int, fresh: int, back: int
) -> None:
    """Log what the renewal `reply` learned: `held` slots of this process, `reclaimed` of
    them re-registered, `fresh` the fallback's, `back` if Redis is reached again."""
    if back:
        _log.warning(
            "gym_concurrency: %s reaches Redis again: its %d holders are counted again "
            "(%d of them re-registered) before anything else is granted here",
            describe,
            held,
            reclaimed,
        )
    elif reclaimed or reply.requeued:
        _log.warning(
            "gym_concurrency: %s: Redis had lost %d leases and %d waiters of this "
            "process; re-registered them%s",
            describe,
            reclaimed,
            len(reply.requeued),
            _over(reply),
        )
    if fresh:
        _log.warning(
            "gym_concurrency: %s: %d slots admitted by the local fallback while Redis was "
            "away are now leases in Redis",
            describe,
            fresh,
        )


def _over(reply: SyncReply) -> str:
    """What a renewal that re-registered leases over the limit says of it ("" if within)."""
    if reply.held <= reply.limit:
        return ""
    return (
        f" (over the limit: {reply.held} held for {reply.limit}, the work running here; "
        "nothing is granted until it drains)"
    )
