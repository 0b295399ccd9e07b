"""The demo with several uvicorn workers: each process serves its own metrics port
(DEMO_METRICS_PORTS), so a scrape never mixes workers and each one's series stay apart."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.uvicorn_process import Uvicorn, clean_env


def two_free_ports() -> int:
    """A port P such that P and P + 1 were both free a moment ago."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return int(port)
    raise AssertionError("no two consecutive free ports")


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    families: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            families.setdefault(sample.name, []).append((sample.labels, sample.value))
    return families


def test_each_worker_serves_its_own_metrics_port(tmp_path: Path):
    first = two_free_ports()
    env = clean_env(DEMO_METRICS_PORTS=f"{first}-{first + 1}", OTEL_METRICS_EXPORTER="prometheus")
    server = Uvicorn(tmp_path, "examples.fastapi_app.app:app", env, "--workers", "2")
    try:
        server.wait_serving("/concurrency")
        deadline = time.monotonic() + 30
        scrapes: dict[int, dict[str, list[tuple[dict[str, str], float]]]] = {}
        while len(scrapes) < 2:
            assert time.monotonic() < deadline, f"both workers' ports did not serve:\n{server.log}"
            for port in (first, first + 1):
                try:
                    scrapes[port] = scrape(port)
                except httpx.TransportError:
                    time.sleep(0.1)
        instances = {
            labels["service_instance_id"]
            for families in scrapes.values()
            for labels, _ in families["target_info"]
        }
        assert len(instances) == 2  # two processes, told apart
        for families in scrapes.values():
            limits = {
                labels["nemo_gym_concurrency_limit_name"]: value
                for labels, value in families["gym_concurrency_limit"]
            }
            assert limits["episodes"] == 8.0  # this worker's own limit, not a sum or a mix
        # The shared app port serves no /metrics: nothing scrapes a worker at random.
        assert httpx.get(server.url + "/metrics", timeout=5).status_code == 404
    finally:
        server.stop()
