"""A sliding RateBudget's allowance for the rest of the current second: what calls charged in
full may take without asking the budget's meters, and what they took.

Within one second a sliding window's room only shrinks by the charges made in it (refunds and
the window moving on only add to it), so the room read during a second, less what was taken
since, holds until that second ends. The budget opens an allowance after a charge, while no
provider's word is in force (`open`), and before it reads or writes its meters again it charges
them what was taken, into the second the allowance was opened in (where every take it admitted
belongs), and closes it (`close`). A settlement within that second needs no close: a refund
only adds room, and an overrun charged in that second is taken off the allowance (`shrink`).

Two ways to take, both O(1), no loop:
- `take(tokens)`: any estimate; it reads the clock, and never takes once the second has ended.
- `take_one()`: an estimate of 1, the uncontended `async with` of a limit with a budget. It is
  next() of an iterator of as many True as it may take: a C call, no Python frame, no clock.
  So it takes only while a guard is armed: a timer on the running event loop that ends the
  allowance `GUARD_MARGIN` before its second does (the budget's `end`: charge and close). A
  loop running later than that may let ones through after the second ended; `late_ones(now)`
  counts them all as late then, and the budget charges those into the second of `now`: later
  than they were taken, so counted longer, never less. The budget lets `take_one` take at most
  a second's share of its minute an allowance (`open(ones=)`), so what a late guard, or one on
  a loop since closed that never fires, holds back for too long is that share at most. No
  loop running: no guard, no `take_one`. A `take` or an overrun (both within the second) count
  what `take_one` took as theirs and end it for the rest of the allowance. A limit hands freed
  slots to waiters charged in full by `take_one` as well, and gives back (`untake_one`) one it
  took for a waiter that turned out to be gone, or (`give_back_one`) one whose task was
  cancelled before it resumed, while the allowance it came from is still open.

`holds(tokens)` answers whether `take` would take them, taking nothing: a budget asked how long
a call waits answers 0 from it, and leaves it open.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import operator
from collections.abc import Callable, Iterator

from .rate_window import SLOT_SECONDS, WINDOW_SLOTS

__all__ = ["GUARD_MARGIN", "BudgetAllowance", "NoAllowance", "no_allowance"]

_COUNTED = WINDOW_SLOTS * SLOT_SECONDS  # a second's charges leave the window this long after it
# The guard ends the allowance this long before its second does, so that ones are late only when
# the loop runs later than this; `take` (which reads the clock) serves what is left of it.
GUARD_MARGIN = 0.02

_running_loop = asyncio._get_running_loop  # (in asyncio.events.__all__: None, not a raise)


class BudgetAllowance:
    """Tokens and requests a budget lets go until `until` on its clock without asking it."""

    __slots__ = (
        "_clock",
        "_end",
        "_guard",
        "_guarded_on",
        "_guarded_until",
        "_ones",
        "_ones_given",
        "_requests",
        "_tokens",
        "_until",
        "generation",
        "take_one",
        "taken_requests",
        "taken_tokens",
    )

    def __init__(self, clock: Callable[[], float], end: Callable[[], object]) -> None:
        self._clock = clock
        self._end = end  # the budget's: charge what was taken and close (the guard calls it)
        self._guard: asyncio.TimerHandle | None = None  # armed for `_guarded_on`, `_until`
        self._guarded_on: asyncio.AbstractEventLoop | None = None
        self._guarded_until = -math.inf
        self._until = -math.inf  # closed
        self._tokens = 0  # what may be taken in all since `open`
        self._requests = 0
        self.taken_tokens = 0  # what `take` took since `open`: the budget's to charge
        self.taken_requests = 0
        self.generation = 0  # one more at each `close`: what was taken before is charged
        # `take_one()`: `take(1)` while a guard is armed, without reading the clock (see the
        # module): next() of `_ones`, an iterator of `_ones_given` True, or `no_allowance`. A
        # C call, no Python frame: it is most of what an uncontended `async with` adds.
        self._ones: Iterator[bool] = _NO_ONES
        self._ones_given = 0
        self.take_one: Callable[[], bool] = no_allowance

    @property
    def ones(self) -> int:
        """Calls `take_one` took since `open` (a token and a request each), not yet `take`'s."""
        return self._ones_given - operator.length_hint(self._ones)

    def take(self, tokens: int) -> bool:
        """Take `tokens` and one request if the allowance holds them now (True); False: nothing
        taken (also for `tokens` < 0), ask the budget. `take_one` takes no more after it."""
        taken = self.taken_tokens + tokens  # (two writes, not four: a hot path too)
        if taken > self._tokens or self.taken_requests >= self._requests or tokens < 0:
            return False
        if self._clock() >= self._until:
            return False
        if self.take_one is not no_allowance:  # (its ones are this second's: the clock says)
            self._count_ones_as_taken()
            return self.take(tokens)
        self.taken_tokens = taken
        self.taken_requests += 1
        return True

    def holds(self, tokens: int) -> bool:
        """True if `take(tokens)` would take them now; nothing taken (it reads the clock)."""
        ones = self.ones
        room = self.taken_tokens + ones + tokens <= self._tokens
        if not room or self.taken_requests + ones >= self._requests or tokens < 0:
            return False
        return self._clock() < self._until

    def open(self, tokens: int, requests: int, until: float, now: float, ones: int) -> None:
        """Allow `tokens` of every token budget and `requests` requests until `until` (the
        budget's clock, read `now`), with nothing taken yet (after `close`); up to `ones` of
        them to `take_one` if a guard can be armed on the running loop."""
        self._tokens = tokens
        self._requests = requests
        self._until = until
        if self._arm(now):  # a token and a request each
            self._ones_given = min(tokens, requests, ones)
            self._ones = itertools.repeat(True, self._ones_given)
            self.take_one = functools.partial(next, self._ones, False)

    def untake_one(self) -> None:
        """Give back the call `take_one` took last, unused: only in the same synchronous stretch
        (no `close` or `open` since). It is not taken again."""
        if self.ones > 0:
            self._ones_given -= 1

    def give_back_one(self, generation: int) -> None:
        """Give back a call `take_one` took in `generation` for a waiter that never used it,
        unless closed since (the budget has charged it then: counted, never less)."""
        if generation != self.generation:
            return
        if self.ones > 0:
            self._ones_given -= 1
        elif self.taken_requests > 0:  # counted as `take`'s since (an overrun, a `take`)
            self.taken_tokens -= 1
            self.taken_requests -= 1

    def close(self) -> None:
        """Allow nothing more and forget what was taken (the budget has charged it). An armed
        guard stays: an allowance opened again in the same second is guarded by it."""
        self.generation += 1
        self._until = -math.inf
        self._tokens = self._requests = 0
        self.taken_tokens = self.taken_requests = 0
        self._end_ones()

    def shrink(self, tokens: int) -> None:
        """Allow `tokens` fewer of every token budget: charged meanwhile (an overrun), within
        the allowance's second (`current()`)."""
        self._tokens -= tokens
        self._count_ones_as_taken()  # `take` serves the rest of the second

    def current(self) -> bool:
        """Open, and its second not ended yet: the budget's meters are still in it."""
        return self._clock() < self._until

    @property
    def is_open(self) -> bool:
        """True between `open` and `close` (whether or not its second has ended)."""
        return self._until > -math.inf

    def late_ones(self, now: float) -> int:
        """Of `ones`, how many may have been taken after the second ended, read at `now`: none
        before it ends, all of them after (the guard may have fired late)."""
        return self.ones if now >= self._until else 0

    def counted_at(self, now: float) -> tuple[int, int]:
        """What was taken (tokens, requests) and is still counted by a sliding window at `now`:
        `take`'s until its second has left the window, `take_one`'s until charged (it may be
        charged late). Reads only (an exporter's thread)."""
        ones = self.ones
        if now >= self._until + _COUNTED:
            return ones, ones
        return self.taken_tokens + ones, self.taken_requests + ones

    def _count_ones_as_taken(self) -> None:
        """Count what `take_one` took as `take`'s (taken in the allowance's second: the caller
        knows) and take no more that way."""
        ones = self.ones
        self.taken_tokens += ones
        self.taken_requests += ones
        self._end_ones()

    def _end_ones(self) -> None:
        self.take_one = no_allowance
        self._ones, self._ones_given = _NO_ONES, 0

    def _arm(self, now: float) -> bool:
        """A guard armed to end this second's allowance on the running loop (True), or none
        can be: no loop is running, or the second ends within `GUARD_MARGIN`."""
        delay = self._until - GUARD_MARGIN - now
        loop = _running_loop()
        if delay <= 0.0 or loop is None:
            return False
        guard = self._guard
        if guard is not None:
            if self._guarded_on is loop and self._guarded_until == self._until:
                return True  # armed for this second already (the allowance was opened again)
            guard.cancel()
        self._guard = loop.call_later(delay, self._fire, self._until)
        self._guarded_on, self._guarded_until = loop, self._until
        return True

    def _fire(self, until: float) -> None:
        self._guard = self._guarded_on = None
        self._guarded_until = -math.inf
        if self._until == until:  # still this second's allowance: the budget charges it
            self._end()


def no_allowance() -> bool:
    """`take_one` of an allowance closed, or not guarded: never, ask the budget."""
    return False


class NoAllowance:
    """The allowance of a limit that has none (no budget, or an engine that must be asked at
    every admission): `take_one` never takes, ask the upstream."""

    __slots__ = ()
    take_one = staticmethod(no_allowance)
    generation = 0

    def untake_one(self) -> None:
        """Nothing was taken."""

    def give_back_one(self, generation: int) -> None:
        """Nothing was taken."""


_NO_ONES: Iterator[bool] = itertools.repeat(True, 0)
