"""A process with a global and a process limit: the global route's queue-wait histogram carries
`scope="global"` like its limit's instruments, the process route's carries no scope; and what
Prometheus shows for the process limit (the exporter gives every series of a metric the same
labels, so an absent scope shows as `nemo_gym_concurrency_scope=""`, which PromQL reads as
absent: docs/metrics.md)."""

from __future__ import annotations

import uuid

from fastapi import FastAPI
from fastapi.testclient import TestClient
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    RouteLimit,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from gym_concurrency import names, observe_concurrency
from tests.metrics_capture import MetricsCapture
from tests.shared.redis_server import RedisServer

SCOPE = (names.SCOPE_ATTRIBUTE, names.GLOBAL_SCOPE)


def app_with_both(redis_url: str, component: str, capture: MetricsCapture) -> FastAPI:
    app = FastAPI()

    @app.post("/shared")
    async def shared() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/local")
    async def local() -> dict[str, bool]:
        return {"ok": True}

    settings = ConcurrencySettings(
        component=component,
        redis_url=redis_url,
        routes=[
            RouteLimit(path="/shared", limit_name="shared", max_concurrent=2, scope="global"),
            RouteLimit(path="/local", limit_name="local", max_concurrent=2),
        ],
    )
    app.add_middleware(
        ConcurrencyLimitMiddleware, settings=settings, meter_provider=capture.provider
    )
    return app


def by_limit(points: dict[frozenset[tuple[str, str]], object]) -> dict[str, set[tuple[str, str]]]:
    found: dict[str, set[tuple[str, str]]] = {}
    for attributes in points:
        name = dict(attributes)[names.LIMIT_NAME_ATTRIBUTE]
        found.setdefault(name, set()).update(attributes)
    return found


def test_the_scope_is_on_every_instrument_of_a_global_limit_only(redis_server: RedisServer):
    component = f"attributes-{uuid.uuid4().hex[:8]}"
    capture = MetricsCapture(
        MeterProvider(metric_readers=[reader := InMemoryMetricReader()]), reader
    )
    observe_concurrency(capture.provider)
    app = app_with_both(redis_server.url, component, capture)
    with TestClient(app) as client:  # its lifespan connects the global limit, and closes it
        assert client.post("/shared").status_code == 200
        assert client.post("/local").status_code == 200
    waits = by_limit(capture.values(names.QUEUE_WAIT_INSTRUMENT))
    limits = {
        name: attributes
        for name, attributes in by_limit(capture.values(names.CONCURRENCY_LIMIT_INSTRUMENT)).items()
        if (names.COMPONENT_ATTRIBUTE, component) in attributes
    }
    assert SCOPE in waits["shared"]
    assert SCOPE in limits["shared"]
    assert names.SCOPE_ATTRIBUTE not in dict(waits["local"])
    assert names.SCOPE_ATTRIBUTE not in dict(limits["local"])
