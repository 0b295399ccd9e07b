"""A request or websocket that found no free slot: wait in the limit's queue while reading the
client, then run the app holding the slot, or answer with the route's failure profile.

While it waits it costs a queue entry and one reader task with at most one read of the client
in flight (no task group): the request's task awaits its place in the queue alone. A client that
disconnects leaves the queue at once; a read in flight at admission (or refusal) is never
cancelled while its message may still be wanted: the app's next receive() gets it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Hashable
from time import perf_counter

from starlette.types import ASGIApp, Receive, Scope, Send

from gym_concurrency.limits import Admission, Refusal, WaitOutcome
from gym_concurrency.limits.rate_budget import BudgetReservation
from gym_concurrency.settlement import Settlement
from gym_concurrency.upstream_view import budget_of

from .body import QueuedBodies, QueuedRequest, QueuedWebsocket
from .cascade import CascadeWarning
from .limits import LimitedRoute
from .queue_wait import QueueWaitRecorder
from .settling import run_settled
from .upstream import budget_retry_after

__all__ = ["DEFAULT_ASK", "QueuedAdmission"]

Ask = tuple[int, Hashable]  # (weight, flow)
DEFAULT_ASK: Ask = (1, None)

_TRY_AGAIN_LATER = 1013  # websocket close code
_WEBSOCKET_REASONS = {
    "timeout": "admission timed out",
    "deadline": "admission deadline exceeded",
    "shed": "admission queue full",
    "budget": "admission budget exhausted",
    "saturated": "admission engine saturated",
}


class QueuedAdmission:
    """Waits, admits and refuses for one middleware; `__call__` serves one queued connection.

    A websocket holds its slot for the connection's lifetime and is refused with close code
    1013 (try again later)."""

    __slots__ = (
        "bodies",
        "cascade",
        "draining",
        "max_body_bytes",
        "recorder",
        "refusal_body_seconds",
        "waiting",
    )

    def __init__(
        self,
        recorder: QueueWaitRecorder,
        *,
        max_body_bytes: int,
        bodies: QueuedBodies,
        refusal_body_seconds: float,
    ) -> None:
        self.recorder = recorder
        self.max_body_bytes = max_body_bytes
        self.bodies = bodies
        self.refusal_body_seconds = refusal_body_seconds
        self.cascade = CascadeWarning()
        self.draining = False  # shutting down: every queued request is refused, none admitted
        self.waiting: dict[asyncio.Future[Admission], LimitedRoute] = {}

    def drain(self) -> int:
        """Stop admitting: refuse every queued request now ("unavailable", the draining
        body); how many were queued."""
        self.draining = True
        waiting, self.waiting = self.waiting, {}
        return sum(route.limit.refuse(waiter) for waiter, route in waiting.items())

    async def refuse_now(
        self, route: LimitedRoute, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Refuse a request that arrived while draining."""
        if scope["type"] == "http":
            await self.refuse_at_once(route, "unavailable", receive, send)
        else:
            queued = QueuedWebsocket(receive)
            try:
                await _refuse_websocket("unavailable", queued, send)
            finally:
                queued.close()

    async def __call__(
        self,
        app: ASGIApp,
        route: LimitedRoute,
        waiter: asyncio.Future[Admission],
        scope: Scope,
        receive: Receive,
        send: Send,
        ask: Ask = DEFAULT_ASK,
        tokens: int | None = None,
    ) -> None:
        """Serve a connection queued on `route` as `waiter` (from `route.limit.enqueue()`, with
        `ask`'s weight and flow, and `tokens` of its upstream's budget): admitted, `app` runs
        holding what it asked for, its reservation settled from the response."""
        if scope["type"] == "http" and waiter.done() and waiter.result() == "admitted":
            # Admitted as it joined: nothing to wait for, so nothing reads the client for it.
            self._record(route, "admitted", perf_counter())
            reservation = route.limit.settle(waiter)
            await self._run(app, route, scope, receive, send, ask, reservation)
            return
        if scope["type"] == "http":
            queued: QueuedRequest | QueuedWebsocket = QueuedRequest(
                receive, self.max_body_bytes, self.bodies
            )
        else:
            queued = QueuedWebsocket(receive)
        try:
            outcome, reservation = await self._wait(route, waiter, queued)
            if outcome == "admitted":
                await self._run(app, route, scope, queued.receive, send, ask, reservation)
            elif outcome == "cancelled":
                return  # the client left: nothing is sent
            elif isinstance(queued, QueuedRequest):
                await self._refuse(route, outcome, queued, send, tokens)
            else:
                await _refuse_websocket(outcome, queued, send)
        finally:
            queued.close()

    async def refuse_at_once(
        self,
        route: LimitedRoute,
        reason: Refusal,
        receive: Receive,
        send: Send,
        tokens: int | None = None,
    ) -> None:
        """Refuse an HTTP request whose wait ended as it began (a full queue, an unreachable
        shared limit, a budget that could not hold it in time): no read of the client unless
        the episode profile needs its body."""
        if not route.failures.episode:
            await self._refuse(route, reason, None, send, tokens)
            return
        queued = QueuedRequest(receive, self.max_body_bytes, self.bodies)
        try:
            await self._refuse(route, reason, queued, send, tokens)
        finally:
            queued.close()

    async def _wait(
        self,
        route: LimitedRoute,
        waiter: asyncio.Future[Admission],
        queued: QueuedRequest | QueuedWebsocket,
    ) -> tuple[WaitOutcome, BudgetReservation | None]:
        """How the wait ended, and the reservation of the limit's budget handed with an
        admission; a disconnect leaves the queue, as does a server cancel (raised)."""
        started = perf_counter()
        recorded: str | None = "cancelled"
        self.waiting[waiter] = route
        try:
            outcome, reservation = await _wait_reading(route, waiter, queued)
            recorded = outcome
        except asyncio.CancelledError:  # the server cancelled the request
            route.limit.leave(waiter)
            raise
        except BaseException:  # reading the client failed (an outer body limit): not a wait
            recorded = None
            route.limit.leave(waiter, cancelled=False)
            raise
        finally:
            self.waiting.pop(waiter, None)
            self._record(route, recorded, started)
        return outcome, reservation

    def _record(self, route: LimitedRoute, outcome: str | None, started: float) -> None:
        histogram = self.recorder.histogram()
        attributes = None if outcome is None else route.wait_attributes.get(outcome)
        if histogram is not None and attributes is not None:
            wait_ms = (perf_counter() - started) * 1000.0
            self.recorder.record(histogram, wait_ms, attributes)

    async def _run(
        self,
        app: ASGIApp,
        route: LimitedRoute,
        scope: Scope,
        receive: Receive,
        send: Send,
        ask: Ask,
        reservation: BudgetReservation | None,
    ) -> None:
        try:
            budget = budget_of(route.limit) if reservation is not None else None
            if budget is None or reservation is None:
                await app(scope, receive, send)
            else:
                settlement = Settlement(budget, reservation)
                await run_settled(app, scope, receive, send, settlement)
        finally:
            route.limit.release(*ask)

    async def _refuse(
        self,
        route: LimitedRoute,
        reason: Refusal,
        queued: QueuedRequest | None,
        send: Send,
        tokens: int | None = None,
    ) -> None:
        if reason == "shed":
            self.cascade.shed(route)
        body = None
        if queued is not None and route.failures.episode:  # it echoes the ids: read, bounded
            body = await queued.read_body(self.refusal_body_seconds)
            if queued.disconnected:
                return
        wait = None
        if reason == "budget" and tokens is not None:  # when the budget would hold it
            wait = budget_retry_after(route.limit, tokens)
        with contextlib.suppress(OSError):  # the client left while we answered; nothing held
            await route.failures.send(send, reason, body, draining=self.draining, budget_wait=wait)


