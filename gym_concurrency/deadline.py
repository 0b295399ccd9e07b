"""The deadline of the request being handled, for the work it does: the middleware sets it
(from `RouteLimit.deadline`) around the app call; outbound clients, operation handles and
`resources_operation` read it and wait no longer than what is left.

A context variable, so it follows the request's task and the tasks it starts, and nothing
else. Times are the event loop's clock (`loop.time()`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["deadline_remaining", "request_deadline", "within_deadline"]

_DEADLINE: ContextVar[float | None] = ContextVar("gym_concurrency.deadline", default=None)


def request_deadline() -> float | None:
    """When the request being handled must be done (loop time), or None."""
    return _DEADLINE.get()


def deadline_remaining(own: float | None = None) -> float | None:
    """Seconds left: the smaller of `own` (a call's own bound, None: none) and what is left
    of the request's deadline; None if neither bounds it. May be zero or less: past."""
    at = _DEADLINE.get()
    if at is None:
        return own
    left = at - asyncio.get_running_loop().time()
    return left if own is None else min(own, left)


@contextmanager
def within_deadline(at: float | None) -> Iterator[None]:
    """Run the block with `at` (loop time; None: no deadline) as the request's deadline; a
    sooner one already set stays."""
    current = _DEADLINE.get()
    if at is None or (current is not None and current <= at):
        yield
        return
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)
