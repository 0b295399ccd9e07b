"""`adaptive=` of an outbound client: the controllers of adaptive routes
(gym_concurrency.limits.adaptive), bound to the client's limit and fed by its attempts."""

from __future__ import annotations

from typing import Protocol

from ..limits import Limit
from ..limits.adaptive import AdaptiveController, AdaptiveLimiter, Algorithm, make_controller

__all__ = ["OVERLOAD_STATUSES", "AdaptiveConfig", "adaptive_limiter"]

OVERLOAD_STATUSES: tuple[int, ...] = (429, 503)


class AdaptiveConfig(Protocol):
    """The shape of `gym_concurrency.middleware.AdaptiveLimit` (any object with these
    attributes will do): bounds, algorithm and latency tolerance."""

    @property
    def min_concurrent(self) -> int: ...
    @property
    def max_concurrent(self) -> int: ...
    @property
    def algorithm(self) -> Algorithm: ...
    @property
    def latency_tolerance(self) -> float | None: ...


def adaptive_limiter(
    limit: Limit, adaptive: AdaptiveConfig | AdaptiveController | None
) -> tuple[AdaptiveLimiter | None, frozenset[int]]:
    """The limiter that moves `limit` (None without `adaptive`) and the statuses it takes as
    overload. A config starts its controller at the limit's size, clamped to its bounds."""
    if adaptive is None:
        return None, frozenset()
    statuses = frozenset(getattr(adaptive, "overload_status_codes", OVERLOAD_STATUSES))
    if isinstance(adaptive, AdaptiveController):
        return AdaptiveLimiter(limit, adaptive), statuses
    low, high = adaptive.min_concurrent, adaptive.max_concurrent
    controller = make_controller(
        adaptive.algorithm,
        low,
        high,
        min(high, max(low, limit.limit)),
        tolerance=adaptive.latency_tolerance,
    )
    return AdaptiveLimiter(limit, controller), statuses
