"""One rate budget's use over the last minute: a sliding window of one-second slots.

A charge lands in the slot of the second it is made in (`slot_of(loop time)`) and is counted
until that slot leaves the window, `WINDOW_SLOTS + 1` slots later: between 60 and 61 seconds
after the charge, never sooner. The charges counted at any moment therefore cover at least the
last 60 seconds, so admitting only while `used + amount <= limit` never lets more than `limit`
through in any 60 s interval: every charge in such an interval was counted when its last
admission was checked. A refund is taken back from the slot it was charged in (while that slot
is still counted); an overrun is charged now, in the current slot.

Plain integers in a fixed ring of 61 slots: a charge, a refund or a read is O(1) (the slots
that left the window are cleared as time passes, each once); finding when an amount will fit
walks at most the 61 slots. No clock of its own: callers pass the time (the event loop's).
"""

from __future__ import annotations

import math

__all__ = ["SLOT_SECONDS", "WINDOW_SLOTS", "RateWindow", "slot_of", "slot_start"]

SLOT_SECONDS = 1.0
WINDOW_SLOTS = 60  # a minute of slots; one more is kept: the current, partly elapsed second
_KEPT = WINDOW_SLOTS + 1


def slot_of(at: float) -> int:
    """The slot of time `at` (seconds on the caller's clock)."""
    return math.floor(at / SLOT_SECONDS)


def slot_start(slot: int) -> float:
    """When `slot` begins: the first time whose slot it is."""
    return slot * SLOT_SECONDS


class RateWindow:
    """What one budget (`limit` a minute) has charged in the slots still counted.

    `advance(now)` moves the window to the slot of `now` (it never moves back); charges go
    into that slot; `used` is the sum of the counted slots, which an overrun may take past
    `limit` (a debt that the next admissions wait out)."""

    __slots__ = ("_newest", "_next_start", "_slots", "_used", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._slots = [0] * _KEPT
        self._used = 0
        self._newest: int | None = None  # the current slot; None before the first advance
        self._next_start = -math.inf  # when the slot after it begins

    @property
    def used(self) -> int:
        """The sum of the counted slots as of the last `advance()`."""
        return self._used

    def advance(self, now: float) -> None:
        """Make the slot of `now` the current one: every slot 61 or more before it is
        forgotten."""
        if now < self._next_start:  # still the current slot
            return
        slot, newest = slot_of(now), self._newest
        if newest is not None and slot <= newest:
            return
        if newest is None or slot - newest >= _KEPT:
            self._slots = [0] * _KEPT
            self._used = 0
        else:
            slots = self._slots
            for passed in range(newest + 1, slot + 1):  # the ring place each shares with one gone
                index = passed % _KEPT
                self._used -= slots[index]
                slots[index] = 0
        self._newest = slot
        self._next_start = slot_start(slot + 1)

    def resize(self, limit: int, now: float) -> None:
        """Admit up to `limit` a minute from now on; the charges counted stay counted."""
        self.limit = limit

    def charge(self, amount: int) -> None:
        """Charge `amount` in the current slot (after `advance()`)."""
        if self._newest is None:
            raise RuntimeError("RateWindow.charge() before advance()")
        self._slots[self._newest % _KEPT] += amount
        self._used += amount

    def refund(self, amount: int, charged_at: float) -> None:
        """Take `amount` back from the slot it was charged in at `charged_at`, if that slot is
        still counted (one already forgotten has nothing left to return)."""
        slot = slot_of(charged_at)
        if self._newest is not None and self._newest - WINDOW_SLOTS <= slot <= self._newest:
            self._slots[slot % _KEPT] -= amount
            self._used -= amount

    def remaining_at(self, now: float) -> int:
        """`limit` less what will be counted at `now` (no sooner than the last advance), with
        no charge in between; negative in debt. Reads only: safe from another thread."""
        newest = self._newest
        slot = slot_of(now)
        if newest is None or slot - newest >= _KEPT:
            return self.limit
        slots = self._slots
        leaving = range(newest + 1, max(newest, slot) + 1)
        return self.limit - self._used + sum(slots[passed % _KEPT] for passed in leaving)

    def fits_at(self, amount: int, now: float) -> float:
        """When `amount` (<= `limit`) more fits, from `now` (after `advance(now)`): `now` if it
        fits now, else the start of the slot in which enough of the oldest charges have left."""
        newest = self._newest
        if newest is None:
            raise RuntimeError("RateWindow.fits_at() before advance()")
        excess = self._used + amount - self.limit
        if excess <= 0:
            return now
        slots = self._slots
        for oldest in range(newest - WINDOW_SLOTS, newest + 1):
            excess -= slots[oldest % _KEPT]
            if excess <= 0:
                return slot_start(oldest + _KEPT)  # the slot in which `oldest` is not counted
        raise AssertionError("unreachable: every counted slot has left by newest + 61")
