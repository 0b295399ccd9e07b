"""ConcurrencySettings, RouteLimit, OperationLimit: what to limit, how hard, and how to fail.

Read from keyword arguments, from `GYM_CONCURRENCY_*` environment variables (JSON for the
lists, `__` for nesting) or from a YAML / JSON file with `ConcurrencySettings.from_file`;
keyword arguments win over the environment, and the environment over the file. Every invalid
value fails with an error that names the field: numbers must be numbers (no booleans, no YAML
1.1 octal or sexagesimal), and an unknown `GYM_CONCURRENCY_*` variable, two forms of one
setting or a gap in entry indexes is an error naming the variable.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from gym_concurrency.limit import LimitScope
from gym_concurrency.names import EXECUTORS, OPERATIONS, check_member

from .env_prefix import warn_misspelt_prefixes

__all__ = [
    "AdaptiveLimit",
    "ConcurrencySettings",
    "EnvironmentSettingsError",
    "FailureProfile",
    "OperationLimit",
    "RouteLimit",
]

FailureProfile = Literal["problem", "openai", "episode"]
AdaptiveAlgorithm = Literal["gradient", "aimd"]

_METHOD = re.compile(r"^[A-Z]+$")
_Name = Annotated[str, Field(min_length=1, max_length=200)]
_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# Bodies of queued requests are held in memory: 1 MiB each and 64 MiB over all of them,
# unless configured otherwise; past either bound a queued request stops being read.
DEFAULT_MAX_QUEUED_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_QUEUED_BODY_BYTES_TOTAL = 64 * 1024 * 1024
# How long an episode refusal waits for the rest of a body to echo its ids (a slowloris bound).
DEFAULT_REFUSAL_BODY_TIMEOUT_SECONDS = 5.0


class EnvironmentSettingsError(SettingsError):
    """`GYM_CONCURRENCY_*` variables that cannot be read as settings: an unknown name, two
    forms of one setting, a gap in entry indexes or invalid JSON. Names each variable."""


# --- Numbers are numbers: no booleans, no YAML 1.1 octal / sexagesimal / underscores.

_WHOLE = re.compile(r"[+-]?(?:0|[1-9][0-9]*)")
_DECIMAL = re.compile(r"[+-]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _number_kind(annotation: Any) -> tuple[type | None, bool]:
    """(int or float if the field holds that number, else None; whether a string is valid)."""
    kinds: set[Any] = set()
    strings = False
    for arg in _union_members(annotation):
        if typing.get_origin(arg) is Literal:
            strings = strings or any(isinstance(v, str) for v in typing.get_args(arg))
        elif arg is str:
            strings = True
        else:
            kinds.add(arg)
    if bool in kinds:
        return None, strings
    if int in kinds:
        return int, strings
    if float in kinds:
        return float, strings
    return None, strings


def _union_members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is Annotated:
        return _union_members(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _union_members(arg)]
    return [annotation]


def _number(kind: type, value: Any, strings: bool) -> Any:
    """`value` for a number field of `kind`: a number, or the decimal text of one (as an
    environment variable gives it); a boolean or any other text is an error."""
    if isinstance(value, bool):
        raise ValueError(
            f"must be a number, got the boolean {str(value).lower()} (YAML reads yes/no/on/off "
            "and true/false as booleans; write the number)"
        )
    if not isinstance(value, str):
        return value
    text = value.strip()
    if kind is int and _WHOLE.fullmatch(text):
        return int(text)
    if kind is float and _DECIMAL.fullmatch(text):
        return float(text)
    if strings:
        return value
    hint = ""
    if re.fullmatch(r"[+-]?0[0-9_]+(?:\.[0-9]*)?", text):
        hint = " (a leading zero is ambiguous: YAML 1.1 reads 010 as octal 8)"
    elif ":" in text:
        hint = " (YAML 1.1 reads 1:30 as the sexagesimal 90)"
    elif text.lower() in ("yes", "no", "on", "off", "y", "n"):
        hint = f" (YAML 1.1 reads {text} as a boolean; write the number, or null where allowed)"
    whole = "a whole number" if kind is int else "a number"
    raise ValueError(f"must be {whole} written in decimal, got {value!r}{hint}")


class _NumbersAreNumbers(BaseModel):
    """A number field takes a number or its decimal text, never a boolean or other text."""

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None:
            return value
        kind, strings = _number_kind(cls.model_fields[info.field_name].annotation)
        return value if kind is None else _number(kind, value, strings)


class AdaptiveLimit(_NumbersAreNumbers):
    """A route limit that moves (docs/adaptive-limits.md): it follows the latency of admitted
    requests and shrinks on overload answers (`overload_status_codes`) or exceptions from the
    app, never below `min_concurrent` nor above `max_concurrent`. The route's `max_concurrent`
    is where it starts. `latency_tolerance`: how many times the unloaded latency is still
    healthy (None, AIMD only: latency is ignored, overload answers alone move it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_concurrent: int = Field(ge=1)
    max_concurrent: int = Field(ge=1)
    algorithm: AdaptiveAlgorithm = "gradient"
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


class RouteLimit(_NumbersAreNumbers):
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
    # Whole seconds; "auto": how long the queue ahead would take to clear at the measured rate.
    retry_after_seconds: Annotated[int, Field(ge=0)] | Literal["auto"] | None = None
    adaptive: AdaptiveLimit | None = None
    # "global": one limit shared by every process that configures this limit_name against the
    # same Redis (ConcurrencySettings.redis_url); "process": this process's own.
    scope: LimitScope = "process"
    # Slots this process admits on its own while Redis cannot be reached, with
    # redis_unavailable="local" (None: max_concurrent).
    local_max_concurrent: int | None = Field(default=None, ge=1)

    @field_validator("retry_after_seconds", mode="before")
    @classmethod
    def _auto_or_a_number(cls, value: Any) -> Any:
        # The one string allowed is "auto"; any other text must spell a decimal number.
        if isinstance(value, str) and value.strip() != "auto":
            return _number(int, value, strings=False)
        return value.strip() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _starts_within_its_adaptive_bounds(self) -> Self:
        adaptive = self.adaptive
        if adaptive is not None and not (
            adaptive.min_concurrent <= self.max_concurrent <= adaptive.max_concurrent
        ):
            raise ValueError(
                f"max_concurrent: an adaptive limit starts at max_concurrent "
                f"({self.max_concurrent}), which must be within adaptive.min_concurrent.."
                f"adaptive.max_concurrent ({adaptive.min_concurrent}..{adaptive.max_concurrent})"
            )
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


class OperationLimit(_NumbersAreNumbers):
    """A concurrency limit on work done inside routes (verifier, judge, tool), used through
    `operation_limit(limit_name)`; `timeout_seconds` bounds the wait for a slot."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit_name: _Name
    operation: str
    executor: str
    max_concurrent: int = Field(ge=1)
    timeout_seconds: _Seconds | None = None
    scope: LimitScope = "process"  # as RouteLimit.scope
    local_max_concurrent: int | None = Field(default=None, ge=1)  # as RouteLimit's

    @field_validator("operation")
    @classmethod
    def _known_operation(cls, operation: str) -> str:
        return check_member("operation", operation, OPERATIONS)

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, executor: str) -> str:
        return check_member("executor", executor, EXECUTORS)


class ConcurrencySettings(_NumbersAreNumbers, BaseSettings):
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
    # Limits with scope="global" live in this Redis (or Valkey): redis://host:port/db.
    redis_url: str | None = None
    # Redis unreachable: "refuse" answers with the failure profile (reason unavailable);
    # "local" admits through a process-local limit of local_max_concurrent slots.
    redis_unavailable: Literal["refuse", "local"] = "refuse"
    # A global slot is a lease, renewed by one heartbeat per process every third of this.
    redis_lease_seconds: _Seconds = 10.0

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
        _check_global_limits(self)
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
        return init_settings, _EnvironmentSource(settings_cls), dotenv_settings

    @classmethod
    def from_file(cls, path: str | Path) -> Self:
        """Settings from a YAML (.yaml/.yml) or JSON (.json) file holding one mapping, with
        `GYM_CONCURRENCY_*` variables winning over the file.

        A variable replaces the file's value: a JSON list (`GYM_CONCURRENCY_ROUTES`) the whole
        list, a per-field variable (`GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT`) that field of
        the file's entry 0 (or a new entry just past the file's last). Then the defaults.
        """
        path = Path(path)
        data = _load_mapping(path)
        merged = environment_values(cls, os.environ, base=data)
        token = _READ_ENVIRONMENT.set(False)  # read just now, over the file
        try:
            return cls(**merged)
        finally:
            _READ_ENVIRONMENT.reset(token)


def _load_mapping(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ValueError(f"{path}: settings file must end in .yaml, .yml or .json")
    import yaml  # only needed for settings files

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if suffix == ".json" else yaml.load(text, _strict_yaml_loader())
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
        for field in ("max_concurrent", "queue_timeout_seconds", "max_queue", "adaptive"):
            mine, theirs = getattr(route, field), getattr(other, field)
            if mine != theirs:
                raise ValueError(
                    f"routes.{index}.{field}: limit_name {route.limit_name!r} is shared with "
                    f"routes.{first_index} ({other.path}), which sets {field}={theirs!r}, but "
                    f"this route ({route.path}) sets {mine!r}; routes sharing a limit_name "
                    "share one semaphore and must agree on it"
                )


def _check_global_limits(settings: ConcurrencySettings) -> None:
    entries: list[tuple[str, int, RouteLimit | OperationLimit]] = [
        ("routes", i, r) for i, r in enumerate(settings.routes)
    ]
    entries += [("operations", i, o) for i, o in enumerate(settings.operations)]
    for kind, index, limit in entries:
        if limit.scope != "global":
            continue
        if settings.redis_url is None:
            raise ValueError(
                f"{kind}.{index}.scope: limit {limit.limit_name!r} is global, which needs "
                "redis_url (GYM_CONCURRENCY_REDIS_URL), the Redis every process shares"
            )
        if isinstance(limit, RouteLimit) and limit.adaptive is not None:
            raise ValueError(
                f"{kind}.{index}.adaptive: an adaptive limit follows this process's own "
                "latency; it cannot drive a global limit that other processes share"
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


# --- YAML: plain scalars resolved as in YAML 1.2's core schema, and stricter still.

_YAML_LOADER: Any = None


def _strict_yaml_loader() -> Any:
    """A SafeLoader whose plain scalars are true/false, null, decimal integers and decimal
    floats only: yes/no/on/off, 010, 0o10, 0x10, 1_000, 1:30 and dates stay strings (which a
    number field then refuses, naming the field), instead of YAML 1.1's guesses."""
    global _YAML_LOADER
    if _YAML_LOADER is not None:
        return _YAML_LOADER
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    guessed = {f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "timestamp", "value")}
    StrictLoader.yaml_implicit_resolvers = {
        first: [(tag, regex) for tag, regex in resolvers if tag not in guessed]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:int", re.compile(rf"^{_WHOLE.pattern}$"), list("-+0123456789")
    )
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(rf"^(?:{_DECIMAL.pattern}|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."),
    )

    def decimal_int(loader: Any, node: Any) -> int:
        text = loader.construct_scalar(node)
        if not _WHOLE.fullmatch(text):
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} is not a decimal integer", node.start_mark
            )
        return int(text)

    StrictLoader.add_constructor("tag:yaml.org,2002:int", decimal_int)
    _YAML_LOADER = StrictLoader
    return StrictLoader


