"""The feedback of one route limit that moves or answers with a computed Retry-After: it runs
the app for each admitted request, measures it, and tells the limit's controller and hand-over rate.

Only routes with `adaptive` or `retry_after_seconds="auto"` have one; every other route calls
the app directly and pays nothing. What is measured, per admitted HTTP request: the time from
admission (the app is called) to the last body message sent, and whether it ended in overload
(a status in `overload_status_codes`, or an exception from the app). A request cancelled
(its client left) is no sample. Websockets count as releases for the hand-over rate only: a
connection's lifetime is no latency.
"""

from __future__ import annotations

import asyncio
from time import perf_counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_concurrency.limits import Limit
from gym_concurrency.limits.adaptive import AdaptiveController, AdaptiveLimiter, make_controller
from gym_concurrency.limits.handover_rate import HandoverRate

from .settings import RouteLimit

__all__ = ["RouteFeedback", "controller_for"]


def controller_for(config: RouteLimit, start: int | None = None) -> AdaptiveController:
    """The controller `config.adaptive` asks for, starting at `start` (default: the route's
    max_concurrent) clamped to its bounds."""
    adaptive = config.adaptive
    assert adaptive is not None
    initial = config.max_concurrent if start is None else start
    initial = min(adaptive.max_concurrent, max(adaptive.min_concurrent, initial))
    return make_controller(
        adaptive.algorithm,
        adaptive.min_concurrent,
        adaptive.max_concurrent,
        initial,
        tolerance=adaptive.latency_tolerance,
    )


class RouteFeedback:
    """The app call of an admitted request on one limit (shared by the routes that share it),
    measured for its `limiter` (adaptive) and counted by its `handover` rate (Retry-After
    auto)."""

    __slots__ = ("app", "config", "handover", "limit", "limiter", "overload_statuses")

    def __init__(
        self,
        limit: Limit,
        config: RouteLimit,
        *,
        limiter: AdaptiveLimiter | None = None,
        handover: HandoverRate | None = None,
    ) -> None:
        self.limit = limit
        self.config = config
        self.limiter = limiter
        self.handover = handover
        statuses = config.adaptive.overload_status_codes if config.adaptive else ()
        self.overload_statuses = frozenset(statuses)
        self.app: ASGIApp | None = None  # set by the middleware (bind)

    def bind(self, app: ASGIApp) -> None:
        """Call `app` for admitted requests."""
        self.app = app

    def retry_after(self) -> int:
        """Retry-After seconds now: the queue ahead and the request, at the hand-over rate."""
        rate = self.handover
        assert rate is not None
        return rate.retry_after(self.limit.queue_depth, perf_counter())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app for a request holding a slot of this limit; measure it."""
        app = self.app
        assert app is not None
        limiter = self.limiter
        if limiter is None or scope["type"] != "http":
            try:
                await app(scope, receive, send)
            finally:
                self._released()
            return
        started = perf_counter()
        status = 0
        finished = 0.0

        async def measured_send(message: Message) -> None:
            nonlocal status, finished
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
            elif kind == "http.response.body" and not message.get("more_body", False):
                finished = perf_counter()
            await send(message)

        overload: bool | None = True
        try:
            await app(scope, receive, measured_send)
            overload = status in self.overload_statuses
        except asyncio.CancelledError:
            overload = None  # the client left: no sample
            raise
        finally:
            now = perf_counter()
            if overload is not None:
                limiter.record(started, finished or now, overload)
            self._released(now)

    def _released(self, now: float | None = None) -> None:
        rate = self.handover
        if rate is not None:
            rate.release(perf_counter() if now is None else now)
