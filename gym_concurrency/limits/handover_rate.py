"""The hand-over rate of a limit: how fast it gives slots back, and so how long a request
arriving now would wait; what an automatic Retry-After says, and whether a waiter's own
deadline can be met (deadlines.py). Plain arithmetic on the caller's clock."""

from __future__ import annotations

__all__ = ["HandoverRate"]


class HandoverRate:
    """How fast a limit gives slots back, in plain numbers: releases counted per whole second
    of the caller's clock, read as the rate over the last full second and the current one.

    `retry_after(queue_depth, now)`: the whole seconds until a request arriving now would get
    a slot (the queue ahead of it plus itself, at the measured rate), clamped to [low, high].
    """

    __slots__ = ("_count", "_previous", "_second", "high", "low")

    def __init__(self, low: int = 1, high: int = 60) -> None:
        if not 0 <= low <= high:
            raise ValueError(f"need 0 <= low <= high, got {low}, {high}")
        self.low = low
        self.high = high
        self._second = 0
        self._count = 0
        self._previous = 0

    def release(self, now: float, count: int = 1) -> None:
        """Count `count` releases (slots, or weight) at time `now` (seconds)."""
        second = int(now)
        if second != self._second:
            self._roll(second)
        self._count += count

    def _roll(self, second: int) -> None:
        self._previous = self._count if second == self._second + 1 else 0
        self._second = second
        self._count = 0

    def per_second(self, now: float) -> float:
        """Releases per second over the last full second and the part of this one gone by."""
        second = int(now)
        if second != self._second:
            self._roll(second)
        span = 1.0 + (now - second)
        return (self._previous + self._count) / span

    def retry_after(self, queue_depth: int, now: float) -> int:
        """Seconds until the queue ahead (and this request) would clear, rounded, clamped."""
        rate = self.per_second(now)
        if rate <= 0:
            return self.high
        seconds = int((queue_depth + 1) / rate + 0.5)
        return min(self.high, max(self.low, seconds))
