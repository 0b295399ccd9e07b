"""The quickstart's resources server (docs/quickstart.md): every piece of gym-concurrency in
one app. From the checkout: `uvicorn examples.quickstart.app:app --port 8000`."""

import asyncio
from typing import Annotated

import httpx
from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from gym_concurrency.middleware import (
    ClientLimit,
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    ConcurrencyStatusView,
    OperationHandle,
    OperationLimit,
    RouteLimit,
    limited_client,
    operation_limit,
)
from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import make_asgi_app
from pydantic import BaseModel

# 1. Metrics: the OpenTelemetry SDK, which Prometheus reads at /metrics/.
metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))

# 2. The limits.
settings = ConcurrencySettings(
    component="quickstart",
    routes=[
        RouteLimit(  # 2 episodes at a time; a request that waits 3 s is refused with a 503
            path="/run",
            limit_name="episodes",
            max_concurrent=2,
            queue_timeout_seconds=3,
            failure="problem",
            flow="header:x-tenant",  # tenants take turns, whoever queued first
            deadline="header:x-deadline-ms",  # how long the caller will wait, in ms
        ),
        RouteLimit(  # a proxy to the model, limited in tokens in flight
            path="/v1/chat/completions",
            limit_name="model_tokens",
            max_concurrent=4096,
            queue_timeout_seconds=10,
            failure="openai",
            weight="openai_tokens",  # the prompt's characters / 4 + max_tokens
            flow="header:x-tenant",
        ),
    ],
    operations=[  # one judge at a time, timed by how long it queued and ran
        OperationLimit(limit_name="judge", operation="judge", executor="inline", max_concurrent=1)
    ],
    clients=[ClientLimit(limit_name="model", max_concurrent=4)],  # calls to the model
)

# 3. A fake model that takes 2 s and always answers 42, served in this process.
fake_model = FastAPI()


@fake_model.post("/v1/chat/completions")
async def complete() -> dict:
    await asyncio.sleep(2)
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}}]}


# 4. The resources server.
app = FastAPI()
app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
app.add_route("/concurrency", ConcurrencyStatusView(), include_in_schema=False)
app.mount("/metrics", make_asgi_app())
Judge = Annotated[OperationHandle, Depends(operation_limit("judge"))]


async def model_client(request: Request) -> httpx.AsyncClient:
    """One client for the process, every call through the "model" client limit (a real
    model: its URL as base_url, and transport() with no argument)."""
    if not hasattr(request.app.state, "model"):
        transport = limited_client(request.app, "model").transport(httpx.ASGITransport(fake_model))
        request.app.state.model = httpx.AsyncClient(base_url="http://model", transport=transport)
    return request.app.state.model


Model = Annotated[httpx.AsyncClient, Depends(model_client)]


class Episode(BaseModel):
    question: str
    expected: str


@app.post("/run")
async def run(episode: Episode, request: Request, model: Model, judge: Judge) -> Response:
    ask = {"messages": [{"role": "user", "content": episode.question}], "max_tokens": 16}
    try:  # the call gives up when the request's deadline does
        reply = await model.post("/v1/chat/completions", json=ask)
    except httpx.TimeoutException:
        return JSONResponse({"detail": "no answer from the model within the deadline"}, 504)
    answer = reply.json()["choices"][0]["message"]["content"]
    async with judge:  # waits for the judge's one slot
        reward = 1.0 if answer == episode.expected else 0.0
    tenant = request.headers.get("x-tenant")
    return JSONResponse({"tenant": tenant, "answer": answer, "reward": reward})


@app.post("/v1/chat/completions")
async def chat_completions(request: Request, model: Model) -> Response:
    body = await request.body()
    reply = await model.post("/v1/chat/completions", content=body)
    return Response(reply.content, reply.status_code, media_type="application/json")
