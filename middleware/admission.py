"""ConcurrencyLimitMiddleware: admit each request on a limited route through its semaphore,
hold the slot for the whole app call, or answer with the route's failure profile.

One request, top to bottom: scope -> route table -> admit (or fail) -> app -> release.
"""

from __future__ import annotations

import contextlib
import logging
from time import perf_counter
from typing import Literal

import anyio
from opentelemetry.metrics import MeterProvider
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_concurrency import QueueFullError

from .body import QueuedRequest, QueuedWebsocket
from .dependencies import check_operation_names
from .failures import Reason, failure_response
from .limits import LIMITS_SCOPE_KEY, ConcurrencyLimits, LimitedRoute
from .queue_wait import QueueWaitRecorder
from .routing import RouteTable, UnknownRouteError, describe_routes
from .settings import ConcurrencySettings

__all__ = ["ConcurrencyConfigError", "ConcurrencyLimitMiddleware"]

_log = logging.getLogger("gym_concurrency.middleware")
Outcome = Literal["admitted", "timeout", "shed", "cancelled"]
_TRY_AGAIN_LATER = 1013  # websocket close code


class ConcurrencyConfigError(RuntimeError):
    """The settings do not fit the app: a configured path, method or operation name is missing."""


class ConcurrencyLimitMiddleware:
    """Per-route concurrency limits from `settings` (default: read from the environment).

    Routes are read from `scope["app"]` at lifespan startup (a bad path fails the start), or
    on the first request when the server runs without lifespan.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: ConcurrencySettings | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.app = app
        self.settings = settings if settings is not None else ConcurrencySettings()
        self.limits = ConcurrencyLimits(self.settings, meter_provider)
        self._recorder = QueueWaitRecorder(meter_provider)
        self._table: RouteTable[LimitedRoute] | None = None
        self._config_error: str | None = None
        self._operations = bool(self.limits.operations)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope_type = scope["type"]
        if scope_type == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope_type != "http" and scope_type != "websocket":
            await self.app(scope, receive, send)
            return
        table = self._table or self._build(scope)
        if table is None:
            await self._misconfigured(scope, send)
            return
        if self._operations:  # for operation_limit dependencies
            scope[LIMITS_SCOPE_KEY] = self.limits
        route = table.resolve(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        semaphore = route.semaphore
        if not semaphore.try_acquire():  # it must wait or be refused: watch the client
            await _QueuedAdmission(self.app, route, self._recorder, self.settings)(
                scope, receive, send
            )
            return
        try:  # the slot is held from here on: nothing may come between taking and `try`
            # A free slot and nobody waiting: taken at once, so the wait recorded is zero.
            histogram = self._recorder.histogram()
            if histogram is not None:
                self._recorder.record(histogram, 0.0, route.wait_attributes["admitted"])
            await self.app(scope, receive, send)
        finally:
            semaphore.release()

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] == "lifespan.startup" and self._build(scope) is None:
            await send({"type": "lifespan.startup.failed", "message": self._config_error})
            # Raise after reporting, as Starlette's router does: servers expect the app to end.
            raise ConcurrencyConfigError(self._config_error)
        replayed = False

        async def receive_again() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return message
            return await receive()

        await self.app(scope, receive_again, send)

    def _build(self, scope: Scope) -> RouteTable[LimitedRoute] | None:
        """Compile the route table from the app and check operation names, once; None (with
        `_config_error` set) if the settings do not fit the app."""
        if self._config_error is not None:
            return None
        app = scope.get("app", self.app)
        try:
            limits = self.limits
            table = RouteTable.compile(app, [(r.config, r) for r in limits.routes])
            check_operation_names(app, limits.operations)
        except UnknownRouteError as error:
            routes = "\n  ".join(describe_routes(app)) or "(none)"
            self._config_error = f"gym_concurrency: {error}. The app's routes:\n  {routes}"
            _log.error("%s", self._config_error)
            return None
        self._table = table
        return table

    async def _misconfigured(self, scope: Scope, send: Send) -> None:
        # Without lifespan there is no start to fail: every request says what is wrong.
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1011, "reason": "misconfigured"})
            return
        body = (self._config_error or "").encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _QueuedAdmission:
    """One request or websocket that must wait for its route's slot: wait while watching the
    client, then run the app holding the slot until the app returns or raises.

    A websocket holds its slot for the connection's lifetime and is refused with close code
    1013 (try again later) on an admission timeout or a full queue."""

    __slots__ = ("app", "max_body_bytes", "recorder", "route")

    def __init__(
        self,
        app: ASGIApp,
        route: LimitedRoute,
        recorder: QueueWaitRecorder,
        settings: ConcurrencySettings,
    ) -> None:
        self.app = app
        self.route = route
        self.recorder = recorder
        self.max_body_bytes = settings.max_queued_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            queued: QueuedRequest | QueuedWebsocket = QueuedRequest(receive, self.max_body_bytes)
        else:
            queued = QueuedWebsocket(receive)
        outcome = await self._wait(queued)
        if outcome == "admitted":
            await self._run(scope, queued.receive, send)
        elif outcome == "cancelled":
            return  # the client left: nothing is sent
        elif isinstance(queued, QueuedRequest):
            await self._refuse(outcome, queued, send)
        else:
            await _refuse_websocket(outcome, queued.receive, send)

    async def _wait(self, queued: QueuedRequest | QueuedWebsocket) -> Outcome:
        """Wait for a slot while `queued` reads the client; a disconnect cancels the wait."""
        semaphore = self.route.semaphore
        started = perf_counter()
        outcome: Outcome = "cancelled"
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(queued.watch, group.cancel_scope.cancel)
                try:
                    await semaphore.acquire()
                    outcome = "admitted"
                except TimeoutError:
                    outcome = "timeout"
                except QueueFullError:
                    outcome = "shed"
                group.cancel_scope.cancel()  # stop watching: the app reads from here on
        except BaseException:  # the server cancelled the request (or its receive failed)
            if outcome == "admitted":
                semaphore.release()
            outcome = "cancelled"
            raise
        finally:
            histogram = self.recorder.histogram()
            if histogram is not None:
                wait_ms = _ms_since(started)
                self.recorder.record(histogram, wait_ms, self.route.wait_attributes[outcome])
        return outcome

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            self.route.semaphore.release()

    async def _refuse(self, reason: Reason, queued: QueuedRequest, send: Send) -> None:
        config = self.route.config
        body = await queued.read_body() if config.failure == "episode" else b""
        if queued.disconnected:
            return
        with contextlib.suppress(OSError):  # the client left while we answered; nothing held
            await failure_response(config, reason, body).send(send)


async def _refuse_websocket(reason: str, receive: Receive, send: Send) -> None:
    # A close before accept becomes an HTTP 403; accepting first lets the client see 1013.
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    text = "admission timed out" if reason == "timeout" else "admission queue full"
    await send({"type": "websocket.close", "code": _TRY_AGAIN_LATER, "reason": text})


def _ms_since(started: float) -> float:
    return (perf_counter() - started) * 1000.0
