"""Apps with our middleware inside the outer middlewares users stack around it, and an ASGI
connection whose body arrives exactly when a test says, to reproduce the body race in process.

The race (issue 9): one slot, held; a request B waits for it while reading its client. The slot
is released and B's whole body reaches the server in the same few event-loop steps. Behind an
outer BaseHTTPMiddleware, a receive in flight that is cancelled at admission (or at a refusal)
drops the message Starlette had already taken from the server: B's handler then waits in
`await request.body()` holding the slot, or its refusal is never sent.

Nothing here imports NeMo Gym: these run on every Python. tests/nemo_gym/environment.py adds
NeMo Gym's own stack on 3.13.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Message, Scope

from gym_concurrency import MeteredSemaphore
from tests.registry import limits_of

__all__ = [
    "OUTER_MIDDLEWARES",
    "Connection",
    "Gate",
    "episode_settings",
    "limited_app",
    "slot_of",
    "steps",
    "unique_component",
    "until",
    "warm_up",
]

LIMIT_NAME = "episodes"


def unique_component(name: str) -> str:
    """A component name no other test uses, so the limits found under it are this test's."""
    return re.sub(r"\W", "_", name)[:50] + "_" + uuid.uuid4().hex[:6]


def episode_settings(
    component: str,
    *,
    max_concurrent: int = 1,
    queue_timeout_seconds: float | None = None,
    max_queue: int | None = None,
) -> ConcurrencySettings:
    """/run limited under `episodes` with the episode failure profile."""
    return ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path="/run",
                limit_name=LIMIT_NAME,
                max_concurrent=max_concurrent,
                queue_timeout_seconds=queue_timeout_seconds,
                max_queue=max_queue,
                failure="episode",
            )
        ],
    )


def slot_of(component: str) -> MeteredSemaphore:
    """The /run limit the middleware of `component` made."""
    return limits_of(component)[LIMIT_NAME]


