"""The demo resources server: episodes, an OpenAI-compatible proxy, a verifier and a judge,
each behind a visible, bounded concurrency limit.

    uvicorn examples.fastapi_app.app:app --port 8000     (the fake model on port 8001)

Limits: settings.yaml next to this file (GYM_CONCURRENCY_* overrides). Telemetry: OTEL_*
(telemetry.py). Upstream model and timeouts: DEMO_* (config.py). Live limits: /concurrency.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import Response
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencyStatusView
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .config import DemoConfig, load_concurrency_settings
from .metrics_ports import parse_port_range, serve_on_a_free_port
from .routes import router
from .telemetry import Telemetry, configure_telemetry
from .upstream import make_client


def create_app(config: DemoConfig | None = None, telemetry: Telemetry | None = None) -> FastAPI:
    """The demo app: limits from the settings file, telemetry from OTEL_*, upstream from DEMO_*."""
    config = config or DemoConfig()
    settings = load_concurrency_settings(config.settings_file)
    telemetry = telemetry or configure_telemetry()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with make_client(config) as client:
            app.state.upstream = client
            yield
        telemetry.shutdown()  # flushes the last OTLP points

    app = FastAPI(
        title="gym-concurrency demo resources server",
        lifespan=lifespan,
        telemetry={
            "meter_provider": telemetry.meter_provider,
            "tracer_provider": telemetry.tracer_provider,
            "tracing": telemetry.tracer_provider is not None,
            "logs": False,
            # Exporters come from telemetry.py alone, so none is added twice.
            "auto_configure": False,
        },
    )
    app.state.config = config
    app.include_router(router)
    status_view = ConcurrencyStatusView(refresh_seconds=config.status_refresh_seconds)
    app.add_route("/concurrency", status_view, include_in_schema=False)
    registry = telemetry.prometheus_registry
    if registry is not None and config.metrics_ports:
        # Several workers share the app's port: each serves its own metrics port instead.
        serve_on_a_free_port(registry, parse_port_range(config.metrics_ports), config.metrics_host)
    elif registry is not None:
        app.add_api_route(
            "/metrics", _metrics_endpoint(registry), methods=["GET"], include_in_schema=False
        )
    app.add_middleware(
        ConcurrencyLimitMiddleware, settings=settings, meter_provider=telemetry.meter_provider
    )
    return app


def _metrics_endpoint(registry: CollectorRegistry) -> Callable[[], Response]:
    def metrics() -> Response:  # a sync def: collection runs in a worker thread
        """The Prometheus text exposition of every instrument on the app's MeterProvider."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


app = create_app()
