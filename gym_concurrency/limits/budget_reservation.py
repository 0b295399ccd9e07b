"""What an admission took of a rate budget: a reservation its caller closes exactly once
(settled from the call's usage, charged in full, or cancelled). `BudgetReservation` is the
shape every budget's reservation has (a RateBudget's in a process, a shared limit's in Redis);
`OwnedReservation` keeps whether it is closed and hands the closing to the budget that made
it; `Reservation` is a RateBudget's (rate_budget.py, their public home)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from ..usage import Usage
from ._budget_parts import BudgetName, MeteredBudget

__all__ = ["BudgetReservation", "OwnedReservation", "Reservation"]


class BudgetReservation(Protocol):
    """What a limit hands a caller with its slots, whatever keeps the budget (a RateBudget in
    the process: `Reservation`; Redis: a shared limit's): closed exactly once by the caller,
    with `settle(usage)`, `charge_in_full()` or `cancel()` (each raises ValueError if closed)."""

    @property
    def open(self) -> bool: ...
    def estimate(self, budget: BudgetName) -> int: ...
    def settle(self, usage: Usage | int) -> None: ...
    def charge_in_full(self) -> None: ...
    def cancel(self) -> None: ...


class _Closer(Protocol):
    """The budget that made a reservation: it closes it (and charges or refunds)."""

    def settle(self, reservation: Any, usage: Usage | int) -> None: ...
    def charge_in_full(self, reservation: Any) -> None: ...
    def cancel(self, reservation: Any) -> None: ...


class OwnedReservation:
    """An estimate on each budget (`requests`: 1) that the budget which made it closes
    exactly once: `settle`, `charge_in_full` or `cancel`, its own or its budget's (the same).
    It keeps whether it is closed; its budget asks it to close with `closed_by`."""

    __slots__ = ("_done", "_owner")

    def __init__(self, owner: _Closer) -> None:
        self._owner = owner
        self._done = False

    @property
    def open(self) -> bool:
        """Not settled, charged in full nor cancelled yet."""
        return not self._done

    def closed_by(self, owner: object, maker: str) -> None:
        """Closed now by `owner` (`maker` names it); ValueError if `owner` did not make it
        or it was closed already."""
        if self._owner is not owner:
            raise ValueError(f"{self!r} was not made by {maker}")
        if self._done:
            raise ValueError(f"{self!r} is already closed")
        self._done = True

    def named(self) -> Iterator[tuple[BudgetName, int]]:
        """Each budget's name and what this reservation took of it."""
        raise NotImplementedError

    def estimate(self, budget: BudgetName) -> int:
        """What this reservation took from `budget` (0: not configured)."""
        return next((amount for name, amount in self.named() if name == budget), 0)

    def settle(self, usage: Usage | int) -> None:
        """The budget's `settle(self, usage)`: the call used `usage`; the rest is refunded."""
        self._owner.settle(self, usage)

    def charge_in_full(self) -> None:
        """The budget's `charge_in_full(self)`: the call ended without usage."""
        self._owner.charge_in_full(self)

    def cancel(self) -> None:
        """The budget's `cancel(self)`: the call was never sent; all of it comes back."""
        self._owner.cancel(self)

    def __repr__(self) -> str:
        taken = ", ".join(f"{name}={amount}" for name, amount in self.named())
        return f"<{type(self).__name__} {taken}{'' if self.open else ' closed'}>"


class Reservation(OwnedReservation):
    """What one admission took from a RateBudget (an OwnedReservation): an estimate on each
    of its budgets, and when (`at`, on the budget's clock; `epoch`). A BudgetReservation."""

    __slots__ = ("at", "epoch", "estimates")

    def __init__(
        self,
        owner: _Closer,
        estimates: tuple[tuple[MeteredBudget, int], ...],
        at: float,
        epoch: int,
    ) -> None:
        super().__init__(owner)
        self.estimates = estimates
        self.at = at  # when it was charged (in that second), on the budget's clock
        self.epoch = epoch

    def named(self) -> Iterator[tuple[BudgetName, int]]:
        return ((budget.name, amount) for budget, amount in self.estimates)