# --- The environment: every GYM_CONCURRENCY_* variable is a field of the model, or an error.

_INDEX = re.compile(r"0|[1-9][0-9]*")
_Path = tuple[str | int, ...]
# False while from_file builds its settings: the environment was already merged over the file.
_READ_ENVIRONMENT: ContextVar[bool] = ContextVar("gym_concurrency_read_environment", default=True)


class _EnvironmentSource(PydanticBaseSettingsSource):
    """`GYM_CONCURRENCY_*` variables, read by the model's own fields (so a field added later
    needs no change here): unknown names, conflicting forms and index gaps are errors."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every variable at once

    def __call__(self) -> dict[str, Any]:
        if not _READ_ENVIRONMENT.get():
            return {}
        return environment_values(self.settings_cls, os.environ)


def environment_values(
    settings_cls: type[BaseModel], environ: Mapping[str, str], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The settings `environ` sets, over `base` (a settings file's mapping, or nothing).

    `PREFIX<FIELD>` sets a field (JSON for a list or a nested model); `PREFIX<FIELD>__<i>__<F>`
    sets field F of entry i of a list of models (entries by index from 0 without gaps, also
    counting `base`'s entries). Raises EnvironmentSettingsError naming every bad variable.
    """
    config = settings_cls.model_config
    prefix = str(config.get("env_prefix") or "").upper()
    warn_misspelt_prefixes(environ, prefix, settings_cls.model_fields)  # else silently unread
    delimiter = str(config.get("env_nested_delimiter") or "__")
    problems: list[str] = []
    assigned: dict[_Path, str] = {}
    values: dict[_Path, Any] = {}
    for name in sorted(environ):
        if not name.upper().startswith(prefix):
            continue
        parts = name[len(prefix) :].lower().split(delimiter)
        path, complex_value, problem = _variable_path(settings_cls, parts)
        if problem is not None:
            suggestion = _suggest(settings_cls, prefix, delimiter, name[len(prefix) :])
            problems.append(f"{name}: {problem}{suggestion}")
            continue
        if path in assigned:
            problems.append(f"{name}: sets the same setting as {assigned[path]}; set one")
            continue
        raw = environ[name]
        if complex_value:
            try:
                value: Any = json.loads(raw)
            except ValueError as error:
                where = ".".join(map(str, path))
                problems.append(f"{name}: {where} must be JSON here, got {raw[:60]!r} ({error})")
                continue
        elif _looks_like_json(raw) and _takes_collection(settings_cls, path):
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw  # the field's own validator reads it (e.g. methods "GET,POST")
        else:
            value = raw
        assigned[path] = name
        values[path] = value
    problems += _conflicts(assigned, prefix, delimiter)
    problems += _gaps(assigned, base or {}, prefix, delimiter)
    if problems:
        raise EnvironmentSettingsError(
            "invalid GYM_CONCURRENCY_* environment variables:\n  " + "\n  ".join(problems)
        )
    result: Any = dict(base or {})
    for path in sorted(values, key=lambda p: [str(k) for k in p]):
        result = _set(result, path, values[path])
    return dict(result)


