"""ConcurrencyLimitMiddleware: admit each request on a limited route through its semaphore,
hold the slot for the whole app call, or answer with the route's failure profile.

One request, top to bottom: scope -> route table -> admit (or fail) -> app -> release.
"""

from __future__ import annotations

import logging

from opentelemetry.metrics import MeterProvider
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .body import QueuedBodies
from .dependencies import check_operation_names
from .limits import LIMITS_SCOPE_KEY, ConcurrencyLimits, LimitedRoute
from .queue_wait import QueueWaitRecorder
from .queued import QueuedAdmission
from .routing import RouteTable, UnknownRouteError, describe_routes
from .settings import ConcurrencySettings

__all__ = ["ConcurrencyConfigError", "ConcurrencyLimitMiddleware"]

_log = logging.getLogger("gym_concurrency.middleware")


class ConcurrencyConfigError(RuntimeError):
    """The settings are invalid (e.g. from the environment), or do not fit the app: a configured
    path, method or operation name is missing."""


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
        self._config_error: str | None = None
        if settings is None:
            try:
                settings = ConcurrencySettings()  # from the environment
            except ValueError as error:  # pydantic's ValidationError, pydantic-settings' own
                # Starlette builds middleware on the app's first call (the lifespan one): an
                # error raised here would read as "lifespan unsupported", then a 500 on every
                # route. Kept, it fails the start instead (or answers "misconfigured").
                self._config_error = f"gym_concurrency: invalid settings: {error}"
                _log.error("%s", self._config_error)
                settings = ConcurrencySettings.model_construct()  # defaults, no limits: unused
        self.settings = settings
        self.limits = ConcurrencyLimits(self.settings, meter_provider)
        self._recorder = QueueWaitRecorder(meter_provider)
        self._queued = QueuedAdmission(
            app,
            self._recorder,
            max_body_bytes=self.settings.max_queued_body_bytes,
            bodies=QueuedBodies(self.settings.max_queued_body_bytes_total),
            refusal_body_seconds=self.settings.refusal_body_timeout_seconds,
        )
        self._table: RouteTable[LimitedRoute] | None = None
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
        limit = route.limit
        if not limit.try_acquire():
            waiter = limit.enqueue()
            if waiter.done() and scope_type == "http":  # refused as it arrived
                self._record_no_wait(route, waiter.result())
                await self._queued.refuse_at_once(route, waiter.result(), receive, send)
            else:  # it waits: read the client meanwhile
                await self._queued(route, waiter, scope, receive, send)
            return
        try:  # the slot is held from here on: nothing may come between taking and `try`
            # A free slot and nobody waiting: taken at once, so the wait recorded is zero.
            self._record_no_wait(route, "admitted")
            await self.app(scope, receive, send)
        finally:
            limit.release()

    def _record_no_wait(self, route: LimitedRoute, outcome: str) -> None:
        histogram = self._recorder.histogram()
        if histogram is not None:
            self._recorder.record(histogram, 0.0, route.wait_attributes[outcome])

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] == "lifespan.startup" and self._config_error is not None:
            await send({"type": "lifespan.startup.failed", "message": self._config_error})
            # Raise after reporting, as Starlette's router does: servers expect the app to end.
            raise ConcurrencyConfigError(self._config_error)
        replayed = False
        failed = False

        async def receive_again() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return message
            return await receive()

        async def send_checked(reply: Message) -> None:
            # The table is built once the app's own startup is done, so that routes it adds
            # there count; if the settings do not fit, the server hears "failed" instead.
            nonlocal failed
            if failed:
                return  # the app reporting our error back: the server already has it
            if reply["type"] == "lifespan.startup.complete" and self._build(scope) is None:
                failed = True
                await send({"type": "lifespan.startup.failed", "message": self._config_error})
                raise ConcurrencyConfigError(self._config_error)  # into the app's startup
            await send(reply)

        await self.app(scope, receive_again, send_checked)
        if failed:  # the app swallowed the error
            raise ConcurrencyConfigError(self._config_error)

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
        # Only that it is misconfigured: the details (the invalid field, the app's routes) are
        # in the log, not for any client to read.
        body = (
            b"gym_concurrency: this server is misconfigured (its concurrency limits do not fit "
            b"the app or are invalid) and refuses every request until that is fixed; the "
            b"server's log (logger gym_concurrency.middleware) says what is wrong.\n"
        )
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": body})
