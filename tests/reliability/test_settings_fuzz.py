"""Fuzzed settings, from the environment and from YAML / JSON files, either load or fail
with a validation error that names the field that was wrong; never another exception.

(The semaphore's own state machine over random acquire / timeout / cancel / release
interleavings is tests/core/test_semaphore_stateful.py; it is not repeated here.)
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from gym_concurrency.middleware import ConcurrencySettings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from pydantic_settings import SettingsError

ENV_PREFIX = "GYM_CONCURRENCY_"
# The errors a user may get for bad settings: pydantic's, and pydantic-settings' own for a
# value it cannot even parse (both name the field).
SETTINGS_ERRORS = (ValidationError, SettingsError)

VALID: dict[str, Any] = {
    "component": "fuzz",
    "server_name": "fuzz-server",
    "max_queued_body_bytes": 4096,
    "routes": [
        {
            "path": "/run",
            "methods": ["POST"],
            "limit_name": "episodes",
            "max_concurrent": 2,
            "queue_timeout_seconds": 0.5,
            "max_queue": 10,
            "failure": "episode",
            "retry_after_seconds": 3,
        },
        {
            "path": "/v1/chat/completions",
            "limit_name": "model",
            "max_concurrent": 8,
            "failure": "openai",
        },
    ],
    "operations": [
        {
            "limit_name": "verify",
            "operation": "verify",
            "executor": "thread",
            "max_concurrent": 1,
            "timeout_seconds": 2.0,
        },
    ],
}

# Every field that a user sets, as a path into VALID.
FIELDS: list[tuple[Any, ...]] = [
    *[
        (key,)
        for key in ("component", "server_name", "max_queued_body_bytes", "routes", "operations")
    ],
    *[("routes", i, key) for i in (0, 1) for key in VALID["routes"][0]],
    *[("operations", 0, key) for key in VALID["operations"][0]],
]

# Text that an environment variable can hold (no NUL, no lone surrogates).
env_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-2, 2),
    env_text,
    st.sampled_from(
        [
            "",
            "/",
            "POST",
            "post",
            "episode",
            "verify",
            "thread",
            "nan",
            "-1",
            "0",
            "1e309",
            "episodes",
            "model",
            "verify",
        ]
    ),
)
garbage = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(env_text, inner, max_size=3)
    ),
    max_leaves=8,
)


def mutated(field: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """VALID with the value at `field` replaced by `value`."""
    data = copy.deepcopy(VALID)
    target: Any = data
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    return data


def check_names_field(error: Exception, field: tuple[Any, ...]) -> None:
    """The error is a settings validation error and names the field."""
    assert isinstance(error, SETTINGS_ERRORS), f"{type(error).__name__}: {error}"
    assert str(field[-1]) in str(error), f"{field} not named in: {error}"


@contextlib.contextmanager
def environment(variables: dict[str, str]) -> Iterator[None]:
    """os.environ with every GYM_CONCURRENCY_* variable replaced by `variables`."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for key in saved:
        del os.environ[key]
    os.environ.update(variables)
    try:
        yield
    finally:
        for key in variables:
            os.environ.pop(key, None)
        os.environ.update(saved)


def as_env(data: dict[str, Any]) -> dict[str, str]:
    """Settings as GYM_CONCURRENCY_* variables: strings as they are, the rest as JSON."""
    return {
        ENV_PREFIX + key.upper(): value if isinstance(value, str) else json.dumps(value)
        for key, value in data.items()
        if value is not None
    }


def load(load_settings: Any, field: tuple[Any, ...]) -> None:
    try:
        load_settings()
    except Exception as error:
        check_names_field(error, field)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(FIELDS), value=garbage)
def test_fuzzed_environment_loads_or_names_the_field(field: tuple[Any, ...], value: Any):
    variables = as_env(mutated(field, value))
    with environment(variables):
        load(ConcurrencySettings, field)


@settings(max_examples=100, deadline=None)
@given(field=st.sampled_from(FIELDS[:5]), raw=env_text)
def test_unparsable_environment_values_name_the_field(field: tuple[Any, ...], raw: str):
    variables = as_env(VALID)
    variables[ENV_PREFIX + field[0].upper()] = raw
    with environment(variables):
        load(ConcurrencySettings, field)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=garbage, suffix=st.sampled_from([".json", ".yaml"]))
def test_fuzzed_settings_file_loads_or_names_the_field(
    field: tuple[Any, ...], value: Any, suffix: str
):
    data = mutated(field, value)
    text = json.dumps(data) if suffix == ".json" else yaml.safe_dump(data)
    with tempfile.TemporaryDirectory() as folder, environment({}):
        path = Path(folder) / f"settings{suffix}"
        path.write_text(text, encoding="utf-8")
        load(lambda: ConcurrencySettings.from_file(path), field)