def _field_shape(annotation: Any) -> tuple[str, type[BaseModel] | None]:
    """("list", item model) for a list of models, ("model", model) for a nested model, else
    ("leaf", None)."""
    for member in _union_members(annotation):
        origin = typing.get_origin(member)
        if origin in (list, tuple, typing.Sequence) or (
            isinstance(origin, type) and issubclass(origin, (list, tuple))
        ):
            args = [a for a in typing.get_args(member) if a is not Ellipsis]
            item = _union_members(args[0])[0] if len(args) == 1 else None
            if isinstance(item, type) and issubclass(item, BaseModel):
                return "list", item
        if isinstance(member, type) and issubclass(member, BaseModel):
            return "model", member
    return "leaf", None


def _variable_path(model: type[BaseModel], parts: list[str]) -> tuple[_Path, bool, str | None]:
    """(path into the settings, whether the value is JSON for a list or model, problem)."""
    path: list[str | int] = []
    shape: str = "model"
    node: type[BaseModel] | None = model
    for part in parts:
        if shape == "model":
            assert node is not None
            field = node.model_fields.get(part)
            if field is None:
                where = ".".join(map(str, path))
                return (), False, f"no such setting{f' in {where}' if where else ''}"
            path.append(part)
            shape, node = _field_shape(field.annotation)
        elif shape == "list":
            if not _INDEX.fullmatch(part):
                return (), False, f"{part!r} is not an entry index (0, 1, 2, ...)"
            path.append(int(part))
            shape = "model"
        else:
            where = ".".join(map(str, path))
            return (), False, f"{where} takes one value, it has no fields of its own"
    return tuple(path), shape != "leaf", None


