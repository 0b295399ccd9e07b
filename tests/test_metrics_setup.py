"""The README's and docs/metrics.md's "metrics from your own app" blocks run as printed: the
README's middleware app plus each block, served by a real uvicorn, shows its limit on a
Prometheus scrape of /metrics, or pushes it over OTLP/HTTP to a receiver in the test."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.otlp_receiver import OtlpReceiver
from tests.uvicorn_process import ROOT, clean_env, uvicorn

PAGES = [ROOT / "README.md", ROOT / "docs" / "metrics.md"]
MIDDLEWARE_EXAMPLE = "app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)"


def block(page: Path, marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"{page.name}: {len(found)} python blocks with {marker!r}"
    return found[0]


def write_app(folder: Path, page: Path, marker: str) -> None:
    """The README's middleware example, then the page's block that sets up metrics."""
    source = block(ROOT / "README.md", MIDDLEWARE_EXAMPLE) + "\n" + block(page, marker)
    (folder / "metrics_app.py").write_text(source)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_prometheus_block_serves_metrics(tmp_path: Path, page: Path):
    write_app(tmp_path, page, "PrometheusMetricReader")
    with uvicorn(tmp_path, "metrics_app:app", clean_env()) as server:
        server.wait_serving("/docs")
        assert httpx.post(server.url + "/run", timeout=5).json() == {"reward": 1.0}
        scrape = httpx.get(server.url + "/metrics", follow_redirects=True, timeout=5)
    assert scrape.status_code == 200
    limit = [
        line
        for line in scrape.text.splitlines()
        if line.startswith("gym_concurrency_limit{")
        and 'nemo_gym_concurrency_limit_name="episodes"' in line
    ]
    assert len(limit) == 1, scrape.text
    assert limit[0].endswith(" 100.0")
    assert 'nemo_gym_server_name="math_env"' in limit[0]


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as otlp:
        yield otlp


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_otlp_block_pushes_metrics(tmp_path: Path, page: Path, receiver: OtlpReceiver):
    write_app(tmp_path, page, "OTLPMetricExporter")
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_METRIC_EXPORT_INTERVAL="200")
    with uvicorn(tmp_path, "metrics_app:app", env) as server:
        server.wait_serving("/docs")
        assert httpx.post(server.url + "/run", timeout=5).json() == {"reward": 1.0}
        deadline = time.monotonic() + 20
        while "episodes" not in receiver.limits() and time.monotonic() < deadline:
            time.sleep(0.1)
        log = server.log
    assert receiver.limits().get("episodes") == 100, log
    assert receiver.limits().get("upstream_requests") == 32
