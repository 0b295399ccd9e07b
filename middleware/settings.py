"""ConcurrencySettings, RouteLimit, OperationLimit: what to limit, how hard, and how to fail.

Read from keyword arguments, from `GYM_CONCURRENCY_*` environment variables (JSON for the
lists, `__` for nesting) or from a YAML / JSON file with `ConcurrencySettings.from_file`.
Every invalid value fails validation with an error that names the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gym_concurrency.names import EXECUTORS, OPERATIONS, check_member

__all__ = ["ConcurrencySettings", "FailureProfile", "OperationLimit", "RouteLimit"]

FailureProfile = Literal["problem", "openai", "episode"]

_METHOD = re.compile(r"^[A-Z]+$")
_Name = Annotated[str, Field(min_length=1, max_length=200)]
_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# Bodies of queued requests are held in memory: 1 MiB each and 64 MiB over all of them,
# unless configured otherwise; past either bound a queued request stops being read.
DEFAULT_MAX_QUEUED_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_QUEUED_BODY_BYTES_TOTAL = 64 * 1024 * 1024
# How long an episode refusal waits for the rest of a body to echo its ids (a slowloris bound).
DEFAULT_REFUSAL_BODY_TIMEOUT_SECONDS = 5.0


class RouteLimit(BaseModel):
    """A concurrency limit on one route (its declared path template), optionally per method.

    Routes naming the same `limit_name` share one semaphore, so they must agree on its size,
    queue timeout and queue bound.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    methods: tuple[str, ...] | None = None
    limit_name: _Name
    max_concurrent: int = Field(ge=1)
    queue_timeout_seconds: _Seconds | None = None
    max_queue: int | None = Field(default=None, ge=0)
    failure: FailureProfile = "problem"
    retry_after_seconds: int | None = Field(default=None, ge=0)

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


class OperationLimit(BaseModel):
    """A concurrency limit on work done inside routes (verifier, judge, tool), used through
    `operation_limit(limit_name)`; `timeout_seconds` bounds the wait for a slot."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit_name: _Name
    operation: str
    executor: str
    max_concurrent: int = Field(ge=1)
    timeout_seconds: _Seconds | None = None

    @field_validator("operation")
    @classmethod
    def _known_operation(cls, operation: str) -> str:
        return check_member("operation", operation, OPERATIONS)

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, executor: str) -> str:
        return check_member("executor", executor, EXECUTORS)


class ConcurrencySettings(BaseSettings):
    """Every limit of one server: its route limits and its operation limits."""

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
    max_queued_body_bytes: int = Field(default=DEFAULT_MAX_QUEUED_BODY_BYTES, ge=0)
    max_queued_body_bytes_total: int = Field(default=DEFAULT_MAX_QUEUED_BODY_BYTES_TOTAL, ge=0)
    refusal_body_timeout_seconds: _Seconds = DEFAULT_REFUSAL_BODY_TIMEOUT_SECONDS
    close_connection_on_refusal: bool = False

    @field_validator("routes", "operations", mode="before")
    @classmethod
    def _indexed_entries_are_a_list(cls, value: Any) -> Any:
        # GYM_CONCURRENCY_ROUTES__0__PATH=/run nests as {"0": {"path": "/run"}}: a list by index.
        if isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
            return [value[k] for k in sorted(value, key=int)]
        return value

    @model_validator(mode="after")
    def _limits_are_consistent(self) -> Self:
        _check_shared_route_limits(self.routes)
        _check_no_overlapping_routes(self.routes)
        _check_operation_names(self.operations, self.routes)
        return self

    @classmethod
    def from_file(cls, path: str | Path) -> ConcurrencySettings:
        """Settings from a YAML (.yaml/.yml) or JSON (.json) file holding one mapping.

        Fields the file leaves out are still read from the environment, then defaults.
        """
        path = Path(path)
        data = _load_mapping(path)
        return cls(**data)


def _load_mapping(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ValueError(f"{path}: settings file must end in .yaml, .yml or .json")
    import yaml  # only needed for settings files

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as error:
        raise ValueError(
            f"{path}: not a valid {suffix[1:].upper()} settings file: {error}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: settings file must hold a mapping, got {type(data).__name__}")
    odd_keys = [key for key in data if not isinstance(key, str)]
    if odd_keys:
        raise ValueError(f"{path}: settings keys must be field names, got {odd_keys[0]!r}")
    return data


def _check_shared_route_limits(routes: list[RouteLimit]) -> None:
    first: dict[str, tuple[int, RouteLimit]] = {}
    for index, route in enumerate(routes):
        if route.limit_name not in first:
            first[route.limit_name] = (index, route)
            continue
        first_index, other = first[route.limit_name]
        for field in ("max_concurrent", "queue_timeout_seconds", "max_queue"):
            mine, theirs = getattr(route, field), getattr(other, field)
            if mine != theirs:
                raise ValueError(
                    f"routes.{index}.{field}: limit_name {route.limit_name!r} is shared with "
                    f"routes.{first_index} ({other.path}), which sets {field}={theirs!r}, but "
                    f"this route ({route.path}) sets {mine!r}; routes sharing a limit_name "
                    "share one semaphore and must agree on it"
                )


def _check_no_overlapping_routes(routes: list[RouteLimit]) -> None:
    for index, route in enumerate(routes):
        for earlier_index in range(index):
            earlier = routes[earlier_index]
            if earlier.path != route.path:
                continue
            common = _common_methods(earlier.methods, route.methods)
            if common:
                raise ValueError(
                    f"routes.{index}: {route.path} {common} is already limited by "
                    f"routes.{earlier_index}; a request can be under one route limit only"
                )


def _common_methods(a: Iterable[str] | None, b: Iterable[str] | None) -> str:
    if a is None or b is None:
        return "(every method)" if a is None and b is None else str(sorted(set(a or b or ())))
    return str(sorted(set(a) & set(b))) if set(a) & set(b) else ""


def _check_operation_names(operations: list[OperationLimit], routes: list[RouteLimit]) -> None:
    route_names = {route.limit_name for route in routes}
    seen: set[str] = set()
    for index, operation in enumerate(operations):
        name = operation.limit_name
        if name in seen:
            raise ValueError(f"operations.{index}.limit_name: {name!r} is configured twice")
        if name in route_names:
            raise ValueError(
                f"operations.{index}.limit_name: {name!r} is also a route limit_name; "
                "operation and route limits are separate semaphores and need distinct names"
            )
        seen.add(name)