def _takes_collection(model: type[BaseModel], path: _Path) -> bool:
    node: Any = model
    annotation: Any = None
    for key in path:
        if isinstance(key, int):
            continue
        field = node.model_fields[key]
        annotation = field.annotation
        node = _field_shape(annotation)[1]
    return any(
        typing.get_origin(m) in (list, tuple, set, frozenset, dict) or m in (list, tuple, dict)
        for m in _union_members(annotation)
    )


def _looks_like_json(raw: str) -> bool:
    return raw.lstrip()[:1] in ("[", "{")


def _variable(prefix: str, delimiter: str, path: _Path) -> str:
    return prefix + delimiter.join(str(k).upper() for k in path)


def _conflicts(assigned: dict[_Path, str], prefix: str, delimiter: str) -> list[str]:
    problems = []
    for path, name in assigned.items():
        for length in range(1, len(path)):
            whole = assigned.get(path[:length])
            if whole is not None:
                problems.append(
                    f"{name}: {whole} already sets {'.'.join(map(str, path[:length]))} as a "
                    "whole; give it either as one JSON value or one variable per field, not "
                    "both"
                )
                break
    return problems


def _gaps(
    assigned: dict[_Path, str], base: Mapping[str, Any], prefix: str, delimiter: str
) -> list[str]:
    indexes: dict[_Path, set[int]] = {}
    for path in assigned:
        for position, key in enumerate(path):
            if isinstance(key, int):
                indexes.setdefault(path[:position], set()).add(key)
    problems = []
    for list_path, found in sorted(indexes.items(), key=lambda item: [str(k) for k in item[0]]):
        existing = _get(base, list_path)
        present = set(range(len(existing))) if isinstance(existing, list) else set()
        missing = sorted(set(range(max(found) + 1)) - present - found)
        if not missing:
            continue
        first_after = min(i for i in found if i > missing[0])
        names = sorted(
            n for p, n in assigned.items() if p[: len(list_path) + 1] == (*list_path, first_after)
        )
        gap = _variable(prefix, delimiter, (*list_path, missing[0]))
        counted = f" (the file has {len(present)})" if present else ""
        meant = names[0].replace(
            f"{delimiter}{first_after}{delimiter}", f"{delimiter}{missing[0]}{delimiter}", 1
        )
        problems.append(
            f"{names[0]}: entries of {'.'.join(map(str, list_path))} are numbered from 0 "
            f"without gaps{counted}, but no {gap}{delimiter}* is set; did you mean {meant}?"
        )
    return problems


