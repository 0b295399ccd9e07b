"""What each script of a shared limit answers (`scripts`), typed, and unpacked here and
nowhere else: the common head every script answers first, then the script's own values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "ADMITTED", "QUEUED", "SHED", "AcquireReply", "ConfigureReply", "Reply", "SyncReply",
    "acquire_reply", "common_reply", "configure_reply", "sync_reply",
]  # fmt: skip

# Per waiter id, in the acquire script's reply.
QUEUED: Final = 0
ADMITTED: Final = 1
SHED: Final = 2

_HEAD: Final = 8  # the common head's length: a script's own answers follow it


@dataclass(frozen=True, slots=True)
class Reply:
    """What every script answers: its status, the global size, the weight held and the
    waiters queued, Redis's clock (µs), the milliseconds until a lease may expire or a grace
    period ends (-1: none), the weight queued and the flows with a waiter."""

    status: int
    limit: int
    held: int
    queued: int
    stamp: int
    expiry_ms: int
    queued_weight: int
    flows: int


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
class ConfigureReply(Reply):
    """The configure script's answer: status `scripts.CONFLICT` if live processes use
    another size; `configured` is the size processes start with (None if none was set);
    `eviction` Redis's maxmemory-policy where a maxmemory is set ("" where none is)."""

    configured: int | None
    eviction: str


def _head(raw: list[Any]) -> tuple[int, int, int, int, int, int, int, int]:
    """The common head of a script's reply: status, limit, held, queued, stamp, expiry_ms,
    queued_weight, flows."""
    status, limit, held, queued, stamp, expiry_ms, queued_weight, flows = (
        int(v) for v in raw[:_HEAD]
    )
    return status, limit, held, queued, stamp, expiry_ms, queued_weight, flows


def common_reply(raw: list[Any]) -> Reply:
    """The common head of any script's answer (REMOVE's and LEAVE's whole answer)."""
    return Reply(*_head(raw))


def acquire_reply(raw: list[Any]) -> AcquireReply:
    return AcquireReply(*_head(raw), statuses=tuple(int(s) for s in raw[_HEAD]))


def sync_reply(raw: list[Any]) -> SyncReply:
    granted, reclaimed, requeued = (tuple(ids) for ids in raw[_HEAD : _HEAD + 3])
    return SyncReply(*_head(raw), granted=granted, reclaimed=reclaimed, requeued=requeued)


def configure_reply(raw: list[Any]) -> ConfigureReply:
    configured, eviction = str(raw[_HEAD]), str(raw[_HEAD + 1])
    return ConfigureReply(
        *_head(raw), configured=int(configured) if configured else None, eviction=eviction
    )