async def steps(n: int) -> None:
    """Let the event loop run `n` steps."""
    for _ in range(n):
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run, one step at a time, until `condition()` (checked between steps)."""
    while not condition():  # noqa: ASYNC110 - a step-exact poll is the point
        await asyncio.sleep(0)


class Gate:
    """Holds /run handlers until opened (from any thread: polled, not an asyncio.Event)."""

    def __init__(self) -> None:
        self.open = True
        self.inside = 0
        self.bodies: list[bytes] = []

    async def wait(self) -> None:
        while not self.open:  # noqa: ASYNC110 - the gate is opened from other threads/loops
            await asyncio.sleep(0.001)


# --- Outer middlewares: each adds itself around whatever the app already has. ----------------


def _base_http(app: FastAPI) -> None:
    @app.middleware("http")
    async def passthrough(request: Request, call_next: Any) -> Any:
        return await call_next(request)


def _gzip(app: FastAPI) -> None:
    app.add_middleware(GZipMiddleware, minimum_size=1)


def _session(app: FastAPI) -> None:
    from starlette.middleware.sessions import SessionMiddleware  # needs itsdangerous

    app.add_middleware(SessionMiddleware, secret_key="test-secret")


def _cors(app: FastAPI) -> None:
    app.add_middleware(
        CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"]
    )


def _nemo_gym_cancellation(app: FastAPI) -> None:
    from nemo_gym.server_utils import ClientDisconnectCancellationMiddleware

    app.add_middleware(ClientDisconnectCancellationMiddleware)


# FastAPI's own layers are switched on by constructor arguments, not added (see limited_app).
OUTER_MIDDLEWARES: dict[str, Callable[[FastAPI], None] | None] = {
    "none": None,
    "base_http_middleware": _base_http,
    "gzip": _gzip,
    "session": _session,
    "cors": _cors,
    "fastapi_native_telemetry": None,
    "fastapi_max_body_size": None,
    "nemo_gym_cancellation": _nemo_gym_cancellation,
    "all_of_them": None,
}
NEEDS_NEMO_GYM = frozenset({"nemo_gym_cancellation", "all_of_them"})


def _fastapi(outer: str) -> FastAPI:
    if outer in ("fastapi_native_telemetry", "all_of_them"):
        # FastAPI >= 0.165 wraps the app in its native OpenTelemetry layer once a provider is
        # given (outside every user middleware): traces and request metrics.
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        app = FastAPI(
            telemetry={"tracer_provider": tracer_provider, "meter_provider": MeterProvider()}
        )
        app.state.spans = spans  # the test checks the layer really ran
        return app
    if outer == "fastapi_max_body_size":
        # FastAPI >= 0.165's request body limit wraps receive outside every user middleware.
        return FastAPI(max_body_size=1024 * 1024)
    return FastAPI()


def _hold_seconds(body: bytes) -> float:
    """A request may ask to be held: {"task": {"hold": seconds}}."""
    try:
        hold = json.loads(body)["task"]["hold"]
    except (ValueError, KeyError, TypeError):
        return 0.0
    return float(hold) if isinstance(hold, int | float) else 0.0


def limited_app(settings: ConcurrencySettings, outer: str = "none") -> tuple[FastAPI, Gate]:
    """A FastAPI app whose POST /run echoes its body (held while the gate is shut, and for the
    body's task.hold seconds), with our middleware added first (innermost) and `outer` added
    around it."""
    gate = Gate()
    app = _fastapi(outer)

    @app.post("/run")
    async def run(request: Request) -> dict[str, Any]:
        body = await request.body()
        gate.bodies.append(body)
        gate.inside += 1
        try:
            await gate.wait()
            await asyncio.sleep(_hold_seconds(body))
        finally:
            gate.inside -= 1
        return {"result": {"body": body.decode(errors="replace")}}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    if outer == "all_of_them":
        for add in (_base_http, _gzip, _session, _cors, _nemo_gym_cancellation):
            add(app)
    else:
        add = OUTER_MIDDLEWARES[outer]
        if add is not None:
            add(app)
    return app, gate


# --- One request over ASGI, its body delivered when the test says. -------------------------


class Connection:
    """One HTTP request as an ASGI server delivers it, with the body held back until
    `deliver_body()`. Like uvicorn's, `receive()` is cancel-safe: the body stays in the
    connection until a receive returns it; once the response is complete, or after
    `disconnect()`, it returns `http.disconnect`."""

    def __init__(self, body: bytes, path: str = "/run") -> None:
        self.body = body
        self.scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"host", b"testserver"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }
        self.sent: list[Message] = []
        self.complete = asyncio.Event()
        self.receiving = 0  # receives in flight
        self._wake = asyncio.Event()
        self._body_ready = False
        self._body_taken = False
        self._gone = False

    def deliver_body(self) -> None:
        self._body_ready = True
        self._wake.set()

    def disconnect(self) -> None:
        self._gone = True
        self._wake.set()

    async def receive(self) -> Message:
        self.receiving += 1
        try:
            while True:
                if self._body_ready and not self._body_taken and not self._gone:
                    self._body_taken = True
                    return {"type": "http.request", "body": self.body, "more_body": False}
                if self._gone or self.complete.is_set():
                    return {"type": "http.disconnect"}
                self._wake.clear()
                await self._wake.wait()
        finally:
            self.receiving -= 1

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete.set()
            self._wake.set()

    def run(self, app: ASGIApp) -> asyncio.Task[None]:
        return asyncio.create_task(app(self.scope, self.receive, self.send))

    @property
    def status(self) -> int | None:
        for message in self.sent:
            if message["type"] == "http.response.start":
                return int(message["status"])
        return None

    @property
    def response_body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def json(self) -> Any:
        return json.loads(self.response_body)


async def warm_up(app: ASGIApp, body: bytes = b"{}") -> None:
    """One request with the slot free, so the middleware has built its route table."""
    connection = Connection(body)
    connection.deliver_body()
    task = connection.run(app)
    await asyncio.wait_for(connection.complete.wait(), 5)
    connection.disconnect()
    await task
    assert connection.status == 200, connection.sent
