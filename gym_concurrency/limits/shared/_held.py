"""The slots one process holds of a shared limit, by lease id, with their total weight: the
weight and flow ride in the id (`<proc>:<n>`, then `.<t>` for an estimate of t tokens on a
limit with rate budgets, then `*<w>` for a weight w other than 1, then
`/<c>` for a lease granted less than its waiter asked (the limit shrank under it: it holds c),
then `@<flow>` for a flow other than the default), as Redis reads them too."""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = [
    "HeldLeases", "grant_handle", "lease_asked", "lease_flow", "lease_id", "lease_tokens",
    "lease_weight", "total_weight", "waiter_id",
]  # fmt: skip


def lease_id(
    proc: str, number: int, weight: int, flow: str | None = None, tokens: int | None = None
) -> str:
    """The id of a waiter (and of its lease once admitted) asking for `weight` in `flow`, and
    for an estimate of `tokens` from a limit's rate budgets (None: it has none)."""
    ident = f"{proc}:{number}" if tokens is None else f"{proc}:{number}.{tokens}"
    if weight != 1:
        ident = f"{ident}*{weight}"
    return ident if flow is None else f"{ident}@{flow}"


def lease_tokens(lease: str) -> int | None:
    """The estimate `lease` (or its waiter) carries for the rate budgets (None: none)."""
    head = lease.partition("@")[0].partition("*")[0].partition("/")[0]
    _, dot, tokens = head.partition(".")
    return int(tokens) if dot else None


def grant_handle(lease: str) -> str:
    """How the budgets name the waiter of `lease` (`<proc>:<n>`) where its grant was charged."""
    proc, _, rest = lease.partition(":")
    number = rest[: len(rest) - len(rest.lstrip("0123456789"))]
    return f"{proc}:{number}"


def lease_weight(lease: str) -> int:
    """The weight `lease` holds (or asks for)."""
    asked, slash, granted = lease.partition("@")[0].partition("/")
    if slash:
        return int(granted)
    _, star, weight = asked.partition("*")
    return int(weight) if star else 1


def lease_asked(lease: str) -> int:
    """The weight the waiter of `lease` asked for (what its holder releases)."""
    _, star, weight = lease.partition("@")[0].partition("/")[0].partition("*")
    return int(weight) if star else 1


def waiter_id(lease: str) -> str:
    """The id of the waiter `lease` was granted to (itself, unless granted less)."""
    head, at, flow = lease.partition("@")
    if "/" not in head:
        return lease
    return head.partition("/")[0] + at + flow


def lease_flow(lease: str) -> str | None:
    """The flow `lease` holds weight for (None: the default flow)."""
    _, at, flow = lease.partition("@")
    return flow if at else None


def total_weight(leases: Iterable[str]) -> int:
    """The weight `leases` hold together."""
    return sum(lease_weight(lease) for lease in leases)


class HeldLeases(dict[str, float]):
    """The one owner of what this process holds: lease id -> when Redis last confirmed it
    (monotonic), in the order taken; `weight` is their total, `fallback` the ids of the slots
    the local fallback admitted (Redis not told yet, or told since). Written with `[]=`,
    `hold_fallback()`, `give_back()` and `clear()` only (what keeps `weight` right); the
    heartbeat thread reads copies."""

    __slots__ = ("fallback", "weight")

    def __init__(self) -> None:
        super().__init__()
        self.weight = 0
        self.fallback: set[str] = set()

    def __setitem__(self, lease: str, confirmed: float) -> None:
        if lease not in self:
            self.weight += lease_weight(lease)
        super().__setitem__(lease, confirmed)

    def __delitem__(self, lease: str) -> None:
        super().__delitem__(lease)
        self.weight -= lease_weight(lease)

    def clear(self) -> None:
        super().clear()
        self.weight = 0
        self.fallback.clear()

    def hold_fallback(self, lease: str) -> None:
        """The local fallback admitted slot `lease` (never confirmed by Redis yet)."""
        self.fallback.add(lease)
        self[lease] = -math.inf

    @property
    def fallback_weight(self) -> int:
        return total_weight(self.fallback)

    def give_back(self, weight: int, flow: str | None, describe: str) -> tuple[str, bool]:
        """Forget the slot of `weight` in `flow` a release gives back: one of the local
        fallback's first, else the lease taken last; (its id, True if the fallback's).
        ValueError naming `describe` if none is held."""

        def fits(lease: str) -> bool:
            return lease_asked(lease) == weight and lease_flow(lease) == flow

        lease = next(filter(fits, self.fallback), None) or next(filter(fits, reversed(self)), None)
        if lease is not None:
            fallen = lease in self.fallback
            self.fallback.discard(lease)
            del self[lease]
            return lease, fallen
        if weight == 1 and flow is None and not self:
            raise ValueError(f"{describe} released with no slot held")
        in_flow = "" if flow is None else f" in flow {flow!r}"
        raise ValueError(
            f"{describe} released weight {weight}{in_flow}, which no slot of this process "
            f"holds (it holds {self.weight} in {len(self)} slots)"
        )
