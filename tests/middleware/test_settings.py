"""ConcurrencySettings: from arguments, the environment and YAML / JSON files; invalid values
fail with an error naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gym_concurrency.middleware import ConcurrencySettings, OperationLimit, RouteLimit
from pydantic import ValidationError

ROUTE = {"path": "/run", "limit_name": "episodes", "max_concurrent": 4}


def route(**changes: object) -> dict[str, object]:
    return {**ROUTE, **changes}


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"max_concurrent": 0}, "max_concurrent", "greater than or equal to 1"),
        ({"queue_timeout_seconds": 0}, "queue_timeout_seconds", "greater than 0"),
        ({"queue_timeout_seconds": -1.5}, "queue_timeout_seconds", "greater than 0"),
        ({"max_queue": -1}, "max_queue", "greater than or equal to 0"),
        ({"failure": "html"}, "failure", "'problem', 'openai' or 'episode'"),
        ({"methods": ["post"]}, "methods", "'post' is not an upper-case HTTP method"),
        ({"methods": []}, "methods", "at least one method"),
        ({"path": "run"}, "path", "must start with '/'"),
        ({"retry_after_seconds": -1}, "retry_after_seconds", "greater than or equal to 0"),
        ({"limit_name": ""}, "limit_name", "at least 1 character"),
        ({"max_concurent": 3}, "max_concurent", "Extra inputs are not permitted"),
    ],
)
def test_invalid_route_limit_names_the_field(changes: dict[str, object], field: str, message: str):
    with pytest.raises(ValidationError) as raised:
        ConcurrencySettings(routes=[route(**changes)])
    error = str(raised.value)
    assert f"routes.0.{field}" in error
    assert message in error


def test_invalid_operation_limit_names_the_field():
    with pytest.raises(ValidationError) as raised:
        ConcurrencySettings(
            operations=[
                {
                    "limit_name": "judge",
                    "operation": "grade",
                    "executor": "inline",
                    "max_concurrent": 1,
                }
            ]
        )
    assert "operations.0.operation" in str(raised.value)
    assert "unknown operation 'grade'" in str(raised.value)
    with pytest.raises(ValidationError, match=r"timeout_seconds\n  Input should be greater than 0"):
        OperationLimit(
            limit_name="judge",
            operation="judge",
            executor="inline",
            max_concurrent=1,
            timeout_seconds=0,
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_concurrent", 8), ("queue_timeout_seconds", 2.0), ("max_queue", 3)],
)
def test_routes_sharing_a_limit_name_must_agree(field: str, value: object):
    with pytest.raises(ValidationError) as raised:
        ConcurrencySettings(routes=[route(), route(path="/other", **{field: value})])
    error = str(raised.value)
    assert f"routes.1.{field}" in error
    assert "limit_name 'episodes' is shared with routes.0 (/run)" in error


def test_routes_sharing_a_limit_name_may_differ_in_failure_profile():
    settings = ConcurrencySettings(
        routes=[route(), route(path="/v1/chat/completions", failure="openai")]
    )
    assert [r.failure for r in settings.routes] == ["problem", "openai"]


def test_one_route_and_method_cannot_have_two_limits():
    with pytest.raises(ValidationError, match=r"routes\.1: /run \['POST'\] is already limited"):
        ConcurrencySettings(
            routes=[route(methods=["POST", "PUT"]), route(limit_name="b", methods=["POST"])]
        )
    # Disjoint methods of one path are fine.
    ConcurrencySettings(routes=[route(methods=["POST"]), route(limit_name="b", methods=["GET"])])


def test_operation_names_are_unique_and_distinct_from_route_names():
    judge = {"limit_name": "judge", "operation": "judge", "executor": "inline", "max_concurrent": 1}
    with pytest.raises(ValidationError, match=r"operations\.1\.limit_name: 'judge' is configured"):
        ConcurrencySettings(operations=[judge, judge])
    with pytest.raises(ValidationError, match=r"operations\.0\.limit_name: 'episodes' is also"):
        ConcurrencySettings(routes=[route()], operations=[{**judge, "limit_name": "episodes"}])


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GYM_CONCURRENCY_COMPONENT", "math_env")
    monkeypatch.setenv("GYM_CONCURRENCY_SERVER_NAME", "math_env_1")
    monkeypatch.setenv(
        "GYM_CONCURRENCY_ROUTES",
        json.dumps([route(queue_timeout_seconds=2.5, failure="episode", max_queue=10)]),
    )
    monkeypatch.setenv(
        "GYM_CONCURRENCY_OPERATIONS",
        '[{"limit_name": "verifier", "operation": "verify", "executor": "subprocess",'
        ' "max_concurrent": 2, "timeout_seconds": 30}]',
    )
    settings = ConcurrencySettings()
    assert settings.component == "math_env"
    assert settings.server_name == "math_env_1"
    assert settings.routes == [
        RouteLimit(
            path="/run",
            limit_name="episodes",
            max_concurrent=4,
            queue_timeout_seconds=2.5,
            failure="episode",
            max_queue=10,
        )
    ]
    assert settings.operations[0].timeout_seconds == 30


def test_settings_from_nested_environment_variables(monkeypatch: pytest.MonkeyPatch):
    # No JSON needed: list entries by index, fields nested with "__", methods as one string.
    for name, value in {
        "ROUTES__1__PATH": "/v1/chat/completions",
        "ROUTES__1__LIMIT_NAME": "upstream_requests",
        "ROUTES__1__MAX_CONCURRENT": "16",
        "ROUTES__1__METHODS": "GET,POST",
        "ROUTES__0__PATH": "/run",
        "ROUTES__0__LIMIT_NAME": "episodes",
        "ROUTES__0__MAX_CONCURRENT": "8",
        "ROUTES__0__QUEUE_TIMEOUT_SECONDS": "2.5",
        "ROUTES__0__FAILURE": "episode",
        "OPERATIONS__0__LIMIT_NAME": "verifier",
        "OPERATIONS__0__OPERATION": "verify",
        "OPERATIONS__0__EXECUTOR": "subprocess",
        "OPERATIONS__0__MAX_CONCURRENT": "2",
    }.items():
        monkeypatch.setenv(f"GYM_CONCURRENCY_{name}", value)
    settings = ConcurrencySettings()
    assert [(r.path, r.limit_name, r.max_concurrent) for r in settings.routes] == [
        ("/run", "episodes", 8),
        ("/v1/chat/completions", "upstream_requests", 16),
    ]
    assert settings.routes[0].queue_timeout_seconds == 2.5
    assert settings.routes[0].failure == "episode"
    assert settings.routes[1].methods == ("GET", "POST")
    assert settings.operations[0].executor == "subprocess"


def test_a_nested_environment_variable_error_names_the_field(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__PATH", "/run")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__LIMIT_NAME", "episodes")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT", "8")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__METHODS", "post")
    with pytest.raises(ValidationError, match=r"routes\.0\.methods"):
        ConcurrencySettings()


def test_invalid_environment_names_the_field(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES", json.dumps([route(max_concurrent=0)]))
    with pytest.raises(ValidationError, match=r"routes\.0\.max_concurrent"):
        ConcurrencySettings()


YAML = """
component: math_env
server_name: math_env_1
routes:
  - path: /run
    methods: [POST]
    limit_name: episodes
    max_concurrent: 4
    queue_timeout_seconds: 30
    failure: episode
  - path: /v1/chat/completions
    limit_name: upstream_requests
    max_concurrent: 16
    max_queue: 64
    failure: openai
