"""The demo's configuration: the settings file, the environment over it, and OTEL_* choices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from examples.fastapi_app.config import DEFAULT_SETTINGS_FILE, load_concurrency_settings
from examples.fastapi_app.telemetry import configure_telemetry, exporter_names


def test_the_settings_file_holds_every_limit_of_the_demo():
    settings = load_concurrency_settings(DEFAULT_SETTINGS_FILE)
    routes = {route.limit_name: route for route in settings.routes}
    assert settings.component == "demo_resources_server"
    assert (routes["episodes"].path, routes["episodes"].failure) == ("/run", "episode")
    assert routes["upstream_requests"].failure == "openai"
    assert routes["verify_requests"].failure == "problem"
    operations = {op.limit_name: (op.operation, op.executor) for op in settings.operations}
    assert operations == {"verifier": ("verify", "subprocess"), "judge": ("judge", "inline")}


def test_the_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch):
    routes = [{"path": "/run", "limit_name": "episodes", "max_concurrent": 1, "failure": "episode"}]
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES", json.dumps(routes))
    monkeypatch.setenv("GYM_CONCURRENCY_SERVER_NAME", "replica-7")
    settings = load_concurrency_settings(DEFAULT_SETTINGS_FILE)
    assert settings.server_name == "replica-7"
    assert [(r.limit_name, r.max_concurrent) for r in settings.routes] == [("episodes", 1)]
    assert settings.component == "demo_resources_server"  # not overridden: from the file
    assert len(settings.operations) == 2


def test_a_bad_value_in_the_environment_names_the_field(monkeypatch: pytest.MonkeyPatch):
    routes = [{"path": "/run", "limit_name": "episodes", "max_concurrent": 0}]
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES", json.dumps(routes))
    with pytest.raises(ValidationError, match=r"routes\.0\.max_concurrent"):
        load_concurrency_settings(DEFAULT_SETTINGS_FILE)


def test_a_missing_settings_file_is_named(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="DEMO_SETTINGS_FILE: no settings file at"):
        load_concurrency_settings(tmp_path / "nowhere.yaml")


def test_metrics_exporters_come_from_otel_metrics_exporter(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    assert exporter_names(
        "OTEL_METRICS_EXPORTER", frozenset({"prometheus", "otlp", "none"}), "prometheus"
    ) == ["prometheus"]
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", " prometheus, OTLP ,none")
    assert exporter_names(
        "OTEL_METRICS_EXPORTER", frozenset({"prometheus", "otlp", "none"}), "prometheus"
    ) == ["prometheus", "otlp"]


def test_an_unknown_exporter_is_refused_by_name(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus,zipkin")
    with pytest.raises(ValueError, match="OTEL_METRICS_EXPORTER: unknown exporter zipkin"):
        configure_telemetry(set_global=False)


def test_the_resource_names_the_service_and_this_instance(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "episodes-east")
    first = configure_telemetry(set_global=False)
    second = configure_telemetry(set_global=False)
    try:
        attributes = first.meter_provider._sdk_config.resource.attributes
        other = second.meter_provider._sdk_config.resource.attributes
        assert attributes["service.name"] == "episodes-east"
        assert attributes["service.instance.id"] != other["service.instance.id"]
        assert first.prometheus_registry is not second.prometheus_registry
    finally:
        first.shutdown()
        second.shutdown()
