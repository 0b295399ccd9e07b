"""ConcurrencySettings, RouteLimit, OperationLimit, ClientLimit, AdaptiveLimit: what to limit,
how hard, and how to fail.

Read from keyword arguments, from `GYM_CONCURRENCY_*` environment variables (JSON for the
lists, `__` for nesting) or from a YAML / JSON file with `ConcurrencySettings.from_file`;
keyword arguments win over the environment, and the environment over the file. Every invalid
value fails with an error that names the field: numbers must be numbers (no booleans, no YAML
1.1 octal or sexagesimal), and an unknown `GYM_CONCURRENCY_*` variable, two forms of one
setting or a gap in entry indexes is an error naming the variable.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gym_concurrency.clients import RetryPolicy
from gym_concurrency.limits import LimitScope
from gym_concurrency.limits.adaptive import Algorithm
from gym_concurrency.names import EXECUTORS, OPERATIONS, check_member
from gym_concurrency.tokens import DEFAULT_OUTPUT_TOKENS

from .asks import DeadlineHeader, DeadlineSource, FlowSource, WeightSource, check_ask
from .client_asks import (
    ClientFlowSource,
    ClientWeightSource,
    check_client_ask,
    check_client_flow_headers,
)
from .credentials import (
    CredentialHeaders,
    FlowKey,
    FlowLabels,
    check_flow_labels,
    without_input,
)
from .environment import READ_ENVIRONMENT, EnvironmentSource, environment_values
from .files import load_mapping
from .fixed import Fixed
from .names import (
    check_client_names,
    check_no_overlapping_routes,
    check_operation_names,
    check_shared_route_limits,
)
from .numbers import NumbersAreNumbers, number
from .upstream import EngineSignalSettings, UpstreamFields

__all__ = [
    "DEFAULT_MAX_QUEUED_BODY_BYTES",
    "DEFAULT_MAX_QUEUED_BODY_BYTES_TOTAL",
    "DEFAULT_REFUSAL_BODY_TIMEOUT_SECONDS",
    "AdaptiveLimit",
    "ClientLimit",
    "ClientRetry",
    "ConcurrencySettings",
    "EngineSignalSettings",
    "FailureProfile",
    "OperationLimit",
    "RouteLimit",
]

FailureProfile = Literal["problem", "openai", "episode"]

_METHOD = re.compile(r"^[A-Z]+$")
_Name = Annotated[str, Field(min_length=1, max_length=200)]
_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# How long lighter waiters may pass a blocked one (docs/flows.md, "Backfill"); 0: never.
_Backfill = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_KeyPrefix = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^{}\s]+$")]
# Bodies of queued requests are held in memory: 1 MiB each and 64 MiB over all of them,
# unless configured otherwise; past either bound a queued request stops being read.
DEFAULT_MAX_QUEUED_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_QUEUED_BODY_BYTES_TOTAL = 64 * 1024 * 1024
# How long an episode refusal waits for the rest of a body to echo its ids (a slowloris bound).
DEFAULT_REFUSAL_BODY_TIMEOUT_SECONDS = 5.0


class AdaptiveLimit(NumbersAreNumbers):
    """A route limit that moves (docs/adaptive-limits.md): it follows the latency of admitted
    requests and shrinks on overload answers (`overload_status_codes`) or exceptions from the
    app, never below `min_concurrent` nor above `max_concurrent`. The route's `max_concurrent`
    is where it starts. `latency_tolerance`: how many times the unloaded latency is still
    healthy (None, AIMD only: latency is ignored, overload answers alone move it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_concurrent: int = Field(ge=1)
    max_concurrent: int = Field(ge=1)
    algorithm: Algorithm = "gradient"
    latency_tolerance: float | None = Field(default=1.25, gt=1, allow_inf_nan=False)
    overload_status_codes: tuple[int, ...] = (429, 503)

    @field_validator("overload_status_codes")
    @classmethod
    def _status_codes(cls, codes: tuple[int, ...]) -> tuple[int, ...]:
        for code in codes:
            if not 100 <= code <= 599:
                raise ValueError(f"{code} is not an HTTP status code")
        return codes

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_concurrent > self.max_concurrent:
            raise ValueError(
                f"min_concurrent ({self.min_concurrent}) is above max_concurrent "
                f"({self.max_concurrent})"
            )
        if self.algorithm == "gradient" and self.latency_tolerance is None:
            raise ValueError("latency_tolerance: the gradient algorithm needs one (e.g. 1.25)")
        return self


def _check_adaptive_start(adaptive: AdaptiveLimit | None, max_concurrent: int) -> None:
    """An adaptive limit starts at max_concurrent, which must be within its bounds."""
    if adaptive is not None and not (
        adaptive.min_concurrent <= max_concurrent <= adaptive.max_concurrent
    ):
        raise ValueError(
            f"max_concurrent: an adaptive limit starts at max_concurrent ({max_concurrent}), "
            f"which must be within adaptive.min_concurrent..adaptive.max_concurrent "
            f"({adaptive.min_concurrent}..{adaptive.max_concurrent})"
        )


class RouteLimit(UpstreamFields):
    """A concurrency limit on one route (its declared path template), optionally per method.

    Routes naming the same `limit_name` share one limit, so they must agree on its size,
    queue timeout and queue bound. Budgets and `engine`: UpstreamFields; `tokens` is what a
    request reserves of them, read as `weight` is (None: the weight's rule).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    methods: tuple[str, ...] | None = None
    limit_name: _Name
    max_concurrent: int = Field(ge=1)
    # Fixed (reload): its waiters were admitted under these; a reload names the field.
    queue_timeout_seconds: Annotated[_Seconds | None, Fixed] = None
    max_queue: Annotated[int | None, Fixed] = Field(default=None, ge=0)
    failure: FailureProfile = "problem"
    # Whole seconds; "auto": how long the queue ahead would take to clear at the measured rate.
    retry_after_seconds: Annotated[int, Field(ge=0)] | Literal["auto"] | None = None
    adaptive: AdaptiveLimit | None = None
    # "global": one limit shared by every process that configures this limit_name against the
    # same Redis (ConcurrencySettings.redis_url); "process": this process's own.
    scope: Annotated[LimitScope, Fixed] = "process"
    # Slots this process admits on its own while Redis cannot be reached, with
    # redis_unavailable="local" (None: max_concurrent).
    local_max_concurrent: Annotated[int | None, Fixed] = Field(default=None, ge=1)
    # Where a request's flow, weight and deadline come from (docs/flows.md, docs/deadlines.md).
    deadline: DeadlineSource | None = None
    flow: FlowSource | None = None
    weight: WeightSource = 1
    tokens: WeightSource | None = None
    default_output_tokens: int = Field(default=DEFAULT_OUTPUT_TOKENS, ge=1)
    backfill_seconds: Annotated[_Backfill, Fixed] = 0.0

    @field_validator("retry_after_seconds", mode="before")
    @classmethod
    def _auto_or_a_number(cls, value: Any) -> Any:
        # The one string allowed is "auto"; any other text must spell a decimal number.
        if isinstance(value, str) and value.strip() != "auto":
            return number(int, value, strings=False)
        return value.strip() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _starts_within_its_adaptive_bounds(self) -> Self:
        _check_adaptive_start(self.adaptive, self.max_concurrent)
        check_ask(self.path, self.flow, self.weight, self.max_concurrent)
        self.check_upstream(self.tokens)
        return self

    @field_validator("path")
    @classmethod
    def _path_is_absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"must start with '/' (a route's declared template), got {path!r}")
        return path

    @field_validator("methods", mode="before")
    @classmethod
    def _methods_from_one_string(cls, methods: Any) -> Any:
        # A nested env var (GYM_CONCURRENCY_ROUTES__0__METHODS) arrives as one string:
        # "POST", "GET,POST" or a JSON list.
        if not isinstance(methods, str):
            return methods
        if methods.lstrip().startswith("["):
            return json.loads(methods)
        return tuple(part.strip() for part in methods.split(","))

    @field_validator("methods")
    @classmethod
    def _methods_are_upper_case(cls, methods: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if methods is None:
            return None
        if not methods:
            raise ValueError("must name at least one method, or be null for every method")
        for method in methods:
            if not _METHOD.match(method):
                raise ValueError(f"{method!r} is not an upper-case HTTP method such as 'POST'")
        if len(set(methods)) != len(methods):
            raise ValueError(f"names a method twice: {list(methods)}")
        return methods


class OperationLimit(UpstreamFields):
    """A concurrency limit on work done inside routes (verifier, judge, tool), used through
    `operation_limit(limit_name)`; `timeout_seconds` bounds the wait for a slot. Budgets and
    `engine`: UpstreamFields; `tokens`: what each operation reserves (None: its weight)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit_name: _Name
    operation: str
    executor: str
    max_concurrent: int = Field(ge=1)
    timeout_seconds: Annotated[_Seconds | None, Fixed] = None
    scope: Annotated[LimitScope, Fixed] = "process"  # as RouteLimit.scope
    local_max_concurrent: Annotated[int | None, Fixed] = Field(default=None, ge=1)  # as Route's
    backfill_seconds: Annotated[_Backfill, Fixed] = 0.0  # as RouteLimit's
    tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _upstream(self) -> Self:
        self.check_upstream(self.tokens)
        return self

    @field_validator("operation")
    @classmethod
    def _known_operation(cls, operation: str) -> str:
        return check_member("operation", operation, OPERATIONS)

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, executor: str) -> str:
        return check_member("executor", executor, EXECUTORS)


