"""ConcurrencyLimitMiddleware: admit each request on a limited route through its limit,
hold the slot for the whole app call, or answer with the route's failure profile.

One request, top to bottom: scope -> route table -> admit (or fail) -> app -> release.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from typing import Any

from opentelemetry.metrics import MeterProvider
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_concurrency import LimitConfigurationError, SharedLimit
from gym_concurrency.deadline import within_deadline
from gym_concurrency.flow import within_flow

from .asks import RouteAsk, unread_length
from .body import QueuedBodies, QueuedRequest
from .dependencies import check_operation_names
from .failures import send_misconfigured
from .limits import LIMITS_SCOPE_KEY, ConcurrencyLimits, LimitedRoute
from .queue_wait import QueueWaitRecorder
from .queued import DEFAULT_ASK, QueuedAdmission
from .routing import RouteTable, UnknownRouteError, describe_routes
from .settings import ConcurrencySettings
from .shutdown import ShutdownSignals, wait_idle

__all__ = [
    "DEADLINE_STATE_KEY",
    "STATE_ATTRIBUTE",
    "ConcurrencyConfigError",
    "ConcurrencyLimitMiddleware",
]

_log = logging.getLogger("gym_concurrency.middleware")
# The middleware leaves itself on the app it limits, `app.state.gym_concurrency`, once it has
# read the app's routes (lifespan startup, or the first request): for `reload_settings(app)`.
STATE_ATTRIBUTE = "gym_concurrency"
# Where a request with a deadline finds it: `request.state` / scope["state"], in loop time.
DEADLINE_STATE_KEY = "gym_concurrency.deadline"
# Where a middleware leaves itself (and the app it limits) in the lifespan scope, and in the
# scope of the first request it builds its routes on, for any ConcurrencyLimitMiddleware inside
# it: a second one on the same app is an error.
_OUTER_SCOPE_KEY = "gym_concurrency.middleware"


class ConcurrencyConfigError(RuntimeError):
    """The settings are invalid (e.g. from the environment), or do not fit the app: a configured
    path, method or operation name is missing."""


class ConcurrencyLimitMiddleware:
    """Per-route concurrency limits from `settings` (default: read from the environment).

    Routes are read from `scope["app"]` at lifespan startup (a bad path fails the start), or
    on the first request when the server runs without lifespan. `bypass(scope)` returning
    True sends a request on a limited route to the app at once, outside its limit and
    uncounted: for requests the app rejects before any work (no credentials, for an auth
    middleware that must run inside this one).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: ConcurrencySettings | None = None,
        meter_provider: MeterProvider | None = None,
        bypass: Callable[[Scope], bool] | None = None,
    ) -> None:
        if bypass is not None and not callable(bypass):
            raise TypeError(f"bypass must be a callable taking the ASGI scope, got {bypass!r}")
        self.app = app
        self._bypass = bypass
        self._config_error: str | None = None
        self._from_environment = settings is None
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
            self._recorder,
            max_body_bytes=self.settings.max_queued_body_bytes,
            bodies=QueuedBodies(self.settings.max_queued_body_bytes_total),
            refusal_body_seconds=self.settings.refusal_body_timeout_seconds,
        )
        self._bind(self.limits)
        self._table: RouteTable[LimitedRoute] | None = None
        self._routed_app: Any = None  # the app whose routes the table was compiled from
        self._operations = bool(self.limits.operations)
        self._signals: ShutdownSignals | None = None

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
            await send_misconfigured(scope, send)
            return
        if self._operations:  # for operation_limit dependencies
            scope[LIMITS_SCOPE_KEY] = self.limits
        route = table.resolve(scope)
        if route is None or (self._bypass is not None and self._bypass(scope)):
            await self.app(scope, receive, send)
            return
        if self._queued.draining:  # shutting down: admit nothing more
            await self._queued.refuse_now(route, scope, receive, send)
            return
        # An adaptive limit (or Retry-After auto) runs the app in its feedback, measured.
        feedback = route.feedback
        app = self.app if feedback is None else feedback
        if route.ask is not None:  # weighed, or in a flow: read what it asks for first
            await self._asking(app, route, route.ask, scope, receive, send)
        else:
            await self._admit(app, route, DEFAULT_ASK, None, scope, receive, send)

    async def _asking(
        self,
        app: ASGIApp,
        route: LimitedRoute,
        ask: RouteAsk,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Admit a request for the weight and flow it asks for (its body read ahead, bounded,
        if they come from it), then run the app within its deadline and flow (its work's)."""
        ahead = None
        body = None
        if ask.reads_body and scope["type"] == "http":
            queued = self._queued
            ahead = QueuedRequest(receive, queued.max_body_bytes, queued.bodies)
            receive = ahead.receive  # the app still gets every byte, read ahead or not
        try:
            unread = 0
            if ahead is not None:
                body = await ahead.read_ahead()
                unread = 0 if body is not None else unread_length(scope, ahead.size)
                if self._queued.draining:  # it began draining while the body was read
                    await self._queued.refuse_now(route, scope, receive, send)
                    return
            weight, flow, tokens = ask.read(scope, body, unread)
            deadline = ask.deadline(scope)
            with within_deadline(_deadline_at(scope, deadline)), within_flow(flow):
                asked = (weight, flow)
                await self._admit(app, route, asked, deadline, scope, receive, send, tokens)
        finally:
            if ahead is not None:
                ahead.close()

    async def _admit(
        self,
        app: ASGIApp,
        route: LimitedRoute,
        asked: tuple[int, Hashable],
        deadline: float | None,
        scope: Scope,
        receive: Receive,
        send: Send,
        tokens: int | None = None,
    ) -> None:
        """Admit a request for `asked` (weight, flow) within its own `deadline` (seconds, None:
        none): at once if free, else queued or refused as it arrives; admitted, run `app`."""
        limit = route.limit
        weight, flow = asked
        if route.upstream:  # slots and upstream together: one enqueue admits both, or waits
            waiter = limit.enqueue(weight, flow, deadline, tokens=tokens)
        elif (deadline is None or deadline > 0) and limit.try_acquire(weight, flow):
            try:  # the slot is held from here on: nothing may come between taking and `try`
                # Free and nobody waiting: taken at once, so the wait recorded is zero.
                self._record_no_wait(route, "admitted")
                await app(scope, receive, send)
            finally:
                limit.release(weight, flow)
            return
        else:
            waiter = limit.enqueue(weight, flow, deadline)
        result = waiter.result() if waiter.done() else None
        if result is not None and result != "admitted" and scope["type"] == "http":
            self._record_no_wait(route, result)  # refused as it arrived
            await self._queued.refuse_at_once(route, result, receive, send, tokens)
        else:  # it waits (read the client meanwhile), or was admitted with its reservation
            await self._queued(app, route, waiter, scope, receive, send, asked, tokens)

    def _record_no_wait(self, route: LimitedRoute, outcome: str) -> None:
        histogram = self._recorder.histogram()
        attributes = route.wait_attributes.get(outcome)  # "unavailable" is counted, not timed
        if histogram is not None and attributes is not None:
            self._recorder.record(histogram, 0.0, attributes)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._check_alone(scope)
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
            shutdown = await receive()
            if shutdown["type"] == "lifespan.shutdown":  # before the app's own shutdown
                await self.drain()
            return shutdown

        async def send_checked(reply: Message) -> None:
            # The table is built once the app's own startup is done, so that routes it adds
            # there count; if the settings do not fit, the server hears "failed" instead.
            nonlocal failed
            if failed:
                return  # the app reporting our error back: the server already has it
            if reply["type"] == "lifespan.startup.complete":
                if self._build(scope) is None:
                    failed = True
                    await send({"type": "lifespan.startup.failed", "message": self._config_error})
                    raise ConcurrencyConfigError(self._config_error)  # into the app's startup
                error = await self._connect_shared()
                if error is not None:  # a misconfigured Redis fails the start, as bad settings
                    failed = True
                    self._config_error = error
                    await send({"type": "lifespan.startup.failed", "message": error})
                    raise ConcurrencyConfigError(error)
                self._queued.draining = False  # an app started again admits again
                self._signals = ShutdownSignals(asyncio.get_running_loop(), self._begin_drain)
                self._signals.install()
            elif reply["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                await self._close_shared()
            await send(reply)

        await self.app(scope, receive_again, send_checked)
        if failed:  # the app swallowed the error
            raise ConcurrencyConfigError(self._config_error)

    async def _connect_shared(self) -> str | None:
        """Connect the limits shared across processes; one Redis cannot reach is logged and
        answers by `redis_unavailable` until it can (no restart needed). A misconfigured one
        (authentication, TLS, commands, a size other processes disagree with) is an error:
        its message, to fail the start with (the server logs it, so it is not logged here)."""
        for limit in self.limits.shared():
            try:
                connected = await limit.connect()
            except LimitConfigurationError as error:
                return f"gym_concurrency: {error}"
            if not connected:
                _log.warning(
                    "gym_concurrency: limit %r: its Redis cannot be reached; admissions are "
                    "%s until it can",
                    limit.limit_name,
                    "local" if _falls_back(limit, self.settings.redis_unavailable) else "refused",
                )
        return None

    async def drain(self, seconds: float | None = None) -> bool:
        """Shut down admission: refuse every queued request now (the route's failure profile,
        reason unavailable, "draining") and every later one, then wait at most `seconds`
        (default `drain_timeout_seconds`) for admitted requests to finish; True if they did.
        Runs by itself on SIGTERM / SIGINT and at lifespan shutdown."""
        self._begin_drain()
        seconds = self.settings.drain_timeout_seconds if seconds is None else seconds
        return await wait_idle({id(r.limit): r.limit for r in self.limits.routes}.values(), seconds)

    def _begin_drain(self) -> None:
        if self._queued.draining:
            return
        refused = self._queued.drain()
        _log.log(
            logging.WARNING if refused else logging.INFO,
            "gym_concurrency: draining (shutting down): %d queued requests refused; admitted "
            "requests finish, new ones are refused",
            refused,
        )

    async def _close_shared(self) -> None:
        """Give this process's global slots and places back, and close their connections."""
        if self._signals is not None:
            self._signals.restore()
        for limit in self.limits.shared():
            await limit.close()

    def _build(self, scope: Scope) -> RouteTable[LimitedRoute] | None:
        """Compile the route table from the app and check operation names, once; None (with
        `_config_error` set) if the settings do not fit the app."""
        self._check_alone(scope)
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
        self._routed_app = app
        state = getattr(app, "state", None)
        if state is not None:  # a Starlette / FastAPI app: reachable for reload_settings(app)
            setattr(state, STATE_ATTRIBUTE, self)
        return table

    def _check_alone(self, scope: Scope) -> None:
        """Leave this middleware in `scope` for any inside it; if one outside it limits the
        same app, both fail (`_config_error`, logged once) naming both."""
        app = scope.get("app", self.app)
        found = scope.get(_OUTER_SCOPE_KEY)
        if found is None or found[0] is self:
            scope[_OUTER_SCOPE_KEY] = (self, app)
            return
        outer, outer_app = found
        if outer_app is not app and outer_app is not self:  # e.g. a mounted app's own
            scope[_OUTER_SCOPE_KEY] = (self, app)
            return
        if self._config_error is not None:
            return
        error = (
            "gym_concurrency: ConcurrencyLimitMiddleware is added twice to this app "
            "(app.add_middleware run twice, or by an app factory and again by its caller): "
            f"the outer one: {outer._describe()}; the inner one: {self._describe()}. A request "
            "the outer one admits then waits again in the inner one's queue, so both count slots "
            "no request uses. Keep one: one middleware takes every route and operation limit."
        )
        _log.error("%s", error)
        self._config_error = error
        outer._config_error = outer._config_error or error
        outer._table = None  # built already (a first request): it answers "misconfigured" too

    def _describe(self) -> str:
        """This middleware's component and limits, to tell it from another."""
        settings = self.settings
        source = " (settings from GYM_CONCURRENCY_* variables)" if self._from_environment else ""
        limits = [
            f"route limit {r.limit_name!r} ("
            + (f"{'|'.join(r.methods)} {r.path}" if r.methods else r.path)
            + f", {r.max_concurrent})"
            for r in settings.routes
        ]
        limits += [
            f"operation limit {o.limit_name!r} ({o.max_concurrent})" for o in settings.operations
        ]
        return f"component {settings.component!r}{source}, " + (", ".join(limits) or "no limits")

    def reload(self, settings: ConcurrencySettings) -> list[str]:
        """Apply new settings to the running middleware, all or nothing, and return what
        changed (one line each, also logged). Held slots and waiters stay; a limit's size,
        adaptive settings, failure profile and Retry-After change at once (gym.concurrency.limit
        shows the new size at the next export); limits can be added and removed.

        Call it on the server's event loop (a signal handler added with
        `loop.add_signal_handler`, a route behind the app's own auth, or
        `loop.call_soon_threadsafe` from a file watcher's thread). Raises ValueError for a
        change a running limit cannot take (its queue timeout or bound, the component or
        server name: restart for those) and ConcurrencyConfigError if the settings do not fit
        the app; nothing is changed then."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "reload() must run on the server's event loop (its limits are asyncio objects): "
                "from another thread, use loop.call_soon_threadsafe(middleware.reload, settings)"
            ) from None
        if self._config_error is not None:
            raise ConcurrencyConfigError(
                f"cannot reload a misconfigured middleware: {self._config_error}"
            )
        limits = ConcurrencyLimits(settings, self.limits.meter_provider, previous=self.limits)
        table = None
        if self._routed_app is not None:
            app = self._routed_app
            try:
                table = RouteTable.compile(app, [(r.config, r) for r in limits.routes])
                check_operation_names(app, limits.operations)
            except UnknownRouteError as error:
                raise ConcurrencyConfigError(f"gym_concurrency: {error}") from None
        changes = limits.apply()
        self._queued.max_body_bytes = settings.max_queued_body_bytes
        self._queued.bodies.limit = settings.max_queued_body_bytes_total
        self._queued.refusal_body_seconds = settings.refusal_body_timeout_seconds
        self._bind(limits)
        self.settings, self.limits, self._table = settings, limits, table
        self._operations = bool(limits.operations)
        for change in changes:  # WARNING: shown by Python's (and uvicorn's) default logging
            _log.warning("gym_concurrency reload: %s", change)
        return changes

    def _bind(self, limits: ConcurrencyLimits) -> None:
        """Give each feedback the app to call."""
        for feedback in limits.feedbacks():
            feedback.bind(self.app)


def _deadline_at(scope: Scope, seconds: float | None) -> float | None:
    """The request's deadline in loop time, also left in its state for the app."""
    if seconds is None:
        return None
    at = asyncio.get_running_loop().time() + seconds
    scope.setdefault("state", {})[DEADLINE_STATE_KEY] = at
    return at


def _falls_back(limit: SharedLimit, redis_unavailable: str) -> bool:
    """Whether `limit` admits locally while Redis is away: not with a rate budget, which is
    kept only in Redis (docs/reliability.md)."""
    return redis_unavailable == "local" and limit.shared_budget is None
