"""Environment overrides that address a file's entry by its limit_name, not its position:
`GYM_CONCURRENCY_ROUTES__episodes__MAX_CONCURRENT=8` follows the entry when the file is
reordered, where `ROUTES__0__...` would silently move to another one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from gym_concurrency.middleware import ConcurrencySettings
from gym_concurrency.middleware.settings.environment import EnvironmentSettingsError

EPISODES = {"path": "/run", "limit_name": "episodes", "max_concurrent": 4}
UPSTREAM = {"path": "/v1/chat/completions", "limit_name": "upstream_requests", "max_concurrent": 16}
JUDGE = {"limit_name": "judge", "operation": "judge", "executor": "inline", "max_concurrent": 2}


def file_with(tmp_path: Path, **settings: object) -> Path:
    path = tmp_path / "concurrency.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def sizes(settings: ConcurrencySettings) -> dict[str, tuple[str, int]]:
    return {r.path: (r.limit_name, r.max_concurrent) for r in settings.routes}


@pytest.mark.parametrize("order", [[EPISODES, UPSTREAM], [UPSTREAM, EPISODES]], ids=["a", "b"])
def test_a_named_override_follows_its_entry_wherever_the_file_puts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: list[dict[str, object]]
):
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__episodes__MAX_CONCURRENT", "8")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__UPSTREAM_REQUESTS__MAX_QUEUE", "3")
    monkeypatch.setenv("GYM_CONCURRENCY_OPERATIONS__judge__TIMEOUT_SECONDS", "60")
    settings = ConcurrencySettings.from_file(file_with(tmp_path, routes=order, operations=[JUDGE]))
    assert sizes(settings) == {
        "/run": ("episodes", 8),
        "/v1/chat/completions": (UPSTREAM["limit_name"], 16),
    }
    upstream = next(r for r in settings.routes if r.limit_name == "upstream_requests")
    assert upstream.max_queue == 3
    assert settings.operations[0].timeout_seconds == 60


def test_a_named_override_changes_every_route_sharing_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Routes that share a limit_name share one limit, so their sizes must agree: one
    # variable resizes all of them.
    second = {**EPISODES, "path": "/episodes/{episode_id}"}
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__EPISODES__MAX_CONCURRENT", "2")
    settings = ConcurrencySettings.from_file(
        file_with(tmp_path, routes=[EPISODES, UPSTREAM, second])
    )
    assert [r.max_concurrent for r in settings.routes] == [2, 16, 2]


def test_the_positional_form_still_works_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__1__MAX_CONCURRENT", "9")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__episodes__QUEUE_TIMEOUT_SECONDS", "30")
    settings = ConcurrencySettings.from_file(file_with(tmp_path, routes=[EPISODES, UPSTREAM]))
    assert [r.max_concurrent for r in settings.routes] == [4, 9]
    assert settings.routes[0].queue_timeout_seconds == 30


def test_a_name_no_entry_has_is_an_error_that_lists_the_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__EPISODS__MAX_CONCURRENT", "8")
    with pytest.raises(EnvironmentSettingsError) as raised:
        ConcurrencySettings.from_file(file_with(tmp_path, routes=[EPISODES, UPSTREAM]))
    message = str(raised.value)
    assert "GYM_CONCURRENCY_ROUTES__EPISODS__MAX_CONCURRENT" in message
    assert "no entry of routes has limit_name 'episods'" in message
    assert "the file has episodes, upstream_requests; did you mean 'episodes'?" in message
    assert "GYM_CONCURRENCY_ROUTES__2__<FIELD>" in message  # how to add one instead


def test_without_a_file_a_name_has_nothing_to_change(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__episodes__MAX_CONCURRENT", "8")
    with pytest.raises(EnvironmentSettingsError, match="no settings file lists any"):
        ConcurrencySettings()


def test_one_field_set_by_name_and_by_index_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT", "8")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__episodes__MAX_CONCURRENT", "9")
    with pytest.raises(EnvironmentSettingsError, match="sets the same setting as"):
        ConcurrencySettings.from_file(file_with(tmp_path, routes=[EPISODES, UPSTREAM]))


def test_names_that_differ_only_in_case_must_be_given_by_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    upper = {**UPSTREAM, "limit_name": "Episodes"}
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__EPISODES__MAX_CONCURRENT", "8")
    with pytest.raises(EnvironmentSettingsError, match="matches limit_names Episodes, episodes"):
        ConcurrencySettings.from_file(file_with(tmp_path, routes=[EPISODES, upper]))
