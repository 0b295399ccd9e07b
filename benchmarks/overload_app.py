"""The app and the limiter configurations that benchmarks/overload.py and
benchmarks/queued_inprocess.py measure.

A FastAPI app with one limited route, `POST /run`: it parses a small JSON episode request
with pydantic, sleeps 10 ms (`await asyncio.sleep(0.01)`) and answers an episode response
whose `failure` is null. `GET /healthz` is never limited. Every configuration limits
`POST /run` to `MAX_CONCURRENT` (64) at a time, or not at all.

gym_concurrency is imported only inside the functions, so a caller can first point the
imports at another source tree (benchmarks/_source.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any, Literal

from fastapi import Depends, FastAPI
from pydantic import BaseModel

__all__ = [
    "CONFIGS",
    "HANDLER_SECONDS",
    "MAX_CONCURRENT",
    "Config",
    "close_setting",
    "depends_has_max_concurrency",
    "make_app",
    "make_sdk_provider",
    "request_body",
]

HANDLER_SECONDS = 0.01
MAX_CONCURRENT = 64
# Whichever of these the installed middleware has turns on "Connection: close" on refusals.
CLOSE_SETTING = "close_connection_on_refusal"

Limiter = Literal["none", "middleware", "depends", "uvicorn"]


@dataclass(frozen=True)
class Config:
    """One way of limiting POST /run (or none)."""

    name: str
    limiter: Limiter
    label: str
    max_queue: int | None = None
    queue_timeout_seconds: float | None = None
    failure: Literal["problem", "episode"] = "problem"
    close_on_refusal: bool | None = None  # None: the middleware's default

    @property
    def refuses(self) -> bool:
        """Whether this configuration can answer a request without running the handler."""
        if self.limiter == "uvicorn":
            return True
        if self.limiter != "middleware":
            return False
        return self.max_queue is not None or self.queue_timeout_seconds is not None


def _middleware_configs() -> list[Config]:
    refusing = []
    for failure in ("problem", "episode"):
        refusing.append(
            Config(
                f"q256-{failure}",
                "middleware",
                f"queue 256 / 0.5 s, {failure}",
                max_queue=256,
                queue_timeout_seconds=0.5,
                failure=failure,  # type: ignore[arg-type]
            )
        )
        refusing.append(
            Config(
                f"q0-{failure}",
                "middleware",
                f"max_queue=0, {failure}",
                max_queue=0,
                failure=failure,  # type: ignore[arg-type]
            )
        )
    closing = [
        replace(
            c, name=f"{c.name}-close", label=f"{c.label}, Connection: close", close_on_refusal=True
        )
        for c in refusing
    ]
    keeping = [
        replace(
            c, name=f"{c.name}-keepalive", label=f"{c.label}, keep-alive", close_on_refusal=False
        )
        for c in refusing
    ]
    return [
        Config(
            "queue-deep",
            "middleware",
            "queue for every client (no refusal)",
            max_queue=None,
            queue_timeout_seconds=600.0,
        ),
        *sorted(refusing, key=lambda c: c.name),
        *sorted(closing, key=lambda c: c.name),
        *sorted(keeping, key=lambda c: c.name),
    ]


CONFIGS: dict[str, Config] = {
    config.name: config
    for config in [
        Config("none", "none", "no limiter"),
        *_middleware_configs(),
        Config("depends", "depends", "FastAPI Depends(max_concurrency=64)"),
        Config("uvicorn", "uvicorn", "uvicorn --limit-concurrency 64"),
    ]
}


class Task(BaseModel):
    task_id: str
    prompt: str = ""


class EpisodeRequest(BaseModel):
    episode_id: str
    task: Task


def request_body(episode_id: str) -> bytes:
    """The JSON body every benchmark request carries."""
    return (
        b'{"episode_id":"' + episode_id.encode() + b'","task":{"task_id":"t1",'
        b'"prompt":"The answer is 42"}}'
    )


def depends_has_max_concurrency() -> bool:
    """Whether the installed FastAPI's Depends() takes max_concurrency."""
    try:
        Depends(lambda: None, max_concurrency=1)  # type: ignore[call-arg]
    except TypeError:
        return False
    return True


def close_setting() -> str | None:
    """Where the installed middleware takes `close_connection_on_refusal`: "settings" (on
    ConcurrencySettings), "route" (on RouteLimit), or None if it has no such setting."""
    from gym_concurrency.middleware import ConcurrencySettings, RouteLimit

    if CLOSE_SETTING in ConcurrencySettings.model_fields:
        return "settings"
    if CLOSE_SETTING in RouteLimit.model_fields:
        return "route"
    return None


def make_sdk_provider(export_interval_ms: int = 1000) -> Any:
    """An SDK MeterProvider exporting every `export_interval_ms` to an exporter that drops
    the data (the collection, aggregation and export calls all happen; nothing is sent)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricExportResult,
        PeriodicExportingMetricReader,
    )

    class NullExporter(MetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **_: Any) -> Any:
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
            return None

    reader = PeriodicExportingMetricReader(
        NullExporter(), export_interval_millis=export_interval_ms
    )
    return MeterProvider(metric_readers=[reader])


def _settings(config: Config) -> Any:
    from gym_concurrency.middleware import ConcurrencySettings, RouteLimit

    route: dict[str, Any] = {
        "path": "/run",
        "methods": ("POST",),
        "limit_name": "episodes",
        "max_concurrent": MAX_CONCURRENT,
        "queue_timeout_seconds": config.queue_timeout_seconds,
        "max_queue": config.max_queue,
        "failure": config.failure,
    }
    settings: dict[str, Any] = {"component": "benchmark"}
    if config.close_on_refusal is not None:
        where = close_setting()
        if where is None:
            raise RuntimeError(f"{config.name}: the middleware has no {CLOSE_SETTING} setting")
        (settings if where == "settings" else route)[CLOSE_SETTING] = config.close_on_refusal
    return ConcurrencySettings(**settings, routes=[RouteLimit(**route)])


def make_app(
    config: Config, meter_provider: Any = None, handler_seconds: float = HANDLER_SECONDS
) -> FastAPI:
    """The benchmark app limited as `config` says (uvicorn's limit is set on the server, so
    that configuration's app is the bare one). `meter_provider` goes to the middleware."""
    app = FastAPI()

    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    async def run(request: EpisodeRequest) -> Any:
        await asyncio.sleep(handler_seconds)
        return {
            "episode_id": request.episode_id,
            "task_id": request.task.task_id,
            "result": {"reward": 1.0, "response": "The answer is 42"},
            "failure": None,
        }

    app.add_api_route("/healthz", healthz, methods=["GET"])
    if config.limiter == "depends":
        if not depends_has_max_concurrency():
            raise RuntimeError("the installed FastAPI has no Depends(max_concurrency=...)")

        async def slot() -> Any:  # held from before the handler until after it
            yield

        limited = Depends(slot, max_concurrency=MAX_CONCURRENT)  # type: ignore[call-arg]
        app.add_api_route(
            "/run", run, methods=["POST"], dependencies=[limited], response_model=None
        )
    else:
        app.add_api_route("/run", run, methods=["POST"], response_model=None)
    if config.limiter == "middleware":
        from gym_concurrency.middleware import ConcurrencyLimitMiddleware

        app.add_middleware(
            ConcurrencyLimitMiddleware, settings=_settings(config), meter_provider=meter_provider
        )
    return app
