"""The limits one middleware makes from its settings: one per route limit_name, one per
operation limit and one per client limit, each carrying the settings' component and server
name.

Made again from new settings (`previous=`, a reload), the limits keep their running limits by
limit_name: held slots and waiters stay where they are. What changes is a typed plan, checked
whole before anything moves (a change a running limit cannot take, its queue timeout, its
queue bound, its scope or the metric attributes, is refused first), then carried out by
`apply()`, which says what changed, one line per change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from opentelemetry.metrics import MeterProvider
from pydantic import BaseModel

from gym_concurrency import (
    MeteredSemaphore,
    SharedLimit,
    observe_concurrency,
    set_flow_names_per_limit,
    set_flow_series_per_limit,
)
from gym_concurrency.attributes import limit_attributes
from gym_concurrency.limits import Limit
from gym_concurrency.limits.adaptive import AdaptiveLimiter
from gym_concurrency.limits.handover_rate import HandoverRate
from gym_concurrency.names import ADMISSION_OUTCOME_ATTRIBUTE, ADMISSION_OUTCOMES
from gym_concurrency.safe_urls import safe_url

from .adaptive_route import RouteFeedback, controller_for
from .asks import RouteAsk, route_ask
from .clients import LimitedClient
from .credential_flows import CredentialFlows
from .failures import RouteFailures
from .settings import ClientLimit, ConcurrencySettings, OperationLimit, RouteLimit
from .settings.fixed import fixed_fields
from .upstream import check_upstream_reload, resize_budgets, upstream_keywords

__all__ = ["LIMITS_SCOPE_KEY", "ConcurrencyLimits", "LimitPlan", "LimitedOperation", "LimitedRoute"]

# Where the middleware leaves its ConcurrencyLimits in every request scope, for dependencies.
LIMITS_SCOPE_KEY = "gym_concurrency.limits"

# Said in a plan's first line (size and how it moves), not as a field of its own.
_SIZE_FIELDS = frozenset({"max_concurrent", "adaptive"})


@dataclass(frozen=True, slots=True)
class LimitedRoute:
    """A configured route limit with its (possibly shared) limit, metric attributes, failure
    responses and, for an adaptive limit or Retry-After auto, the feedback its calls run in."""

    config: RouteLimit
    limit: Limit
    wait_attributes: dict[str, dict[str, str]]  # queue-wait attributes by admission outcome
    failures: RouteFailures
    feedback: RouteFeedback | None = None
    ask: RouteAsk | None = None  # None: every request asks for weight 1 in the default flow
    upstream: bool = False  # its limit also asks a rate budget or an engine signal


@dataclass(frozen=True, slots=True)
class LimitedOperation:
    """A configured operation limit with its limit (whose timeout is `timeout_seconds`)."""

    config: OperationLimit
    limit: Limit


@dataclass(frozen=True, slots=True)
class LimitPlan:
    """What new settings do to one limit: add it, or change a running one (its size, the
    controller that moves it, its other settings). Carried out by `apply()`."""

    kind: Literal["route", "operation", "client"]
    limit: Limit
    config: RouteLimit | OperationLimit | ClientLimit
    previous: RouteLimit | OperationLimit | ClientLimit | None = None  # None: a new limit
    feedback: RouteFeedback | None = None
    old_limiter: AdaptiveLimiter | None = None  # the controller moving it until now
    client: LimitedClient | None = None  # a client limit's transports' source

    @property
    def name(self) -> str:
        return self.config.limit_name

    def apply(self) -> list[str]:
        """Make the limit what `config` says; what changed, one line each."""
        before = self.limit.limit
        how = self._move()
        if self.previous is not None:  # budgets too are resized; said as field changes
            resize_budgets(self.limit, self.previous, self.config)
        if self.previous is None:
            return [f"{self.kind} limit {self.name!r} added: {self.limit.limit}{how}"]
        lines = []
        if before != self.limit.limit or _differ(self.previous, self.config, _SIZE_FIELDS):
            lines.append(f"{self.kind} limit {self.name!r}: {before} -> {self.limit.limit}{how}")
        lines += [
            f"{self.kind} limit {self.name!r}: {field} {old!r} -> {new!r}"
            for field, old, new in _changed_fields(self.previous, self.config)
            if field not in _SIZE_FIELDS
        ]
        return lines

    def _move(self) -> str:
        """Resize the limit or hand it to its controller; how it moves (", static" ...)."""
        config = self.config
        if isinstance(config, ClientLimit):
            assert self.client is not None
            self.client.reconfigure(config)  # the retry policy of every transport made from it
            adaptive_client = config.adaptive
            if adaptive_client is not None:  # its controller moves it (from max_concurrent)
                bounds = f"{adaptive_client.min_concurrent}..{adaptive_client.max_concurrent}"
                return f", adaptive ({adaptive_client.algorithm}, {bounds})"
            if self.limit.limit != config.max_concurrent:
                self.limit.resize(config.max_concurrent)
            return ""
        if not isinstance(config, RouteLimit):  # an operation limit: a fixed size
            if self.limit.limit != config.max_concurrent:
                self.limit.resize(config.max_concurrent)
            return ""
        previous = self.previous
        old = self.old_limiter
        kept = (
            old is not None
            and isinstance(previous, RouteLimit)
            and not _differ(previous, config, _SIZE_FIELDS)
        )
        if kept:  # the same controller goes on moving it
            assert self.feedback is not None
            self.feedback.limiter = old
        elif old is not None:
            old.stop()
        adaptive = config.adaptive
        if adaptive is None:
            if self.limit.limit != config.max_concurrent:
                self.limit.resize(config.max_concurrent)
            return ", static"
        if not kept:
            assert self.feedback is not None
            restart = previous is None or previous.max_concurrent != config.max_concurrent
            start = None if restart else self.limit.limit
            self.feedback.limiter = AdaptiveLimiter(self.limit, controller_for(config, start))
        bounds = f"{adaptive.min_concurrent}..{adaptive.max_concurrent}"
        return f", adaptive ({adaptive.algorithm}, {bounds})"


class ConcurrencyLimits:
    """Every limit made from one ConcurrencySettings, and the meter provider they report to.

    With `previous` (a reload), limits of the same limit_name are kept; ValueError (naming
    the field) for a change that needs a restart. Nothing changes until `apply()`."""

    def __init__(
        self,
        settings: ConcurrencySettings,
        meter_provider: MeterProvider | None = None,
        *,
        previous: ConcurrencyLimits | None = None,
    ) -> None:
        self.settings = settings
        self.meter_provider = meter_provider
        if meter_provider is not None:  # the global provider observes every limit by itself
            observe_concurrency(meter_provider)
        if previous is not None:
            _check_same_attributes(previous.settings, settings)
            if previous.shared():
                _check_shared_settings(previous.settings, settings)
        self._previous = previous
        self._credentials = CredentialFlows(settings)
        self._route_plans: dict[str, LimitPlan] = {}
        self.routes = [self._limited_route(i, config) for i, config in enumerate(settings.routes)]
        self.operations: dict[str, LimitedOperation] = {}
        self._operation_plans: list[LimitPlan] = []
        for index, config in enumerate(settings.operations):
            plan = self._operation_plan(index, config)
            self._operation_plans.append(plan)
            self.operations[config.limit_name] = LimitedOperation(config, plan.limit)
        self.clients: dict[str, LimitedClient] = {}
        self._client_plans: list[LimitPlan] = []
        for index, client_config in enumerate(settings.clients):
            plan = self._client_plan(index, client_config)
            self._client_plans.append(plan)
            assert plan.client is not None
            self.clients[client_config.limit_name] = plan.client
        if previous is None:
            self.apply()

    def apply(self) -> list[str]:
        """Make the running limits what these settings say; what changed, one line each."""
        set_flow_series_per_limit(self.settings.flow_series_per_limit)  # process-wide
        set_flow_names_per_limit(self.settings.flow_names_per_limit)
        plans = [*self._route_plans.values(), *self._operation_plans, *self._client_plans]
        changes = [line for plan in plans for line in plan.apply()]
        previous, self._previous = self._previous, None
        if previous is None:
            return []  # the first settings: nothing changed, everything began
        for name, plan in previous._route_plans.items():
            if name not in self._route_plans:
                changes.append(f"route limit {name!r} removed")
                if plan.feedback is not None and plan.feedback.limiter is not None:
                    plan.feedback.limiter.stop()
        changes += [
            f"operation limit {name!r} removed"
            for name in previous.operations
            if name not in self.operations
        ]
        changes += [
            f"client limit {name!r} removed"
            for name in previous.clients
            if name not in self.clients
        ]
        changes += [  # settings of every limit: the body bounds, close_connection_on_refusal
            f"{field} {_shown(field, old)} -> {_shown(field, new)}"
            for field, old, new in _changed_fields(previous.settings, self.settings)
            if field not in ("routes", "operations", "clients")
        ]
        return changes

    def limits(self) -> list[Limit]:
        """Every limit these settings made, routes' then operations' then clients'."""
        made = [plan.limit for plan in self._route_plans.values()]
        made += [operation.limit for operation in self.operations.values()]
        return made + [client.limit for client in self.clients.values()]

    def shared(self) -> list[SharedLimit]:
        """The limits shared across processes (scope global): connected at start, closed at
        shutdown."""
        return [limit for limit in self.limits() if isinstance(limit, SharedLimit)]

    def feedbacks(self) -> list[RouteFeedback]:
        """The feedback of every limit that has one (adaptive, or Retry-After auto)."""
        plans = self._route_plans.values()
        return [plan.feedback for plan in plans if plan.feedback is not None]

    def operation(self, limit_name: str) -> LimitedOperation:
        """The operation limit named `limit_name`; KeyError naming the configured ones if none."""
        try:
            return self.operations[limit_name]
        except KeyError:
            raise KeyError(
                f"no OperationLimit has limit_name {limit_name!r}; "
                f"configured: {sorted(self.operations) or 'none'}"
            ) from None

    def client(self, limit_name: str) -> LimitedClient:
        """The client limit named `limit_name`; KeyError naming the configured ones if none."""
        try:
            return self.clients[limit_name]
        except KeyError:
            raise KeyError(
                f"no ClientLimit has limit_name {limit_name!r}; "
                f"configured: {sorted(self.clients) or 'none'}"
            ) from None

    def _limited_route(self, index: int, config: RouteLimit) -> LimitedRoute:
        plan = self._route_plans.get(config.limit_name)
        if plan is None:
            plan = self._route_plans[config.limit_name] = self._route_plan(index, config)
        base = limit_attributes(plan.limit)  # scope="global" on a shared limit's, as observed
        by_outcome = {o: {**base, ADMISSION_OUTCOME_ATTRIBUTE: o} for o in ADMISSION_OUTCOMES}
        feedback = plan.feedback
        retry_after = None
        if config.retry_after_seconds == "auto" and feedback is not None:
            retry_after = feedback.retry_after
        failures = RouteFailures(
            config,
            close_connection=self.settings.close_connection_on_refusal,
            retry_after=retry_after,
            # A process limit measures its hand-over rate for waiters with deadlines.
            handover_wait=plan.limit.handover_wait
            if isinstance(plan.limit, MeteredSemaphore)
            else None,
        )
        ask = route_ask(config, plan.limit, self._credentials)
        upstream = config.has_upstream
        return LimitedRoute(config, plan.limit, by_outcome, failures, feedback, ask, upstream)

    def _route_plan(self, index: int, config: RouteLimit) -> LimitPlan:
        """The plan for a route limit_name: its limit (kept from `previous` if it had it),
        the feedback its calls run in, and the controller moving it until now."""
        old = self._previous._route_plans.get(config.limit_name) if self._previous else None
        if old is None:
            limit, old_feedback, previous = self._make_limit(config), None, None
        else:
            limit, old_feedback, previous = old.limit, old.feedback, old.config
            _check_unchanged(f"routes.{index}", old.config, config)
        rate = None
        if config.retry_after_seconds == "auto":
            kept = old_feedback.handover if old_feedback else None
            rate = kept or HandoverRate()
        feedback = None
        if config.adaptive is not None or rate is not None:
            feedback = RouteFeedback(limit, config, handover=rate)
        old_limiter = old_feedback.limiter if old_feedback else None
        return LimitPlan("route", limit, config, previous, feedback, old_limiter)

    def _operation_plan(self, index: int, config: OperationLimit) -> LimitPlan:
        old = self._previous.operations.get(config.limit_name) if self._previous else None
        if old is None:
            return LimitPlan("operation", self._make_limit(config), config)
        _check_unchanged(f"operations.{index}", old.config, config)
        return LimitPlan("operation", old.limit, config, old.config)

    def _client_plan(self, index: int, config: ClientLimit) -> LimitPlan:
        old = self._previous.clients.get(config.limit_name) if self._previous else None
        if old is None:
            limit = self._make_limit(config)
            client = LimitedClient(config, limit, self.meter_provider)
            return LimitPlan("client", limit, config, client=client)
        _check_unchanged(f"clients.{index}", old.config, config)
        return LimitPlan("client", old.limit, config, old.config, client=old)

    def _make_limit(self, config: RouteLimit | OperationLimit | ClientLimit) -> Limit:
        """A process's own MeteredSemaphore, or for `scope="global"` a SharedLimit."""
        if isinstance(config, RouteLimit):
            timeout, max_queue = config.queue_timeout_seconds, config.max_queue
        elif isinstance(config, ClientLimit):
            timeout, max_queue = config.timeout_seconds, config.max_queue
        else:
            timeout, max_queue = config.timeout_seconds, None
        settings = self.settings
        if config.scope == "process":
            return MeteredSemaphore(
                config.max_concurrent,
                component=settings.component,
                limit_name=config.limit_name,
                server=settings.server_name,
                timeout=timeout,
                max_queue=max_queue,
                backfill_seconds=config.backfill_seconds,
                **upstream_keywords(config),
            )
        assert settings.redis_url is not None  # checked by the settings
        local = settings.redis_unavailable == "local"
        return SharedLimit(
            config.max_concurrent,
            backfill_seconds=config.backfill_seconds,
            redis_url=settings.redis_url,
            component=settings.component,
            limit_name=config.limit_name,
            server=settings.server_name,
            timeout=timeout,
            max_queue=max_queue,
            key_prefix=_key_prefix(settings.redis_key_prefix),
            lease_seconds=settings.redis_lease_seconds,
            redis_timeout=min(1.0, settings.redis_lease_seconds / 3),
            redis_unavailable=settings.redis_unavailable,
            local_max_concurrent=(config.local_max_concurrent or config.max_concurrent)
            if local
            else None,
            **upstream_keywords(config),
        )