operations:
  - limit_name: judge
    operation: judge
    executor: inline
    max_concurrent: 2
"""


def test_settings_from_yaml_file(tmp_path: Path):
    path = tmp_path / "concurrency.yaml"
    path.write_text(YAML)
    settings = ConcurrencySettings.from_file(path)
    assert settings.component == "math_env"
    assert [(r.path, r.methods, r.failure) for r in settings.routes] == [
        ("/run", ("POST",), "episode"),
        ("/v1/chat/completions", None, "openai"),
    ]
    assert settings.operations[0].limit_name == "judge"


def test_settings_from_json_file(tmp_path: Path):
    path = tmp_path / "concurrency.json"
    path.write_text(json.dumps({"server_name": "s1", "routes": [route()]}))
    settings = ConcurrencySettings.from_file(str(path))
    assert settings.server_name == "s1"
    assert settings.component == "resources_server"
    assert settings.routes[0].limit_name == "episodes"


def test_file_fields_win_and_environment_fills_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GYM_CONCURRENCY_COMPONENT", "from_env")
    monkeypatch.setenv("GYM_CONCURRENCY_SERVER_NAME", "from_env")
    path = tmp_path / "concurrency.json"
    path.write_text(json.dumps({"server_name": "from_file"}))
    settings = ConcurrencySettings.from_file(path)
    assert (settings.component, settings.server_name) == ("from_env", "from_file")


def test_invalid_file_names_the_field_and_the_problem(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("routes:\n  - {path: /run, limit_name: e, max_concurrent: 1, max_queue: -2}\n")
    with pytest.raises(ValidationError, match=r"routes\.0\.max_queue"):
        ConcurrencySettings.from_file(path)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n")
    with pytest.raises(ValueError, match="must hold a mapping, got list"):
        ConcurrencySettings.from_file(listing)
    toml = tmp_path / "settings.toml"
    toml.write_text("")
    with pytest.raises(ValueError, match=r"must end in \.yaml, \.yml or \.json"):
        ConcurrencySettings.from_file(toml)


@pytest.mark.parametrize(
    ("name", "content"),
    [("bad.json", b"{not json"), ("bad.yaml", b"routes: [unclosed"), ("bad.yaml", b"\xff\xfe")],
)
def test_unparsable_file_names_the_file(tmp_path: Path, name: str, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"{name}: not a valid (JSON|YAML) settings file"):
        ConcurrencySettings.from_file(path)
