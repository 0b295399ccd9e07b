"""The semaphores one middleware makes from its settings: one per route limit_name and one per
operation limit, each carrying the settings' component and server name.

Made again from new settings (`previous=`, a reload), the limits keep their semaphores by
limit_name: held slots and waiters stay where they are, and only what `apply()` changes moves
(sizes, adaptive controllers). Changes a running semaphore cannot take (its queue timeout,
its queue bound, the metric attributes) are refused before anything is applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.metrics import MeterProvider

from gym_concurrency import MeteredSemaphore, observe_concurrency
from gym_concurrency.limits import Limit
from gym_concurrency.limits.adaptive import AdaptiveLimiter, DrainRate

if TYPE_CHECKING:
    from gym_concurrency import SharedLimit
from gym_concurrency.names import (
    ADMISSION_OUTCOME_ATTRIBUTE,
    ADMISSION_OUTCOMES,
    COMPONENT_ATTRIBUTE,
    LIMIT_NAME_ATTRIBUTE,
    SERVER_ATTRIBUTE,
)

from .adaptive_route import RouteFeedback, controller_for
from .failures import RouteFailures
from .settings import ConcurrencySettings, OperationLimit, RouteLimit

__all__ = ["LIMITS_SCOPE_KEY", "ConcurrencyLimits", "LimitedOperation", "LimitedRoute"]

# Where the middleware leaves its ConcurrencyLimits in every request scope, for dependencies.
LIMITS_SCOPE_KEY = "gym_concurrency.limits"


@dataclass(frozen=True, slots=True)
class LimitedRoute:
    """A configured route limit with its (possibly shared) limit, metric attributes, failure
    responses and, for an adaptive limit or Retry-After auto, the feedback its calls run in."""

    config: RouteLimit
    limit: Limit
    wait_attributes: dict[str, dict[str, str]]  # queue-wait attributes by admission outcome
    failures: RouteFailures
    feedback: RouteFeedback | None = None


@dataclass(frozen=True, slots=True)
class LimitedOperation:
    """A configured operation limit with its semaphore (whose timeout is `timeout_seconds`)."""

    config: OperationLimit
    semaphore: MeteredSemaphore


class ConcurrencyLimits:
    """Every semaphore made from one ConcurrencySettings, and the meter provider they report to.

    With `previous` (a reload), semaphores of the same limit_name are kept; ValueError (naming
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
        self._previous = previous
        self._pending: list[Callable[[], str | None]] = []
        self._route_limits: dict[str, tuple[MeteredSemaphore, RouteFeedback | None, RouteLimit]]
        self._route_limits = {}
        self.routes = [self._limited_route(i, config) for i, config in enumerate(settings.routes)]
        self.operations = {
            config.limit_name: LimitedOperation(config, self._operation_semaphore(i, config))
            for i, config in enumerate(settings.operations)
        }
        if previous is None:
            self.apply()

    def apply(self) -> list[str]:
        """Make the running limits what these settings say; what changed, one line each."""
        changes = [change for step in self._pending if (change := step()) is not None]
        self._pending.clear()
        previous, self._previous = self._previous, None
        if previous is not None:
            for name, (_, feedback, _) in previous._route_limits.items():
                if name not in self._route_limits:
                    changes.append(f"route limit {name!r} removed")
                    if feedback is not None and feedback.limiter is not None:
                        feedback.limiter.stop()
            changes += [
                f"operation limit {name!r} removed"
                for name in previous.operations
                if name not in self.operations
            ]
        return changes

    def shared(self) -> list[SharedLimit]:
        """The limits shared across processes (scope global): connected at start, closed at
        shutdown."""
        limits: list[object] = [semaphore for semaphore, _, _ in self._route_limits.values()]
        limits += [operation.semaphore for operation in self.operations.values()]
        shared = [limit for limit in limits if getattr(limit, "scope", None) == "global"]
        return shared  # type: ignore[return-value]

    def feedbacks(self) -> list[RouteFeedback]:
        """The feedback of every limit that has one (adaptive, or Retry-After auto)."""
        return [f for _, f, _ in self._route_limits.values() if f is not None]

    def operation(self, limit_name: str) -> LimitedOperation:
        """The operation limit named `limit_name`; KeyError naming the configured ones if none."""
        try:
            return self.operations[limit_name]
        except KeyError:
            raise KeyError(
                f"no OperationLimit has limit_name {limit_name!r}; "
                f"configured: {sorted(self.operations) or 'none'}"
            ) from None

    def _limited_route(self, index: int, config: RouteLimit) -> LimitedRoute:
        found = self._route_limits.get(config.limit_name)
        if found is None:
            found = self._route_limits[config.limit_name] = self._route_limit(index, config)
        semaphore, feedback, _ = found
        base = self._attributes(config.limit_name)
        by_outcome = {o: {**base, ADMISSION_OUTCOME_ATTRIBUTE: o} for o in ADMISSION_OUTCOMES}
        retry_after = None
        if config.retry_after_seconds == "auto" and feedback is not None:
            retry_after = feedback.retry_after
        failures = RouteFailures(
            config, close_connection=self.settings.close_connection_on_refusal,
            retry_after=retry_after,
        )
        return LimitedRoute(config, semaphore, by_outcome, failures, feedback)

    def _route_limit(
        self, index: int, config: RouteLimit
    ) -> tuple[MeteredSemaphore, RouteFeedback | None, RouteLimit]:
        """The semaphore of a route limit_name (kept from `previous` if it had it), its feedback
        and the config it was made from; its size and controller change in `apply()`."""
        name = config.limit_name
        old = self._previous._route_limits.get(name) if self._previous else None
        if old is None:
            semaphore = self._semaphore(config)
            old_feedback, old_config = None, None
        else:
            semaphore, old_feedback, old_config = old
            for field in ("queue_timeout_seconds", "max_queue", "scope"):
                _check_unchanged(f"routes.{index}.{field}", name, old_config, config, field)
        drain = None
        if config.retry_after_seconds == "auto":
            drain = old_feedback.drain if old_feedback and old_feedback.drain else DrainRate()
        feedback = None
        if config.adaptive is not None or drain is not None:
            feedback = RouteFeedback(semaphore, config, drain=drain)
        old_limiter = old_feedback.limiter if old_feedback else None
        keep = (
            old_limiter is not None
            and old_config is not None
            and old_config.adaptive == config.adaptive
            and old_config.max_concurrent == config.max_concurrent
        )

        def resize() -> str | None:
            before = semaphore.limit
            if keep:
                assert feedback is not None
                feedback.limiter = old_limiter
                return None
            if old_limiter is not None:
                old_limiter.stop()
            if config.adaptive is not None:
                assert feedback is not None
                restart = old_config is None or old_config.max_concurrent != config.max_concurrent
                start = None if restart else before
                feedback.limiter = AdaptiveLimiter(semaphore, controller_for(config, start))
                bounds = f"{config.adaptive.min_concurrent}..{config.adaptive.max_concurrent}"
                what = f"adaptive ({config.adaptive.algorithm}, {bounds})"
            else:
                if before != config.max_concurrent:
                    semaphore.resize(config.max_concurrent)
                what = "static"
            if old is None:
                return f"route limit {name!r} added: {semaphore.limit}, {what}"
            if before == semaphore.limit and old_config == config:
                return None
            return f"route limit {name!r}: {before} -> {semaphore.limit}, {what}"

        self._pending.append(resize)
        return semaphore, feedback, config

    def _operation_semaphore(self, index: int, config: OperationLimit) -> MeteredSemaphore:
        old = self._previous.operations.get(config.limit_name) if self._previous else None
        if old is None:
            semaphore = self._semaphore(config)
            self._pending.append(
                lambda: f"operation limit {config.limit_name!r} added: {config.max_concurrent}"
                if self._previous is not None
                else None
            )
            return semaphore
        for name in ("timeout_seconds", "scope"):
            field = f"operations.{index}.{name}"
            _check_unchanged(field, config.limit_name, old.config, config, name)
        semaphore = old.semaphore

        def resize() -> str | None:
            before = semaphore.limit
            if before == config.max_concurrent:
                return None
            semaphore.resize(config.max_concurrent)
            return f"operation limit {config.limit_name!r}: {before} -> {config.max_concurrent}"

        self._pending.append(resize)
        return semaphore

    def _semaphore(self, config: RouteLimit | OperationLimit) -> MeteredSemaphore:
        """A process's own semaphore, or for `scope="global"` a SharedLimit (which implements
        the same Limit protocol; typed as the semaphore everywhere it is used as one)."""
        if isinstance(config, RouteLimit):
            timeout, max_queue = config.queue_timeout_seconds, config.max_queue
        else:
            timeout, max_queue = config.timeout_seconds, None
        settings = self.settings
        if config.scope == "global":
            from gym_concurrency import SharedLimit  # the [redis] extra

            assert settings.redis_url is not None  # checked by the settings
            local = settings.redis_unavailable == "local"
            shared = SharedLimit(
                config.max_concurrent,
                redis_url=settings.redis_url,
                component=settings.component,
                limit_name=config.limit_name,
                server=settings.server_name,
                timeout=timeout,
                max_queue=max_queue,
                lease_seconds=settings.redis_lease_seconds,
                redis_timeout=min(1.0, settings.redis_lease_seconds / 3),
                redis_unavailable=settings.redis_unavailable,
                local_max_concurrent=(config.local_max_concurrent or config.max_concurrent)
                if local
                else None,
            )
            return shared  # type: ignore[return-value]
        return MeteredSemaphore(
            config.max_concurrent,
            component=settings.component,
            limit_name=config.limit_name,
            server=settings.server_name,
            timeout=timeout,
            max_queue=max_queue,
        )

    def _attributes(self, limit_name: str) -> dict[str, str]:
        attributes = {
            COMPONENT_ATTRIBUTE: self.settings.component,
            LIMIT_NAME_ATTRIBUTE: limit_name,
        }
        if self.settings.server_name is not None:
            attributes[SERVER_ATTRIBUTE] = self.settings.server_name
        return attributes


def _check_same_attributes(old: ConcurrencySettings, new: ConcurrencySettings) -> None:
    for field in ("component", "server_name"):
        if getattr(old, field) != getattr(new, field):
            raise ValueError(
                f"{field}: the running limits report as {getattr(old, field)!r}; a reload "
                f"cannot change it to {getattr(new, field)!r} (restart the server)"
            )


def _check_unchanged(
    where: str,
    name: str,
    old: RouteLimit | OperationLimit,
    new: RouteLimit | OperationLimit,
    field: str,
) -> None:
    if getattr(old, field) != getattr(new, field):
        raise ValueError(
            f"{where}: limit {name!r} is running with {field}={getattr(old, field)!r}; a "
            "reload changes sizes, adaptive settings, failure profiles and Retry-After, not "
            "a running limit's queue timeout or queue bound (restart the server to change "
            "it, or give the limit a new limit_name)"
        )
