"""A global limit's flows as its users see them: a real uvicorn process on a real redis-server,
the route's flow read from a header; its status JSON and its Prometheus /metrics name this
process's flows (held weight, waiters) as they do a process limit's, not everything as
"default"."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.shared.redis_server import RedisServer
from tests.uvicorn_process import Uvicorn, clean_env

APP = """
import asyncio

from fastapi import FastAPI
from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import make_asgi_app

from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencyStatusView

metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
app = FastAPI()


@app.post("/run")
async def run(hold: float = 0.05) -> dict[str, bool]:
    await asyncio.sleep(hold)
    return {"ok": True}


@app.get("/health")
async def health() -> dict[str, bool]:
    return {"ok": True}


app.add_route("/concurrency", ConcurrencyStatusView())
app.mount("/metrics", make_asgi_app())
app.add_middleware(ConcurrencyLimitMiddleware)  # settings from GYM_CONCURRENCY_*
"""

ROUTES = [
    {
        "path": "/run",
        "limit_name": "shared_runs",
        "max_concurrent": 3,
        "scope": "global",
        "flow": "header:x-env",
        "queue_timeout_seconds": 30,
    }
]


def flow_points(text: str, metric: str) -> dict[str, float]:
    """The flow instrument's samples of limit shared_runs: flow -> value (scope global)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == metric and labels["nemo_gym_concurrency_limit_name"] == "shared_runs":
                assert labels["nemo_gym_concurrency_scope"] == "global", labels
                found[labels["nemo_gym_concurrency_flow"]] = sample.value
    return found


async def status_row(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    rows = (await client.get(f"{url}/concurrency?format=json")).json()["limits"]
    (row,) = [r for r in rows if r["limit_name"] == "shared_runs"]
    return dict(row)


async def test_a_global_limits_status_and_metrics_show_its_real_flows(
    tmp_path: Path, redis_server: RedisServer, key: str
) -> None:
    (tmp_path / "flows_app.py").write_text(APP)
    env = clean_env(
        GYM_CONCURRENCY_REDIS_URL=redis_server.url,
        GYM_CONCURRENCY_COMPONENT=f"global_{key}",
        GYM_CONCURRENCY_ROUTES=json.dumps(ROUTES),
    )
    server = Uvicorn(tmp_path, "flows_app:app", env, "--timeout-graceful-shutdown", "1")
    try:
        server.wait_serving("/health")
        async with httpx.AsyncClient(timeout=30) as client:

            def post(env: str) -> asyncio.Task[httpx.Response]:
                call = client.post(f"{server.url}/run", params={"hold": 20}, headers={"x-env": env})
                return asyncio.create_task(call)

            calls = [post("math"), post("math"), post("code")]
            deadline = time.monotonic() + 10
            while (await status_row(client, server.url))["active"] < 3:
                assert time.monotonic() < deadline, "the three calls never held the limit"
                await asyncio.sleep(0.05)
            calls.append(post("math"))  # the limit is full: it waits
            while (row := await status_row(client, server.url))["queue_depth"] < 1:
                assert time.monotonic() < deadline, "the fourth call never queued"
                await asyncio.sleep(0.05)
            scrape = (await client.get(f"{server.url}/metrics/")).text
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
    finally:
        server.stop()
    assert row["scope"] == "global"
    assert sorted(row["flows"], key=lambda f: f["flow"]) == [
        {"flow": "code", "held": 1, "queue_depth": 0, "queued_weight": 0},
        {"flow": "math", "held": 2, "queue_depth": 1, "queued_weight": 1},
    ]
    assert row["other_flows"] is None
    assert flow_points(scrape, "gym_concurrency_flow_held") == {"math": 2, "code": 1}
    assert flow_points(scrape, "gym_concurrency_flow_queue_depth") == {"math": 1, "code": 0}
    assert flow_points(scrape, "gym_concurrency_flow_queued_weight") == {"math": 1, "code": 0}
