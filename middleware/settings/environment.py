"""The environment: every `GYM_CONCURRENCY_*` variable is a field of the settings model, or an
error naming the variable (an unknown name with a suggestion, two forms of one setting, a gap
in entry indexes, invalid JSON)."""

from __future__ import annotations

import difflib
import json
import os
import re
import typing
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource, SettingsError

from .env_prefix import warn_misspelt_prefixes
from .numbers import union_members

__all__ = [
    "READ_ENVIRONMENT",
    "EnvironmentSettingsError",
    "EnvironmentSource",
    "environment_values",
]


class EnvironmentSettingsError(SettingsError):
    """`GYM_CONCURRENCY_*` variables that cannot be read as settings: an unknown name, two
    forms of one setting, a gap in entry indexes or invalid JSON. Names each variable."""


_INDEX = re.compile(r"0|[1-9][0-9]*")
_Path = tuple[str | int, ...]
_NAME_FIELD = "limit_name"  # entries of a list of models with this field can be named by it


class _ByName(str):
    """A list entry given by its `limit_name` (`ROUTES__episodes__...`) rather than its index."""

    __slots__ = ()


# False while from_file builds its settings: the environment was already merged over the file.
READ_ENVIRONMENT: ContextVar[bool] = ContextVar("gym_concurrency_read_environment", default=True)


class EnvironmentSource(PydanticBaseSettingsSource):
    """`GYM_CONCURRENCY_*` variables, read by the model's own fields (so a field added later
    needs no change here): unknown names, conflicting forms and index gaps are errors."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every variable at once

    def __call__(self) -> dict[str, Any]:
        if not READ_ENVIRONMENT.get():
            return {}
        return environment_values(self.settings_cls, os.environ)


def environment_values(
    settings_cls: type[BaseModel], environ: Mapping[str, str], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The settings `environ` sets, over `base` (a settings file's mapping, or nothing).

    `PREFIX<FIELD>` sets a field (JSON for a list or a nested model); `PREFIX<FIELD>__<i>__<F>`
    sets field F of entry i of a list of models (entries by index from 0 without gaps, also
    counting `base`'s entries); `PREFIX<FIELD>__<limit_name>__<F>` sets field F of every entry
    of `base` with that limit_name (whatever its position). Raises EnvironmentSettingsError
    naming every bad variable.
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
        named_path, complex_value, problem = _variable_path(settings_cls, parts)
        if problem is not None:
            suggestion = _suggest(settings_cls, prefix, delimiter, name[len(prefix) :])
            problems.append(f"{name}: {problem}{suggestion}")
            continue
        paths, problem = _by_index(named_path, base or {}, prefix, delimiter)
        if problem is not None:
            problems.append(f"{name}: {problem}")
            continue
        clash = next((assigned[p] for p in paths if p in assigned), None)
        if clash is not None:
            problems.append(f"{name}: sets the same setting as {clash}; set one")
            continue
        raw = environ[name]
        if complex_value:
            try:
                value: Any = json.loads(raw)
            except ValueError as error:
                where = ".".join(map(str, paths[0]))
                problems.append(f"{name}: {where} must be JSON here, got {raw[:60]!r} ({error})")
                continue
        elif _looks_like_json(raw) and _takes_collection(settings_cls, paths[0]):
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw  # the field's own validator reads it (e.g. methods "GET,POST")
        else:
            value = raw
        for path in paths:
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
    for member in union_members(annotation):
        origin = typing.get_origin(member)
        if origin in (list, tuple, typing.Sequence) or (
            isinstance(origin, type) and issubclass(origin, (list, tuple))
        ):
            args = [a for a in typing.get_args(member) if a is not Ellipsis]
            item = union_members(args[0])[0] if len(args) == 1 else None
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
            assert node is not None
            if _INDEX.fullmatch(part):
                path.append(int(part))
            elif _NAME_FIELD in node.model_fields:
                path.append(_ByName(part))
            else:
                return (), False, f"{part!r} is not an entry index (0, 1, 2, ...)"
            shape = "model"
        else:
            where = ".".join(map(str, path))
            return (), False, f"{where} takes one value, it has no fields of its own"
    return tuple(path), shape != "leaf", None


def _by_index(
    path: _Path, base: Mapping[str, Any], prefix: str, delimiter: str
) -> tuple[list[_Path], str | None]:
    """`path` with each entry named by limit_name replaced by the index of every `base` entry
    of that name (matched whatever its case: variable names are upper case), or a problem."""
    paths: list[_Path] = [()]
    for key in path:
        if not isinstance(key, _ByName):
            paths = [(*p, key) for p in paths]
            continue
        entries = _get(base, paths[0])
        names = [e.get(_NAME_FIELD) if isinstance(e, Mapping) else None for e in entries or []]
        found = [i for i, n in enumerate(names) if isinstance(n, str) and n.lower() == key]
        spellings = sorted({str(names[i]) for i in found})
        if len(spellings) > 1:
            listed = ", ".join(spellings)
            return [], f"{key!r} matches {_NAME_FIELD}s {listed}; give the entry's index"
        if not found:
            where = ".".join(map(str, paths[0]))
            known = ", ".join(sorted({str(n) for n in names if n is not None}))
            listed = f"the file has {known}" if known else "no settings file lists any"
            close = difflib.get_close_matches(key, [str(n).lower() for n in names if n], n=1)
            listed += f"; did you mean {close[0]!r}?" if close else ""
            index = _variable(prefix, delimiter, (*paths[0], len(names)))
            return [], (
                f"no entry of {where} has {_NAME_FIELD} {key!r} to change ({listed}); "
                f"to add an entry, give it by index ({index}{delimiter}<FIELD>)"
            )
        paths = [(*p, i) for p in paths for i in found]
    return paths, None


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
        for m in union_members(annotation)
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