class ClientRetry(NumbersAreNumbers):
    """How a client limit's calls are retried: the fields of
    `gym_concurrency.clients.RetryPolicy`, with its defaults (docs/clients.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=4, ge=1)
    statuses: tuple[int, ...] = (429, 502, 503, 504)
    backoff_seconds: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    backoff_max_seconds: float = Field(default=8.0, ge=0, allow_inf_nan=False)
    max_retry_after_seconds: float = Field(default=120.0, ge=0, allow_inf_nan=False)
    budget_ratio: float = Field(default=0.2, ge=0, allow_inf_nan=False)
    budget_min_per_second: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    deadline_seconds: _Seconds | None = None
    retry_after_jitter: float = Field(default=0.1, ge=0, le=1, allow_inf_nan=False)

    @field_validator("statuses")
    @classmethod
    def _status_codes(cls, codes: tuple[int, ...]) -> tuple[int, ...]:
        for code in codes:
            if not 100 <= code <= 599:
                raise ValueError(f"{code} is not an HTTP status code")
        return codes

    def policy(self) -> RetryPolicy:
        """The RetryPolicy these settings describe."""
        return RetryPolicy(**self.model_dump())


class ClientLimit(UpstreamFields):
    """A concurrency limit on the calls this server makes to one upstream (a judge, a model, a
    tool): every attempt takes a slot (docs/clients.md). `timeout_seconds` / `max_queue` bound
    the wait for a slot; `retry` (None: one attempt per call) retries the calls; `adaptive`
    moves the limit from the upstream's answers, starting at `max_concurrent`; `flow` and
    `weight`: what each call asks for, unless the code making the client says;
    `deadline_header` (None: off) sends each attempt what is left of the call's deadline.
    Budgets and `engine`: UpstreamFields; `tokens`: what a call reserves of them (None: the
    weight's rule), settled from its response's usage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit_name: _Name
    max_concurrent: int = Field(ge=1)
    timeout_seconds: Annotated[_Seconds | None, Fixed] = None
    max_queue: Annotated[int | None, Fixed] = Field(default=None, ge=0)
    # "route": a call goes in the flow of the request being handled (docs/clients.md).
    flow: ClientFlowSource = "route"
    weight: ClientWeightSource = 1
    tokens: ClientWeightSource | None = None
    retry: ClientRetry | None = Field(default_factory=ClientRetry)
    # Fixed: its controller lives in every transport made from it (moving it: a restart).
    adaptive: Annotated[AdaptiveLimit | None, Fixed] = None
    scope: Annotated[LimitScope, Fixed] = "process"  # as RouteLimit.scope
    local_max_concurrent: Annotated[int | None, Fixed] = Field(default=None, ge=1)  # as Route's
    backfill_seconds: Annotated[_Backfill, Fixed] = 0.0  # as RouteLimit's
    deadline_header: DeadlineHeader | None = None  # e.g. x-envoy-expected-rq-timeout-ms

    @model_validator(mode="after")
    def _starts_within_its_adaptive_bounds(self) -> Self:
        _check_adaptive_start(self.adaptive, self.max_concurrent)
        check_client_ask(self.weight, self.max_concurrent)
        self.check_upstream(self.tokens)
        return self


class ConcurrencySettings(NumbersAreNumbers, BaseSettings):
    """Every limit of one server: its route limits, its operation limits and its client
    limits (the calls it makes)."""

    model_config = SettingsConfigDict(
        env_prefix="GYM_CONCURRENCY_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    component: _Name = "resources_server"
    server_name: _Name | None = None
    routes: list[RouteLimit] = Field(default_factory=list)
    operations: list[OperationLimit] = Field(default_factory=list)
    clients: list[ClientLimit] = Field(default_factory=list)
    max_queued_body_bytes: int = Field(default=DEFAULT_MAX_QUEUED_BODY_BYTES, ge=0)
    max_queued_body_bytes_total: int = Field(default=DEFAULT_MAX_QUEUED_BODY_BYTES_TOTAL, ge=0)
    refusal_body_timeout_seconds: _Seconds = DEFAULT_REFUSAL_BODY_TIMEOUT_SECONDS
    # A refused client that sends again at once is then out of the server's hot loop for a
    # reconnect; without it, shedding at 16x overload collapses goodput (docs/performance.md).
    close_connection_on_refusal: bool = True
    # On shutdown, how long admitted requests may run on (queued ones are refused at once).
    drain_timeout_seconds: _Seconds = 30.0
    # Per-flow series each limit exports: its busiest flows on their own (by name, or in rank
    # slots "top:N" once it has named flow_names_per_limit flows), the rest as flow "other".
    flow_series_per_limit: int = Field(default=5, ge=0)
    flow_names_per_limit: int = Field(default=32, ge=0)
    # Flows read from credentials are HMACs under flow_key, a secret every replica shares
    # (None: a key made per process); credential_headers adds to the built-in ones, and
    # flow_labels names hashed flows ({"h:<16 hex>": "team-a"}). docs/flows.md.
    flow_key: FlowKey = None
    credential_headers: CredentialHeaders = ()
    flow_labels: FlowLabels = Field(default_factory=dict)
    # Limits with scope="global" live in this Redis (or Valkey): redis://host:port/db.
    # Fixed (reload, with global limits running): they connected with these at start.
    redis_url: Annotated[str | None, Fixed] = None
    # Redis unreachable: "refuse" answers with the failure profile (reason unavailable);
    # "local" admits through a process-local limit of local_max_concurrent slots.
    redis_unavailable: Annotated[Literal["refuse", "local"], Fixed] = "refuse"
    # A global slot is a lease, renewed by one heartbeat per process every third of this.
    redis_lease_seconds: Annotated[_Seconds, Fixed] = 10.0
    # Put before every Redis key of this server's global limits (which are already named by
    # component, server_name and limit_name): deployments sharing those stay apart.
    redis_key_prefix: Annotated[_KeyPrefix | None, Fixed] = None

    @field_validator("routes", "operations", "clients", mode="before")
    @classmethod
    def _indexed_entries_are_a_list(cls, value: Any) -> Any:
        # GYM_CONCURRENCY_ROUTES__0__PATH=/run nests as {"0": {"path": "/run"}}: a list by index.
        if isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
            return [value[k] for k in sorted(value, key=int)]
        return value

    @model_validator(mode="after")
    def _limits_are_consistent(self) -> Self:
        try:
            check_shared_route_limits(self.routes)
            check_no_overlapping_routes(self.routes)
            check_operation_names(self.operations, self.routes)
            check_client_names(self.clients, self.operations, self.routes)
            _check_global_limits(self)
            check_flow_labels(self.flow_labels, self.flow_key)
            check_client_flow_headers(self.clients, self.credential_headers)
        except ValueError as error:
            if self.flow_key is None:
                raise
            raise without_input(error) from None  # pydantic would show flow_key with it
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Keyword arguments win; the environment is read strictly (see _EnvironmentSource).
        return init_settings, EnvironmentSource(settings_cls), dotenv_settings

    @classmethod
    def from_file(cls, path: str | Path) -> Self:
        """Settings from a YAML (.yaml/.yml) or JSON (.json) file holding one mapping, with
        `GYM_CONCURRENCY_*` variables winning over the file.

        A variable replaces the file's value: a JSON list (`GYM_CONCURRENCY_ROUTES`) the whole
        list, a per-field variable (`GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT`) that field of
        the file's entry 0 (or a new entry just past the file's last). Then the defaults.
        """
        path = Path(path)
        data = load_mapping(path)
        merged = environment_values(cls, os.environ, base=data)
        token = READ_ENVIRONMENT.set(False)  # read just now, over the file
        try:
            return cls(**merged)
        finally:
            READ_ENVIRONMENT.reset(token)


def _check_global_limits(settings: ConcurrencySettings) -> None:
    entries: list[tuple[str, int, RouteLimit | OperationLimit | ClientLimit]] = [
        ("routes", i, r) for i, r in enumerate(settings.routes)
    ]
    entries += [("operations", i, o) for i, o in enumerate(settings.operations)]
    entries += [("clients", i, c) for i, c in enumerate(settings.clients)]
    for kind, index, limit in entries:
        if limit.scope != "global":
            continue
        if settings.redis_url is None:
            raise ValueError(
                f"{kind}.{index}.scope: limit {limit.limit_name!r} is global, which needs "
                "redis_url (GYM_CONCURRENCY_REDIS_URL), the Redis every process shares"
            )
        if limit.backfill_seconds and not limit.budget_sizes():
            raise ValueError(
                f"{kind}.{index}.backfill_seconds: a global limit's oldest waiter is passed "
                "only while its rate budgets alone hold it back; this one has none "
                "(tokens_per_minute, requests_per_minute, ...)"
            )
        if limit.engine is not None and getattr(limit, "weight", 1) != 1:
            raise ValueError(
                f"{kind}.{index}.weight: a global limit that follows an engine counts calls "
                "to it (its size moves with the engine's room): give its calls weight 1"
            )
        if limit.budget_shape != "sliding":
            raise ValueError(
                f"{kind}.{index}.budget_shape: a global limit's budgets are sliding windows "
                f"kept in Redis; {limit.budget_shape!r} is a process limit's"
            )
        if isinstance(limit, RouteLimit | ClientLimit) and limit.adaptive is not None:
            raise ValueError(
                f"{kind}.{index}.adaptive: an adaptive limit follows this process's own "
                "latency; it cannot drive a global limit that other processes share"
            )
