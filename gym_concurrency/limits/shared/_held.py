"""The slots one process holds of a shared limit, by lease id, with their total weight: the
weight rides in the id (`<proc>:<n>*<w>`, or `<proc>:<n>` for 1), as Redis reads it too."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["HeldLeases", "lease_id", "lease_weight", "total_weight"]


def lease_id(proc: str, number: int, weight: int) -> str:
    """The id of a waiter (and of its lease once admitted) asking for `weight`."""
    return f"{proc}:{number}" if weight == 1 else f"{proc}:{number}*{weight}"


def lease_weight(lease: str) -> int:
    """The weight `lease` holds (or asks for)."""
    _, star, weight = lease.rpartition("*")
    return int(weight) if star else 1


def total_weight(leases: Iterable[str]) -> int:
    """The weight `leases` hold together."""
    return sum(lease_weight(lease) for lease in leases)


class HeldLeases(dict[str, float]):
    """Lease id -> when Redis last confirmed it (monotonic), in the order taken; `weight` is
    their total. Written with `[]=` and `del` only (what keeps `weight` right)."""

    __slots__ = ("weight",)

    def __init__(self) -> None:
        super().__init__()
        self.weight = 0

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

    def to_release(self, weight: int, fallback: set[str], describe: str) -> str:
        """The slot of `weight` a release gives back: one of `fallback` (the local
        fallback's) first, else the lease taken last; ValueError naming `describe` if none."""
        fallen = (i for i in fallback if lease_weight(i) == weight)
        leases = (i for i in reversed(self) if lease_weight(i) == weight)
        lease = next(fallen, None) or next(leases, None)
        if lease is not None:
            return lease
        if weight == 1 and not self:
            raise ValueError(f"{describe} released with no slot held")
        raise ValueError(
            f"{describe} released weight {weight}, which no slot of this process holds "
            f"(it holds {self.weight} in {len(self)} slots)"
        )
