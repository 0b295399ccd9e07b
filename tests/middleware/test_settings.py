"""ConcurrencySettings: from arguments, the environment and YAML / JSON files; invalid values
fail with an error naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gym_concurrency.middleware import ConcurrencySettings, OperationLimit, RouteLimit
from pydantic import ValidationError
from pydantic_settings import SettingsError

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
    [
        ("max_concurrent", 8),
        ("queue_timeout_seconds", 2.0),
        ("max_queue", 3),
        ("scope", "global"),  # one limit cannot be both this process's and every process's
    ],
)
def test_routes_sharing_a_limit_name_must_agree(field: str, value: object):
    with pytest.raises(ValidationError) as raised:
        ConcurrencySettings(
            redis_url="redis://127.0.0.1:6379/0",
            routes=[route(), route(path="/other", **{field: value})],
        )
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


def test_environment_fields_win_and_the_file_fills_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GYM_CONCURRENCY_SERVER_NAME", "from_env")
    path = tmp_path / "concurrency.json"
    path.write_text(json.dumps({"component": "from_file", "server_name": "from_file"}))
    settings = ConcurrencySettings.from_file(path)
    assert (settings.component, settings.server_name) == ("from_file", "from_env")


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


# --- Environment variables: unknown names, conflicting forms and gaps are errors (issue 10.6)


def set_env(monkeypatch: pytest.MonkeyPatch, variables: dict[str, str]) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


ROUTE_VARS = {
    "GYM_CONCURRENCY_ROUTES__0__PATH": "/run",
    "GYM_CONCURRENCY_ROUTES__0__LIMIT_NAME": "episodes",
    "GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT": "4",
}


@pytest.mark.parametrize(
    ("variables", "named", "suggested"),
    [
        (
            {"GYM_CONCURRENCY_ROUTE": json.dumps([ROUTE])},
            "GYM_CONCURRENCY_ROUTE",
            "GYM_CONCURRENCY_ROUTES",
        ),
        (
            {"GYM_CONCURRENCY_ROUTES_0_PATH": "/run"},
            "GYM_CONCURRENCY_ROUTES_0_PATH",
            "GYM_CONCURRENCY_ROUTES__0__PATH",
        ),
        (
            {**ROUTE_VARS, "GYM_CONCURRENCY_ROUTES__0__MAX_CONCURENT": "3"},
            "GYM_CONCURRENCY_ROUTES__0__MAX_CONCURENT",
            "GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT",
        ),
        (
            {"GYM_CONCURRENCY_SERVERNAME": "s1"},
            "GYM_CONCURRENCY_SERVERNAME",
            "GYM_CONCURRENCY_SERVER_NAME",
        ),
        (
            {"GYM_CONCURRENCY_MAX_QUEUED_BODY_BYTE": "10"},
            "GYM_CONCURRENCY_MAX_QUEUED_BODY_BYTE",
            "GYM_CONCURRENCY_MAX_QUEUED_BODY_BYTES",
        ),
        (
            {"GYM_CONCURRENCY_OPERATIONS__0__TIMEOUT": "3"},
            "GYM_CONCURRENCY_OPERATIONS__0__TIMEOUT",
            "GYM_CONCURRENCY_OPERATIONS__0__TIMEOUT_SECONDS",
        ),
        (
            {"GYM_CONCURRENCY_ROUTES__first__PATH": "/run"},
            "GYM_CONCURRENCY_ROUTES__first__PATH",
            "index",
        ),
        (
            {"GYM_CONCURRENCY_COMPONENT__NAME": "x"},
            "GYM_CONCURRENCY_COMPONENT__NAME",
            "GYM_CONCURRENCY_COMPONENT",
        ),
    ],
)
def test_an_unknown_environment_variable_is_an_error_suggesting_the_field(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str, suggested: str
):
    set_env(monkeypatch, variables)
    with pytest.raises(SettingsError) as raised:
        ConcurrencySettings()
    error = str(raised.value)
    assert named in error
    assert suggested in error


def test_a_json_list_and_per_entry_variables_conflict(monkeypatch: pytest.MonkeyPatch):
    # Before: the JSON list won and the override was dropped without a word.
    set_env(
        monkeypatch,
        {
            "GYM_CONCURRENCY_ROUTES": json.dumps([ROUTE]),
            "GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT": "8",
        },
    )
    with pytest.raises(SettingsError) as raised:
        ConcurrencySettings()
    error = str(raised.value)
    assert "GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT" in error
    assert "GYM_CONCURRENCY_ROUTES " in error or "GYM_CONCURRENCY_ROUTES:" in error


@pytest.mark.parametrize("indexes", [(1,), (0, 2)])
def test_entry_indexes_count_from_zero_without_gaps(
    monkeypatch: pytest.MonkeyPatch, indexes: tuple[int, ...]
):
    # Before: `__1__` for the first route gave errors about routes.0 (or dropped a route).
    for index in indexes:
        set_env(
            monkeypatch,
            {
                f"GYM_CONCURRENCY_ROUTES__{index}__PATH": f"/r{index}",
                f"GYM_CONCURRENCY_ROUTES__{index}__LIMIT_NAME": f"l{index}",
                f"GYM_CONCURRENCY_ROUTES__{index}__MAX_CONCURRENT": "1",
            },
        )
    missing = next(i for i in range(3) if i not in indexes)
    with pytest.raises(SettingsError) as raised:
        ConcurrencySettings()
    error = str(raised.value)
    assert f"GYM_CONCURRENCY_ROUTES__{missing + 1}__" in error
    assert f"GYM_CONCURRENCY_ROUTES__{missing}__*" in error


def test_every_field_of_the_model_is_an_environment_variable(monkeypatch: pytest.MonkeyPatch):
    # Read from the model's fields, not a list: a field added later works (and is suggested).
    class WithRedis(ConcurrencySettings):
        redis_url: str | None = None

    set_env(
        monkeypatch,
        {
            "GYM_CONCURRENCY_REDIS_URL": "redis://127.0.0.1:6379/0",
            "GYM_CONCURRENCY_MAX_QUEUED_BODY_BYTES_TOTAL": "1000",
            "GYM_CONCURRENCY_REFUSAL_BODY_TIMEOUT_SECONDS": "2.5",
            "GYM_CONCURRENCY_CLOSE_CONNECTION_ON_REFUSAL": "false",
            **ROUTE_VARS,
        },
    )
    settings = WithRedis()
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.max_queued_body_bytes_total == 1000
    assert settings.refusal_body_timeout_seconds == 2.5
    assert settings.close_connection_on_refusal is False
    assert settings.routes[0].max_concurrent == 4
    monkeypatch.setenv("GYM_CONCURRENCY_REDIS_UR", "redis://127.0.0.1:6379/0")
    with pytest.raises(SettingsError, match="did you mean GYM_CONCURRENCY_REDIS_URL"):
        WithRedis()


def test_the_documented_environment_forms_still_work(monkeypatch: pytest.MonkeyPatch):
    set_env(
        monkeypatch,
        {
            "gym_concurrency_component": "lower_case_names_work",
            "GYM_CONCURRENCY_OPERATIONS": json.dumps(
                [
                    {
                        "limit_name": "judge",
                        "operation": "judge",
                        "executor": "inline",
                        "max_concurrent": 2,
                    }
                ]
            ),
            **ROUTE_VARS,
            "GYM_CONCURRENCY_ROUTES__0__METHODS": '["POST"]',
            "GYM_CONCURRENCY_ROUTES__1__PATH": "/v1/chat/completions",
            "GYM_CONCURRENCY_ROUTES__1__LIMIT_NAME": "upstream",
            "GYM_CONCURRENCY_ROUTES__1__MAX_CONCURRENT": "16",
            "GYM_CONCURRENCY_ROUTES__1__MAX_QUEUE": "0",
            "GYM_CONCURRENCY_ROUTES__1__QUEUE_TIMEOUT_SECONDS": "0.5",
        },
    )
    settings = ConcurrencySettings()
    assert settings.component == "lower_case_names_work"
    assert settings.operations[0].max_concurrent == 2
    assert [(r.path, r.methods, r.max_queue) for r in settings.routes] == [
        ("/run", ("POST",), None),
        ("/v1/chat/completions", None, 0),
    ]
    assert settings.routes[1].queue_timeout_seconds == 0.5
    # Keyword arguments still win over the environment.
    assert ConcurrencySettings(component="from_code").component == "from_code"


# --- Numbers must be numbers (issue 10.7)

NOT_NUMBERS_IN_YAML = [
    ("max_queue", "off"),
    ("max_queue", "no"),
    ("max_concurrent", "yes"),
    ("max_concurrent", "true"),
    ("max_concurrent", "010"),
    ("max_concurrent", "0o10"),
    ("max_concurrent", "0x10"),
    ("max_concurrent", "1_000"),
    ("max_concurrent", "1:30"),
    ("queue_timeout_seconds", "on"),
    ("queue_timeout_seconds", "1:30"),
    ("queue_timeout_seconds", "010.5"),
    ("retry_after_seconds", "off"),
]


@pytest.mark.parametrize(("field", "text"), NOT_NUMBERS_IN_YAML)
def test_yaml_booleans_and_yaml_1_1_numbers_are_not_numbers(tmp_path: Path, field: str, text: str):
    # Before: `max_queue: off` loaded as 0, `yes` as 1, `on` as 1.0 and `010` as 8.
    path = tmp_path / "concurrency.yaml"
    base = "path: /run, limit_name: episodes, max_concurrent: 4"
    base = base.replace(", max_concurrent: 4", "") if field == "max_concurrent" else base
    path.write_text(f"routes:\n  - {{{base}, {field}: {text}}}\n")
    with pytest.raises(ValidationError) as raised:
        ConcurrencySettings.from_file(path)
    assert f"routes.0.{field}" in str(raised.value)


@pytest.mark.parametrize("text", ["no", "off", "false", "010"])
def test_a_top_level_yaml_number_is_a_number(tmp_path: Path, text: str):
    path = tmp_path / "concurrency.yaml"
    path.write_text(f"max_queued_body_bytes: {text}\n")
    with pytest.raises(ValidationError, match=r"max_queued_body_bytes\n"):
        ConcurrencySettings.from_file(path)


def test_yaml_numbers_that_are_numbers_load(tmp_path: Path):
    path = tmp_path / "concurrency.yaml"
    path.write_text(
        "max_queued_body_bytes: 0\n"
        "routes:\n"
        "  - {path: /run, limit_name: e, max_concurrent: 10, queue_timeout_seconds: 0.5,"
        " max_queue: 0, retry_after_seconds: 3}\n"
        "  - {path: /a, limit_name: f, max_concurrent: +2, queue_timeout_seconds: 30,"
        " max_queue: null}\n"
        '  - {path: /b, limit_name: g, max_concurrent: "5", queue_timeout_seconds: 1e1,'
        " max_queue: ~}\n"
    )
    settings = ConcurrencySettings.from_file(path)
    assert settings.max_queued_body_bytes == 0
    assert [(r.max_concurrent, r.queue_timeout_seconds, r.max_queue) for r in settings.routes] == [
        (10, 0.5, 0),
        (2, 30.0, None),
        (5, 10.0, None),
    ]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"max_concurrent": True}, "max_concurrent"),
        ({"max_queue": False}, "max_queue"),
        ({"queue_timeout_seconds": True}, "queue_timeout_seconds"),
        ({"retry_after_seconds": True}, "retry_after_seconds"),
        ({"max_concurrent": "010"}, "max_concurrent"),
        ({"max_concurrent": "yes"}, "max_concurrent"),
    ],
)
def test_booleans_are_not_numbers_in_code_or_json(changes: dict[str, object], field: str):
    with pytest.raises(ValidationError) as raised:
        ConcurrencySettings(routes=[route(**changes)])
    assert f"routes.0.{field}" in str(raised.value)
    with pytest.raises(ValidationError):
        ConcurrencySettings(max_queued_body_bytes=False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT", "yes", "routes.0.max_concurrent"),
        ("GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT", "010", "routes.0.max_concurrent"),
        ("GYM_CONCURRENCY_ROUTES__0__MAX_QUEUE", "off", "routes.0.max_queue"),
        (
            "GYM_CONCURRENCY_ROUTES__0__QUEUE_TIMEOUT_SECONDS",
            "on",
            "routes.0.queue_timeout_seconds",
        ),
        ("GYM_CONCURRENCY_MAX_QUEUED_BODY_BYTES", "no", "max_queued_body_bytes"),
        (
            "GYM_CONCURRENCY_ROUTES",
            json.dumps([route(max_concurrent=True)]),
            "routes.0.max_concurrent",
        ),
    ],
)
def test_environment_numbers_are_numbers(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str
):
    if not variable.startswith("GYM_CONCURRENCY_ROUTES"):
        set_env(monkeypatch, ROUTE_VARS)
    elif variable != "GYM_CONCURRENCY_ROUTES":
        set_env(monkeypatch, {k: v for k, v in ROUTE_VARS.items() if k != variable})
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as raised:
        ConcurrencySettings()
    assert field in str(raised.value)


# --- One precedence rule: code, then the environment, then the file (issue 10.13)


def test_the_environment_wins_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "concurrency.yaml"
    path.write_text(
        "component: from_file\nserver_name: from_file\nroutes:\n"
        "  - {path: /run, limit_name: episodes, max_concurrent: 4, failure: episode}\n"
    )
    set_env(
        monkeypatch,
        {
            "GYM_CONCURRENCY_SERVER_NAME": "from_env",
            # One field of the file's first route, and a second route, one variable per field.
            "GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT": "2",
            "GYM_CONCURRENCY_ROUTES__1__PATH": "/v1/chat/completions",
            "GYM_CONCURRENCY_ROUTES__1__LIMIT_NAME": "upstream",
            "GYM_CONCURRENCY_ROUTES__1__MAX_CONCURRENT": "16",
        },
    )
    settings = ConcurrencySettings.from_file(path)
    assert (settings.component, settings.server_name) == ("from_file", "from_env")
    assert [(r.path, r.max_concurrent, r.failure) for r in settings.routes] == [
        ("/run", 2, "episode"),
        ("/v1/chat/completions", 16, "problem"),
    ]
    # A JSON list replaces the file's whole list.
    monkeypatch.delenv("GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT")
    for field in ("PATH", "LIMIT_NAME", "MAX_CONCURRENT"):
        monkeypatch.delenv(f"GYM_CONCURRENCY_ROUTES__1__{field}")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES", json.dumps([route(path="/other")]))
    assert [r.path for r in ConcurrencySettings.from_file(path).routes] == ["/other"]
    # The next index after the file's last entry adds an entry.
    monkeypatch.delenv("GYM_CONCURRENCY_ROUTES")
    two = tmp_path / "two.yaml"
    two.write_text(
        "routes:\n  - {path: /a, limit_name: a, max_concurrent: 1}\n"
        "  - {path: /b, limit_name: b, max_concurrent: 1}\n"
    )
    set_env(
        monkeypatch,
        {
            "GYM_CONCURRENCY_ROUTES__2__PATH": "/c",
            "GYM_CONCURRENCY_ROUTES__2__LIMIT_NAME": "c",
            "GYM_CONCURRENCY_ROUTES__2__MAX_CONCURRENT": "3",
        },
    )
    assert [r.path for r in ConcurrencySettings.from_file(two).routes] == ["/a", "/b", "/c"]
    for field in ("PATH", "LIMIT_NAME", "MAX_CONCURRENT"):
        monkeypatch.delenv(f"GYM_CONCURRENCY_ROUTES__2__{field}")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES", json.dumps([route(path="/other")]))
    # An index past the file's entries leaves no gap unnoticed.
    monkeypatch.delenv("GYM_CONCURRENCY_ROUTES")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__2__PATH", "/x")
    with pytest.raises(SettingsError, match=r"GYM_CONCURRENCY_ROUTES__2__PATH"):
        ConcurrencySettings.from_file(path)


def test_the_redis_key_prefix_is_read_and_checked(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GYM_CONCURRENCY_REDIS_KEY_PREFIX", "team_blue")
    assert ConcurrencySettings().redis_key_prefix == "team_blue"
    assert ConcurrencySettings(redis_key_prefix=None).redis_key_prefix is None
    for bad in ("a{b}", "", "two words"):
        with pytest.raises(ValidationError, match="redis_key_prefix"):
            ConcurrencySettings(redis_key_prefix=bad)
