"""A sliding RateBudget's allowance for the rest of the current second: what calls charged in
full may take without asking the budget's meters, and what they took.

Within one second a sliding window's room only shrinks by the charges made in it (refunds and
the window moving on only add to it), so the room read during a second, less what was taken
since, holds until that second ends. The budget opens an allowance after a charge, while no
provider's word is in force (`open`), and before it reads or writes its meters again it charges
them what was taken, into the second the allowance was opened in (where every take it admitted
belongs), and closes it (`close`). A settlement within that second needs no close: a refund
only adds room, and an overrun charged in that second is taken off the allowance (`shrink`).
A take is O(1): a read of the clock, no loop and no other call. The uncontended `async with`
of a limit with a budget is this and its slot, nothing more (docs/performance.md, "An
allowance per second, and FIFO queues").
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .rate_window import SLOT_SECONDS, WINDOW_SLOTS

__all__ = ["BudgetAllowance", "no_allowance"]

_COUNTED = WINDOW_SLOTS * SLOT_SECONDS  # a second's charges leave the window this long after it


class BudgetAllowance:
    """Tokens and requests a budget lets go until `until` on its clock without asking it."""

    __slots__ = ("_clock", "_requests", "_tokens", "_until", "taken_requests", "taken_tokens")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._until = -math.inf  # closed
        self._tokens = 0  # what may be taken in all since `open`
        self._requests = 0
        self.taken_tokens = 0  # what was taken since `open`: the budget's to charge
        self.taken_requests = 0

    def take(self, tokens: int) -> bool:
        """Take `tokens` and one request if the allowance holds them now (True); False: nothing
        taken (also for `tokens` < 0), ask the budget."""
        taken = self.taken_tokens + tokens  # (two writes, not four: this is the hot path)
        if taken > self._tokens or self.taken_requests >= self._requests or tokens < 0:
            return False
        if self._clock() >= self._until:
            return False
        self.taken_tokens = taken
        self.taken_requests += 1
        return True

    def open(self, tokens: int, requests: int, until: float) -> None:
        """Allow `tokens` of every token budget and `requests` requests until `until` (the
        budget's clock), with nothing taken yet (after `close`)."""
        self._tokens = tokens
        self._requests = requests
        self._until = until

    def close(self) -> None:
        """Allow nothing more and forget what was taken (the budget has charged it)."""
        self._until = -math.inf
        self._tokens = self._requests = 0
        self.taken_tokens = self.taken_requests = 0

    def shrink(self, tokens: int) -> None:
        """Allow `tokens` fewer of every token budget: charged meanwhile (an overrun)."""
        self._tokens -= tokens

    def current(self) -> bool:
        """Open, and its second not ended yet: the budget's meters are still in it."""
        return self._clock() < self._until

    @property
    def is_open(self) -> bool:
        """True between `open` and `close` (whether or not its second has ended)."""
        return self._until > -math.inf

    def counted_at(self, now: float) -> tuple[int, int]:
        """What was taken (tokens, requests) and is still counted by a sliding window at `now`:
        nothing once the allowance's second has left it. Reads only (an exporter's thread)."""
        if now >= self._until + _COUNTED:
            return 0, 0
        return self.taken_tokens, self.taken_requests


def no_allowance(tokens: int) -> bool:
    """`BudgetAllowance.take` of a limit with no allowance (no budget, or an engine that must
    be asked at every admission): never, ask the upstream."""
    return False
