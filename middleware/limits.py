"""The semaphores one middleware makes from its settings: one per route limit_name and one per
operation limit, each carrying the settings' component and server name."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.metrics import MeterProvider

from gym_concurrency import MeteredSemaphore, observe_concurrency
from gym_concurrency.limit import Limit
from gym_concurrency.names import (
    ADMISSION_OUTCOME_ATTRIBUTE,
    ADMISSION_OUTCOMES,
    COMPONENT_ATTRIBUTE,
    LIMIT_NAME_ATTRIBUTE,
    SERVER_ATTRIBUTE,
)

from .failures import RouteFailures
from .settings import ConcurrencySettings, OperationLimit, RouteLimit

__all__ = ["LIMITS_SCOPE_KEY", "ConcurrencyLimits", "LimitedOperation", "LimitedRoute"]

# Where the middleware leaves its ConcurrencyLimits in every request scope, for dependencies.
LIMITS_SCOPE_KEY = "gym_concurrency.limits"


@dataclass(frozen=True, slots=True)
class LimitedRoute:
    """A configured route limit with its (possibly shared) limit, metric attributes and
    failure responses."""

    config: RouteLimit
    limit: Limit
    wait_attributes: dict[str, dict[str, str]]  # queue-wait attributes by admission outcome
    failures: RouteFailures


@dataclass(frozen=True, slots=True)
class LimitedOperation:
    """A configured operation limit with its semaphore (whose timeout is `timeout_seconds`)."""

    config: OperationLimit
    semaphore: MeteredSemaphore


class ConcurrencyLimits:
    """Every semaphore made from one ConcurrencySettings, and the meter provider they report to."""

    def __init__(
        self, settings: ConcurrencySettings, meter_provider: MeterProvider | None = None
    ) -> None:
        self.settings = settings
        self.meter_provider = meter_provider
        if meter_provider is not None:  # the global provider observes every limit by itself
            observe_concurrency(meter_provider)
        shared: dict[str, MeteredSemaphore] = {}
        self.routes = [self._limited_route(config, shared) for config in settings.routes]
        self.operations = {
            config.limit_name: LimitedOperation(config, self._semaphore(config))
            for config in settings.operations
        }

    def operation(self, limit_name: str) -> LimitedOperation:
        """The operation limit named `limit_name`; KeyError naming the configured ones if none."""
        try:
            return self.operations[limit_name]
        except KeyError:
            raise KeyError(
                f"no OperationLimit has limit_name {limit_name!r}; "
                f"configured: {sorted(self.operations) or 'none'}"
            ) from None

    def _limited_route(
        self, config: RouteLimit, shared: dict[str, MeteredSemaphore]
    ) -> LimitedRoute:
        semaphore = shared.get(config.limit_name)
        if semaphore is None:
            semaphore = shared[config.limit_name] = self._semaphore(config)
        base = self._attributes(config.limit_name)
        by_outcome = {o: {**base, ADMISSION_OUTCOME_ATTRIBUTE: o} for o in ADMISSION_OUTCOMES}
        failures = RouteFailures(
            config, close_connection=self.settings.close_connection_on_refusal
        )
        return LimitedRoute(config, semaphore, by_outcome, failures)

    def _semaphore(self, config: RouteLimit | OperationLimit) -> MeteredSemaphore:
        if isinstance(config, RouteLimit):
            timeout, max_queue = config.queue_timeout_seconds, config.max_queue
        else:
            timeout, max_queue = config.timeout_seconds, None
        return MeteredSemaphore(
            config.max_concurrent,
            component=self.settings.component,
            limit_name=config.limit_name,
            server=self.settings.server_name,
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