def test_the_valid_base_loads_from_env_and_file(tmp_path: Path):
    # The fuzzing above starts from this; it must load, or every example "fails" trivially.
    with environment(as_env(VALID)):
        from_env = ConcurrencySettings()
    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump(VALID), encoding="utf-8")
    with environment({}):
        from_file = ConcurrencySettings.from_file(path)
    assert from_env == from_file
    assert from_env.model_dump(mode="json")["routes"][0]["methods"] == ["POST"]


@settings(max_examples=200, deadline=None)
@given(
    content=st.binary(max_size=200) | st.text(max_size=200).map(str.encode),
    suffix=st.sampled_from([".json", ".yaml"]),
)
def test_an_unparsable_settings_file_fails_naming_the_file(content: bytes, suffix: str):
    with tempfile.TemporaryDirectory() as folder, environment({}):
        path = Path(folder) / f"fuzzed-settings{suffix}"
        path.write_bytes(content)
        try:
            ConcurrencySettings.from_file(path)
        except Exception as error:
            check_names_file(error, path)


def check_names_file(error: Exception, path: Path) -> None:
    """A settings error naming the field, or a ValueError naming the file that is wrong."""
    if isinstance(error, SETTINGS_ERRORS):
        return
    assert isinstance(error, ValueError), f"{type(error).__name__}: {error}"
    assert path.name in str(error), f"{path.name} not named in: {error}"


# Number fields, as a path into VALID (every int and float a user sets).
NUMBER_FIELDS: list[tuple[Any, ...]] = [
    ("max_queued_body_bytes",),
    ("routes", 0, "max_concurrent"),
    ("routes", 0, "queue_timeout_seconds"),
    ("routes", 0, "max_queue"),
    ("routes", 0, "retry_after_seconds"),
    ("operations", 0, "max_concurrent"),
    ("operations", 0, "timeout_seconds"),
]
WHOLE = re.compile(r"[+-]?(?:0|[1-9][0-9]*)")
DECIMAL = re.compile(r"[+-]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# What YAML 1.1 reads as something other than the decimal number it seems to say, and more.
number_text = st.one_of(
    st.sampled_from(
        [
            "yes",
            "no",
            "on",
            "off",
            "y",
            "n",
            "true",
            "false",
            "True",
            "NO",
            "~",
            "null",
            "010",
            "0o10",
            "0x1f",
            "0b11",
            "1_000",
            "1:30",
            "190:20:30",
            "+5",
            "-0",
            "007",
            "1e2",
            "1E+2",
            ".5",
            "5.",
            "0.5",
            "2001-12-14",
            ".inf",
            "-.inf",
            ".nan",
            "1.5e-3",
            "0010.5",
        ]
    ),
    st.from_regex(r"[-+]?[0-9_:.oxbeE]{1,7}", fullmatch=True),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(NUMBER_FIELDS), text=number_text)
def test_a_yaml_number_is_the_decimal_it_spells_or_an_error_naming_the_field(
    field: tuple[Any, ...], text: str
):
    """A number field in YAML holds the number its text says in decimal, or the load fails
    naming the field: never a boolean, octal, hex, sexagesimal or underscored reading."""
    document = yaml.safe_dump(mutated(field, "PLACEHOLDER")).replace("PLACEHOLDER", text)
    with tempfile.TemporaryDirectory() as folder, environment({}):
        path = Path(folder) / "settings.yaml"
        path.write_text(document, encoding="utf-8")
        loaded, error = attempt(lambda: ConcurrencySettings.from_file(path).model_dump())
    if error is not None:
        if isinstance(error, SETTINGS_ERRORS):
            check_names_field(error, field)
        else:
            check_names_file(error, path)
        return
    value: Any = loaded
    for key in field:
        value = value[key]
    if value is None:  # null, where the field allows it
        assert text in ("~", "null"), f"{text!r} loaded as None"
        return
    assert not isinstance(value, bool), f"{text!r} loaded as {value!r}"
    assert WHOLE.fullmatch(text) or DECIMAL.fullmatch(text), f"{text!r} loaded as {value!r}"
    assert value == float(text), f"{text!r} loaded as {value!r}"


def attempt(load_settings: Any) -> tuple[Any, Exception | None]:
    try:
        return load_settings(), None
    except Exception as error:
        return None, error


@settings(max_examples=200, deadline=None)
@given(name=st.from_regex(r"[A-Za-z0-9_]{1,40}", fullmatch=True), raw=env_text)
def test_an_unknown_variable_fails_naming_it(name: str, raw: str):
    """Any GYM_CONCURRENCY_* variable loads as a setting, or the error names the variable
    (or, for a value that a known field refuses, that field)."""
    with environment({ENV_PREFIX + name: raw}):
        _, error = attempt(ConcurrencySettings)
    if error is None:  # it loaded, so it is a setting: never ignored
        assert name.lower().split("__")[0] in ConcurrencySettings.model_fields, name
    elif isinstance(error, SettingsError):
        assert ENV_PREFIX + name in str(error), str(error)
    else:
        assert isinstance(error, ValidationError), f"{type(error).__name__}: {error}"
        assert name.lower().split("__")[0] in str(error), str(error)