async def _wait_reading(
    route: LimitedRoute, waiter: asyncio.Future[Admission], queued: QueuedRequest | QueuedWebsocket
) -> tuple[WaitOutcome, BudgetReservation | None]:
    """Wait for `waiter` while `queued` reads the client; "cancelled" (having left the queue,
    which gives back a reservation handed to it) if the client disconnects first. A failed
    read is raised."""
    queued.watch(waiter.cancel)  # a disconnect or a failed read ends the wait
    try:
        result = await waiter
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not queued.stopped or (task is not None and task.cancelling()):
            raise  # the server cancelled the request
        result = None
    finally:
        queued.stop_watching()
    if queued.failure is not None:
        raise queued.failure  # the caller leaves the queue, uncounted
    if queued.disconnected:  # also when admitted in the same moment: the slot passes on
        route.limit.leave(waiter)
        return "cancelled", None
    assert result is not None
    reservation = route.limit.settle(waiter)
    return result, reservation


async def _refuse_websocket(reason: str, queued: QueuedWebsocket, send: Send) -> None:
    # A close before accept becomes an HTTP 403; accepting first lets the client see 1013.
    message = await queued.receive()
    if message["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    text = _WEBSOCKET_REASONS.get(reason, "admission unavailable")
    await send({"type": "websocket.close", "code": _TRY_AGAIN_LATER, "reason": text})
