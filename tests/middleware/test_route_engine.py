"""A route limit that follows an engine signal, on a real uvicorn: with the engine's /metrics
unreachable and `floor: 0` nothing is admitted, and a request whose queue timeout passes is
refused as "saturated" (503, OpenAI code `engine_saturated`), counted and timed under that
outcome; with a running (fake) engine, requests are admitted and the status view and the
engine instruments show its last reading."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    ConcurrencyStatusView,
    RouteLimit,
)

from tests.engines.engine_process import fake_engine
from tests.metrics_capture import MetricsCapture
from tests.registry import limits_of
from tests.servers import UvicornServer, free_port, wait_until

PATH = "/v1/chat/completions"


def serve(component: str, engine: dict[str, Any], metrics: MetricsCapture) -> UvicornServer:
    made = FastAPI()

    @made.post(PATH)
    async def completions() -> dict[str, Any]:
        return {"choices": []}

    made.add_route("/concurrency", ConcurrencyStatusView())
    settings = ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path=PATH,
                limit_name="engine",
                max_concurrent=8,
                failure="openai",
                queue_timeout_seconds=0.3,
                engine=engine,
            )
        ],
    )
    made.add_middleware(
        ConcurrencyLimitMiddleware, settings=settings, meter_provider=metrics.provider
    )
    return UvicornServer(made)


def test_an_engine_that_never_answers_refuses_as_saturated(metrics: MetricsCapture) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens: the signal stays stale
    engine = {"url": url, "waiting_max": 2, "floor": 0, "interval_seconds": 0.05}
    with serve("engine saturated", engine, metrics) as server:
        refused = httpx.post(server.url + PATH, json={})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "engine_saturated"
        assert refused.headers["retry-after"] == "1"
        limit = limits_of("engine saturated")["engine"]
        assert limit.statistics().admission_saturated == 1
        waits = metrics.values("gym.concurrency.queue_wait_duration_ms")
        outcomes = {
            dict(key)["nemo.gym.concurrency.admission_outcome"]
            for key in waits
            if dict(key)["nemo.gym.concurrency.component"] == "engine saturated"
        }
        assert outcomes == {"saturated"}
        row = httpx.get(server.url + "/concurrency?format=json").json()["limits"]
        [shown] = [r for r in row if r["component"] == "engine saturated"]
        assert shown["engine"]["stale"] is True
        assert shown["engine"]["signal_age_seconds"] is None


def test_a_running_engine_admits_and_its_reading_is_exported(metrics: MetricsCapture) -> None:
    with fake_engine("--batch", "8", "--service-ms", "5") as running:
        engine = {"url": running.metrics_url, "waiting_max": 4, "interval_seconds": 0.05}
        with serve("engine running", engine, metrics) as server:
            answers = [httpx.post(server.url + PATH, json={}) for _ in range(5)]
            assert [a.status_code for a in answers] == [200] * 5
            mine = {"nemo.gym.concurrency.component": "engine running"}

            def point(name: str) -> Any:
                found = [
                    value
                    for key, value in metrics.values(name).items()
                    if mine.items() <= dict(key).items()
                ]
                return found[0] if found else None

            wait_until(lambda: point("gym.concurrency.engine.waiting") is not None, what="a scrape")
            assert point("gym.concurrency.engine.waiting") == 0
            assert 0 <= point("gym.concurrency.engine.signal_age_seconds") < 5
            assert point("gym.concurrency.engine.cache_usage") is not None
            [shown] = [
                r
                for r in httpx.get(server.url + "/concurrency?format=json").json()["limits"]
                if r["component"] == "engine running"
            ]
            assert shown["engine"]["stale"] is False
            assert "budgets" not in shown
