"""A real NeMo Gym 0.7.0 environment server with our middleware, built and served the way
NeMo Gym serves it, and NeMo Gym's rollout collector pointed at it. Python >= 3.13 only.

`build_app` does what `nemo_gym.server_utils.SimpleServer.run_webserver` does between building
the server and `uvicorn.run`: `setup_webserver()` (where our middleware goes), `setup_liveness`,
`setup_exception_middleware` (an `@app.middleware("http")`, i.e. a BaseHTTPMiddleware),
`setup_cancellation_middleware` (`ClientDisconnectCancellationMiddleware`, outermost),
`instrument_app_for_telemetry` and the validation exception handler. It leaves out what touches
the whole process (`set_ulimit`, `prefix_server_logs`, Ray, telemetry set-up). `serve` runs
uvicorn with NeMo Gym's own HTTP protocol class (`KeepaliveHttpToolsProtocol`, httptools with
TCP keepalive) on 127.0.0.1, lifespan and loop left to uvicorn's defaults as run_webserver does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings
from nemo_gym.base_environment_server import (
    BaseEnvironmentServer,
    BaseEnvironmentServerConfig,
    CleanupContext,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest, BaseServerConfig
from nemo_gym.episode_types import BaseEpisodeRequest, BaseEpisodeResponse
from nemo_gym.global_config import (
    ATTEMPT_INDEX_KEY_NAME,
    ENVIRONMENT_SERVER_STAMP_KEY_NAME,
    ROLLOUT_INDEX_KEY_NAME,
    TASK_INDEX_KEY_NAME,
)
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.server_utils import (
    GlobalAIOHTTPAsyncClientConfig,
    KeepaliveHttpToolsProtocol,
    ServerClient,
    _validation_exception_handler,
)
from omegaconf import OmegaConf
from pydantic import BaseModel, Field, PrivateAttr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.servers import UvicornServer, free_port

SERVER_NAME = "echo_env"
TASKSET = "echo:train"


class EchoTask(BaseModel):
    prompt: str
    run_seconds: float = 0.0  # how long the episode runs


class EchoResult(BaseModel):
    reward: float
    response: str


class EchoRequest(BaseEpisodeRequest[EchoTask]):
    pass


class EchoResponse(BaseEpisodeResponse[EchoResult]):
    pass


class EchoEnvironmentServer(BaseEnvironmentServer[EchoRequest, EchoResponse]):
    """Echoes the prompt after `run_seconds`; the /run limit is ours, not NeMo Gym's
    (`max_concurrent_episodes` stays unset, so its own asyncio.Semaphore is off)."""

    config: BaseEnvironmentServerConfig
    request_model = EchoRequest
    response_model = EchoResponse
    concurrency: ConcurrencySettings
    episodes_run: list[Any] = Field(default_factory=list)  # episode ids, as run() started

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.add_middleware(ConcurrencyLimitMiddleware, settings=self.concurrency)
        return app

    async def run(self, request: EchoRequest, cleanup: CleanupContext) -> EchoResponse:
        self.episodes_run.append(request.episode_id.model_dump())
        if request.task.task_input.run_seconds:
            await asyncio.sleep(request.task.task_input.run_seconds)
        return EchoResponse(
            episode_id=request.episode_id,
            task_id=request.task.task_id,
            result=EchoResult(reward=1.0, response=request.task.task_input.prompt),
        )

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return AggregateMetrics()


def server_client(port: int = 0) -> ServerClient:
    """A ServerClient whose global config names our environment server on `port`."""
    config = {
        SERVER_NAME: {
            "environment_servers": {
                SERVER_NAME: {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "port": port,
                    "cleanup_timeout_seconds": 5,
                }
            }
        }
    }
    return ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
        global_config_dict=OmegaConf.create(config),
    )


def echo_server(concurrency: ConcurrencySettings) -> EchoEnvironmentServer:
    config = BaseEnvironmentServerConfig(
        host="127.0.0.1",
        port=0,
        entrypoint="app.py",
        name=SERVER_NAME,
        cleanup_timeout_seconds=5,
    )
    return EchoEnvironmentServer(
        config=config, server_client=server_client(), concurrency=concurrency
    )


def build_app(server: Any) -> FastAPI:
    """The app `SimpleServer.run_webserver` builds for `server` (minus process-wide set-up)."""
    app: FastAPI = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    # "Register last so cancellation wraps the complete request stack." (run_webserver)
    server.setup_cancellation_middleware(app)
    server.instrument_app_for_telemetry(app)  # a no-op unless NeMo Gym telemetry exports
    app.exception_handler(RequestValidationError)(_validation_exception_handler)
    return app


class RequestLedger:
    """Outermost pure-ASGI wrapper (outside Starlette's ServerErrorMiddleware too): counts the
    /run requests the server received and the responses it started, without touching
    `receive`, so it cannot change the race it watches."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests = 0
        self.responses = 0
        self.statuses: dict[int, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/run":
            await self.app(scope, receive, send)
            return
        self.requests += 1

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.responses += 1
                self.statuses[message["status"]] = self.statuses.get(message["status"], 0) + 1
            await send(message)

        await self.app(scope, receive, counting_send)


def _protocol() -> Any:
    """NeMo Gym's HTTP protocol class for uvicorn, with run_webserver's keepalive."""
    keepalive = GlobalAIOHTTPAsyncClientConfig()
    return partial(
        KeepaliveHttpToolsProtocol,
        keepalive=(
            keepalive.global_aiohttp_tcp_keepalive_idle_seconds,
            keepalive.global_aiohttp_tcp_keepalive_interval_seconds,
            keepalive.global_aiohttp_tcp_keepalive_probes,
        ),
    )


@contextlib.contextmanager
def serve(app: ASGIApp) -> Iterator[UvicornServer]:
    """uvicorn on 127.0.0.1 with NeMo Gym's httptools protocol, as run_webserver runs it."""
    with UvicornServer(app, lifespan="auto", http=_protocol(), timeout_keep_alive=30) as server:
        yield server


@contextlib.asynccontextmanager
async def serve_on_this_loop(app: ASGIApp) -> AsyncIterator[int]:
    """`serve` on the test's own event loop: for a server whose handlers use NeMo Gym's global
    aiohttp client (ServerClient), which works on the loop it was made on only. Its port."""
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        lifespan="auto",
        http=_protocol(),
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
        log_config=None,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                if serving.done():
                    serving.result()  # its error, if it failed to start
                    raise RuntimeError("uvicorn did not start (see the log)")
                await asyncio.sleep(0.005)
        yield port
    finally:
        server.should_exit = True
        await serving


def episode_row(task: int, rollout: int = 0, prompt: str = "", **task_input: Any) -> dict[str, Any]:
    """A materialized task row as NeMo Gym's collector dispatches it to an environment server
    (`_episode_request_body(row)` makes the /run body from it)."""
    return {
        "task_id": {"taskset": TASKSET, "task_id": str(task)},
        "task_input": {"prompt": prompt or f"prompt {task}", **task_input},
        TASK_INDEX_KEY_NAME: task,
        ROLLOUT_INDEX_KEY_NAME: rollout,
        ATTEMPT_INDEX_KEY_NAME: 0,
        ENVIRONMENT_SERVER_STAMP_KEY_NAME: SERVER_NAME,
    }


class Collector(RolloutCollectionHelper):
    """NeMo Gym's rollout collector, dispatching to our server instead of a head server's."""

    _client: ServerClient | None = PrivateAttr(default=None)

    def setup_server_client(self, head_server_config: Any = None) -> ServerClient:
        assert self._client is not None, "point_at(port) first"
        return self._client

    def point_at(self, port: int) -> Collector:
        self._client = server_client(port)
        return self

    async def collect(
        self, rows: list[dict[str, Any]], *, within: float, **options: Any
    ) -> list[tuple[dict[str, Any], Any]]:
        """Dispatch `rows` as `RolloutCollectionHelper.run_examples` does (every row's /run
        request in flight at once): the (row, result) pairs in completion order. TimeoutError
        after `within` s, with every request still in flight cancelled."""
        iterator = iter(self.run_examples(rows, **options))
        before = asyncio.all_tasks()
        first = next(iterator)  # the first step starts every row's task
        tasks = asyncio.all_tasks() - before
        results = []
        try:
            async with asyncio.timeout(within):
                for future in itertools.chain([first], iterator):
                    results.append(await future)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # retrieves every exception
        return results
