"""The docker-compose stack, checked without a docker engine: the compose file against the
compose spec, Prometheus's config and the dashboard's PromQL with promtool, and every file,
port and service name one part of the stack expects of another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from dashboard import dashboard_metric_names, expressions, load_dashboard
from demo_processes import REPO, clean_env, require_binary

COMPOSE = REPO / "docker-compose.yml"
DEPLOY = REPO / "deploy"


def compose() -> dict[str, Any]:
    value: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return value


def check_compose_schema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_compose_file_follows_the_compose_spec():
    result = check_compose_schema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compose_check_catches_a_broken_file(tmp_path: Path):
    broken = compose()
    broken["services"]["demo"]["depends_on"] = {"fake-model": {"condition": "when_ready"}}
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    assert check_compose_schema(path).returncode != 0


def test_the_stack_has_every_service_an_operator_needs():
    services = compose()["services"]
    assert set(services) == {"demo", "fake-model", "otel-collector", "prometheus", "grafana"}
    assert services["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    for name, service in services.items():
        image = service["image"]
        assert ":" in image, f"{name}: pin the image tag"
        assert not image.endswith(":latest"), f"{name}: pin the image tag"


def test_every_file_the_stack_mounts_or_builds_from_exists():
    services = compose()["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert (REPO / source).exists(), f"{name} mounts {source}, which does not exist"
    dockerfile = REPO / services["demo"]["build"]["dockerfile"]
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), f"{dockerfile.name} copies missing {source}"


@pytest.mark.parametrize("service", ["demo", "fake-model"])
def test_the_app_each_container_runs_imports(service: str):
    command = compose()["services"][service].get("command")
    if command is None:  # the Dockerfile's CMD
        dockerfile = (REPO / "examples" / "fastapi_app" / "Dockerfile").read_text()
        cmd_line = next(line for line in dockerfile.splitlines() if line.startswith("CMD "))
        command = yaml.safe_load(cmd_line.removeprefix("CMD "))
    module, attribute = command[1].split(":")
    code = f"import importlib; assert importlib.import_module({module!r}).{attribute}"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(OTEL_METRICS_EXPORTER="none"),
    )
    assert result.returncode == 0, result.stderr


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_the_demo_sends_otlp_to_the_collector_and_prometheus_scrapes_it():
    services = compose()["services"]
    collector = yaml.safe_load((DEPLOY / "otel-collector" / "config.yaml").read_text())
    endpoint = urlsplit(services["demo"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint.hostname == "otel-collector"
    assert endpoint.port == _port(collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"])
    assert "otlp" in services["demo"]["environment"]["OTEL_METRICS_EXPORTER"].split(",")
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = [
        t for job in scrape["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    ]
    assert targets == [f"otel-collector:{_port(collector['exporters']['prometheus']['endpoint'])}"]
    for pipeline in collector["service"]["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in collector[kind], f"pipeline uses undefined {component}"
    assert "otlp" in collector["service"]["pipelines"]["metrics"]["receivers"]
    assert "prometheus" in collector["service"]["pipelines"]["metrics"]["exporters"]


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard():
    grafana = compose()["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    provisioning = REPO / next(s for s, t in mounts.items() if t == "/etc/grafana/provisioning")
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    source = datasources["datasources"][0]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert "9090:9090" in compose()["services"]["prometheus"]["ports"]
    providers = yaml.safe_load((provisioning / "dashboards" / "gym-concurrency.yml").read_text())
    dashboards_dir = providers["providers"][0]["options"]["path"]
    host_dir = REPO / next(s for s, t in mounts.items() if t == dashboards_dir)
    assert (host_dir / "gym-concurrency.json").is_file()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards_dir}/gym-concurrency.json"
    uids = {t["datasource"]["uid"] for p in load_dashboard()["panels"] for t in p["targets"]}
    assert uids == {source["uid"]}


def test_promtool_accepts_the_prometheus_config():
    promtool = require_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path: Path):
    promtool = require_binary("promtool")
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{index}", "expr": expr.replace('"$limit"', '".*"')}
                    for index, expr in enumerate(expressions())
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_shows_limits_failures_and_distributions():
    names = dashboard_metric_names()
    assert {
        "gym_concurrency_limit",
        "gym_concurrency_active",
        "gym_concurrency_queue_depth",
    } <= names
    assert {
        "gym_concurrency_admission_timeouts_total",
        "gym_concurrency_admission_cancelled_total",
        "gym_concurrency_admission_shed_total",
    } <= names
    assert {
        "gym_concurrency_queue_wait_duration_ms_milliseconds_bucket",
        "gym_resources_operation_queue_duration_ms_milliseconds_bucket",
        "gym_resources_operation_duration_ms_milliseconds_bucket",
    } <= names
    by_outcome = [
        e
        for e in expressions()
        if "gym_resources_operation_duration_ms" in e
        and "nemo_gym_resources_operation_outcome" in e
    ]
    assert by_outcome, "operation durations must be broken down by outcome"


def test_the_dashboard_shows_each_limits_busiest_flows():
    (panel,) = [
        p
        for p in load_dashboard()["panels"]
        if any("gym_concurrency_flow_" in t["expr"] for t in p["targets"])
    ]
    exprs = {t["refId"]: t["expr"] for t in panel["targets"]}
    assert "gym_concurrency_flow_held{" in exprs["A"]
    assert "gym_concurrency_flow_queued_weight{" in exprs["B"]
    for expr in exprs.values():
        assert "by (nemo_gym_concurrency_limit_name, nemo_gym_concurrency_flow)" in expr
        assert 'nemo_gym_concurrency_limit_name=~"$limit"' in expr
    queued = next(o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "B")
    assert {"id": "custom.transform", "value": "negative-Y"} in queued["properties"]