def _get(data: Any, path: _Path) -> Any:
    for key in path:
        if isinstance(key, int):
            if not isinstance(data, list) or key >= len(data):
                return None
        elif not isinstance(data, Mapping):
            return None
        data = data[key] if isinstance(key, int) else data.get(key)
    return data


def _set(data: Any, path: _Path, value: Any) -> Any:
    """`data` with `value` at `path`, copying what it changes (a file's mapping is kept)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(key, int):
        items = list(data) if isinstance(data, list) else []
        if key < len(items):
            items[key] = _set(items[key], rest, value)
        else:  # no gap (checked): the next entry
            items.append(_set(None, rest, value))
        return items
    mapping = dict(data) if isinstance(data, Mapping) else {}
    mapping[key] = _set(mapping.get(key), rest, value)
    return mapping


def _suggest(model: type[BaseModel], prefix: str, delimiter: str, rest: str) -> str:
    """'; did you mean X?' with the setting `rest` most resembles, or the settings there are."""
    index = re.search(r"\d+", rest)
    shown_index = index.group() if index else "0"
    candidates = [
        delimiter.join(p.upper() for p in names)
        for names in _setting_names(model, shown_index, depth=3)
    ]
    close = difflib.get_close_matches(rest.upper(), candidates, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {prefix}{close[0]}?"
    fields = ", ".join(prefix + name.upper() for name in model.model_fields)
    return f"; the settings are {fields} (lists also as <NAME>{delimiter}<i>{delimiter}<FIELD>)"


def _setting_names(model: type[BaseModel], index: str, depth: int) -> list[list[str]]:
    names: list[list[str]] = []
    for field_name, field in model.model_fields.items():
        names.append([field_name])
        shape, node = _field_shape(field.annotation)
        if node is None or depth <= 1:
            continue
        inner = _setting_names(node, index, depth - 1)
        step = [field_name, index] if shape == "list" else [field_name]
        names += [[*step, *more] for more in inner]
    return names
