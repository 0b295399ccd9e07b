"""A small FastAPI resources server for the middleware tests, with gates to hold requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, StreamingResponse
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings
from starlette.background import BackgroundTask


class Gate:
    """Holds requests until opened; counts the calls that reached the app, per path."""

    def __init__(self) -> None:
        self.open = False
        self.calls: dict[str, int] = {}
        self.inside = 0

    async def wait(self) -> None:
        # Polling works from any thread and any event loop (tests also run uvicorn threads).
        while not self.open:  # noqa: ASYNC110 - an asyncio.Event is bound to one loop
            await asyncio.sleep(0.002)


def make_app(settings: ConcurrencySettings, *, meter_provider: Any = None) -> tuple[FastAPI, Gate]:
    """An app with held, streaming, background, failing, templated, routed and mounted routes."""
    gate = Gate()
    app = FastAPI()

    async def held(request: Request) -> dict[str, Any]:
        gate.calls[request.url.path] = gate.calls.get(request.url.path, 0) + 1
        body = await request.body()
        gate.inside += 1
        try:
            await gate.wait()
        finally:
            gate.inside -= 1
        return {"path": request.url.path, "body": body.decode(errors="replace")}

    app.add_api_route("/run", held, methods=["POST"])
    app.add_api_route("/run", held, methods=["GET"], name="run_get")
    app.add_api_route("/other", held, methods=["POST"])
    app.add_api_route("/episodes/{episode_id}", held, methods=["POST"])
    app.add_api_route("/v1/chat/completions", held, methods=["POST"])

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first\n"
            gate.inside += 1
            await gate.wait()
            gate.inside -= 1
            yield b"last\n"

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/background")
    async def background() -> JSONResponse:
        async def after() -> None:
            gate.inside += 1
            await gate.wait()
            gate.inside -= 1

        return JSONResponse({"sent": True}, background=BackgroundTask(after))

    @app.post("/fail")
    async def fail() -> None:
        raise RuntimeError("the app failed")

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        gate.calls["/ws"] = gate.calls.get("/ws", 0) + 1
        await websocket.accept()
        await websocket.send_text("admitted")
        await websocket.send_text("echo " + await websocket.receive_text())
        await websocket.close()

    router = APIRouter(prefix="/v2")
    router.add_api_route("/run", held, methods=["POST"])
    app.include_router(router, prefix="/api")

    sub = FastAPI()
    sub.add_api_route("/work", held, methods=["POST"])
    app.mount("/sub", sub)

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings, meter_provider=meter_provider)
    return app, gate
