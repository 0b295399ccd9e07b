"""RetryBudget: retries allowed in proportion to the calls made, as in Finagle and Envoy.

Over the `window` seconds ending at any retry it grants (that retry included), retries <=
`ratio` x first attempts + `min_per_second` x `window`. When an upstream fails everything,
retries then add at most `ratio` to its load, plus a small floor that keeps probing it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

__all__ = ["BUDGET_WINDOW_SECONDS", "RetryBudget"]

BUDGET_WINDOW_SECONDS = 10.0


class RetryBudget:
    """Counts first attempts and granted retries by time over a sliding window; `try_retry()`
    grants a retry only within the bound. Holds one float per first attempt and per retry in
    the window (a few kB per 100 calls/s)."""

    __slots__ = ("_clock", "_firsts", "_floor", "_retries", "ratio", "window")

    def __init__(
        self,
        ratio: float,
        min_per_second: float,
        *,
        window: float = BUDGET_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ratio = ratio
        self.window = window
        self._floor = min_per_second * window
        self._clock = clock
        self._firsts: deque[float] = deque()
        self._retries: deque[float] = deque()

    def set_bound(self, ratio: float, min_per_second: float) -> None:
        """Change the bound (a reload); what the window has seen so far counts on."""
        self.ratio = ratio
        self._floor = min_per_second * self.window

    def first_attempt(self) -> None:
        """A call made its first attempt now (it earns `ratio` of a retry)."""
        self._firsts.append(self._clock())

    def try_retry(self) -> bool:
        """Grant a retry now if the window ending now stays within the bound (and count it)."""
        now = self._clock()
        self._forget(now)
        if len(self._retries) + 1 > self.ratio * len(self._firsts) + self._floor:
            return False
        self._retries.append(now)
        return True

    def retries_in_window(self) -> int:
        """Retries granted within the last `window` seconds."""
        self._forget(self._clock())
        return len(self._retries)

    def _forget(self, now: float) -> None:
        horizon = now - self.window
        for times in (self._firsts, self._retries):
            while times and times[0] <= horizon:
                times.popleft()
