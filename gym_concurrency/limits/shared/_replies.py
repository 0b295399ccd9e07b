"""What each script of a shared limit answers (`scripts`), typed, and unpacked here and
nowhere else: the common head every script answers first, then the script's own values."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "ADMITTED", "QUEUED", "SHED", "AcquireReply", "BudgetReading", "ConfigureReply", "Reply",
    "SyncReply", "acquire_reply", "common_reply", "configure_reply", "sync_reply",
]  # fmt: skip

# Per waiter id, in the acquire script's reply.
QUEUED: Final = 0
ADMITTED: Final = 1
SHED: Final = 2

_HEAD: Final = 9  # the common head's length: a script's own answers follow it


@dataclass(frozen=True, slots=True)
class BudgetReading:
    """The rate budgets as a script left them: the second it charges in (Redis's clock), the
    milliseconds the waiter chosen next waits for them (-1: none), and by budget code (`t`,
    `r`, `i`, `o`) what admission may take now and the provider's remaining in force."""

    second: int
    blocked_ms: int
    remaining: dict[str, int]
    reported: dict[str, int]


def _budget_reading(said: object) -> BudgetReading | None:
    if not said:
        return None
    data = json.loads(str(said))
    return BudgetReading(
        second=int(data["s"]),
        blocked_ms=int(data["b"]),
        remaining={code: int(v) for code, v in (data.get("r") or {}).items()},
        reported={code: int(v) for code, v in (data.get("p") or {}).items()},
    )


@dataclass(frozen=True, slots=True)
class Reply:
    """What every script answers: its status, the global size, the weight held and the
    waiters queued, Redis's clock (µs), the milliseconds until a lease may expire, a grace
    period ends or the waiter chosen next fits the budgets (-1: none), the weight queued, the
    flows with a waiter, and the rate budgets (None for a limit without)."""

    status: int
    limit: int
    held: int
    queued: int
    stamp: int
    expiry_ms: int
    queued_weight: int
    flows: int
    budget: BudgetReading | None


@dataclass(frozen=True, slots=True)
class AcquireReply(Reply):
    """The acquire script's answer: a status per waiter id sent (QUEUED, ADMITTED, SHED), and
    with budgets the milliseconds until each one's estimate alone fits them (else empty)."""

    statuses: tuple[int, ...]
    waits: tuple[int, ...]


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


def _head(raw: list[Any]) -> tuple[int, int, int, int, int, int, int, int, BudgetReading | None]:
    """The common head of a script's reply: status, limit, held, queued, stamp, expiry_ms,
    queued_weight, flows, budget."""
    status, limit, held, queued, stamp, expiry_ms, queued_weight, flows = (
        int(v) for v in raw[: _HEAD - 1]
    )
    budget = _budget_reading(raw[_HEAD - 1])
    return status, limit, held, queued, stamp, expiry_ms, queued_weight, flows, budget


def common_reply(raw: list[Any]) -> Reply:
    """The common head of any script's answer (REMOVE's and LEAVE's whole answer)."""
    return Reply(*_head(raw))


def acquire_reply(raw: list[Any]) -> AcquireReply:
    return AcquireReply(
        *_head(raw),
        statuses=tuple(int(s) for s in raw[_HEAD]),
        waits=tuple(int(w) for w in raw[_HEAD + 1]),
    )


def sync_reply(raw: list[Any]) -> SyncReply:
    granted, reclaimed, requeued = (tuple(ids) for ids in raw[_HEAD : _HEAD + 3])
    return SyncReply(*_head(raw), granted=granted, reclaimed=reclaimed, requeued=requeued)


def configure_reply(raw: list[Any]) -> ConfigureReply:
    configured, eviction = str(raw[_HEAD]), str(raw[_HEAD + 1])
    return ConfigureReply(
        *_head(raw), configured=int(configured) if configured else None, eviction=eviction
    )