def _changed_fields(old: BaseModel, new: BaseModel) -> list[tuple[str, object, object]]:
    """(field, old value, new value) for every field the two configurations set differently."""
    before, after = old.model_dump(), new.model_dump()
    return [(name, before[name], value) for name, value in after.items() if before[name] != value]


def _differ(
    old: RouteLimit | OperationLimit | ClientLimit,
    new: RouteLimit | OperationLimit | ClientLimit,
    fields: frozenset[str],
) -> bool:
    return any(field in fields for field, _, _ in _changed_fields(old, new))


def _check_same_attributes(old: ConcurrencySettings, new: ConcurrencySettings) -> None:
    for field, before, after in (
        ("component", old.component, new.component),
        ("server_name", old.server_name, new.server_name),
    ):
        if before != after:
            raise ValueError(
                f"{field}: the running limits report as {before!r}; a reload cannot change it "
                f"to {after!r} (restart the server)"
            )


def _shown(field: str, value: object) -> str:
    """`value` for a log line: a Redis URL without its passwords and tokens."""
    if field == "redis_url" and isinstance(value, str):
        return repr(safe_url(value))
    return repr(value)


def _check_shared_settings(old: ConcurrencySettings, new: ConcurrencySettings) -> None:
    """A reload cannot move running global limits to another Redis, mode or lease."""
    fixed = fixed_fields(ConcurrencySettings)
    for field, _, _ in _changed_fields(old, new):
        if field in fixed:
            raise ValueError(
                f"{field}: the running global limits were made with the old value; a reload "
                "cannot change it (restart the server)"
            )


def _check_unchanged(
    where: str,
    old: RouteLimit | OperationLimit | ClientLimit,
    new: RouteLimit | OperationLimit | ClientLimit,
) -> None:
    """ValueError naming the first field marked Fixed (settings/fixed.py) that `new` changes."""
    fixed = fixed_fields(type(new))
    check_upstream_reload(where, old, new)  # budgets on / off, the engine
    for field, before, _ in _changed_fields(old, new):
        if field in fixed:
            raise ValueError(
                f"{where}.{field}: limit {new.limit_name!r} is running with {field}={before!r}; "
                "a reload changes sizes, adaptive settings, failure profiles and Retry-After, "
                "not a running limit's queue timeout or queue bound (restart the server to "
                "change it, or give the limit a new limit_name)"
            )


def _key_prefix(prefix: str | None) -> str:
    """The Redis key prefix of a global limit: `gym_concurrency`, after the settings' own."""
    return "gym_concurrency" if prefix is None else f"{prefix}:gym_concurrency"
