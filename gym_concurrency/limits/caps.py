"""Holders admitted at less weight than they asked for. A limit shrunk under a queued waiter
heavier than its new size (a reload, a `resize()`, an adaptive step) admits that waiter at the
size, once the size frees, rather than hold the queue behind it for ever. The holder still
releases what it asked for (nothing told it otherwise): its release gives back what it was
granted."""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["CappedHolds"]


class CappedHolds:
    """The grants below their ask still held, by (flow, weight asked): a release naming that
    ask gives back one of them. Holders of one ask are interchangeable here: whichever of them
    releases first, their releases give back what they were granted, together, and no
    release gives back more than its flow holds."""

    __slots__ = ("_grants",)

    def __init__(self) -> None:
        self._grants: dict[tuple[Hashable, int], list[int]] = {}

    def __bool__(self) -> bool:
        return bool(self._grants)

    def add(self, flow: Hashable, asked: int, granted: int) -> None:
        """A waiter of `flow` that asked `asked` was admitted at `granted` (less)."""
        self._grants.setdefault((flow, asked), []).append(granted)

    def release(self, flow: Hashable, asked: int) -> int:
        """The weight a release of `asked` in `flow` gives back: a capped grant of that ask
        (forgotten now), else `asked` itself."""
        grants = self._grants.get((flow, asked))
        if grants is None:
            return asked
        granted = grants.pop()
        if not grants:
            del self._grants[(flow, asked)]
        return granted
