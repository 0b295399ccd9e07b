"""A refusal met inside an environment server's run() ends as NeMo Gym's non-terminal failure,
never a terminal one, with `refusals_as_episode_failures` (gym_concurrency.middleware.nemo_gym).

A real BaseEnvironmentServer (served as `run_webserver` serves it) calls an inner server, on
uvicorn, whose routes are limited with every failure profile, through NeMo Gym's own
`ServerClient.post` and `raise_for_status`; NeMo Gym's rollout collector dispatches the episodes
and reads the replies with `_episode_record` and `is_terminal_failure`, as `--resume` does.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.nemo_gym.requires import skip_module_without_nemo_gym

skip_module_without_nemo_gym()

from typing import get_args  # noqa: E402

from fastapi import FastAPI  # noqa: E402
from gym_concurrency.middleware import (  # noqa: E402
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    RouteLimit,
)
from gym_concurrency.middleware.nemo_gym import (  # noqa: E402
    EpisodeStage,
    raise_for_episode_refusal,
    refusals_as_episode_failures,
)
from nemo_gym.base_environment_server import (  # noqa: E402
    BaseEnvironmentServer,
    BaseEnvironmentServerConfig,
    CleanupContext,
)
from nemo_gym.config_types import (  # noqa: E402
    AggregateMetrics,
    AggregateMetricsRequest,
    BaseServerConfig,
)
from nemo_gym.episode_types import BaseEpisodeRequest, BaseEpisodeResponse  # noqa: E402
from nemo_gym.failure_kinds import FailureStage  # noqa: E402
from nemo_gym.rollout_collection import (  # noqa: E402
    _episode_record,
    _is_episode_response,
    is_terminal_failure,
)
from nemo_gym.server_utils import ServerClient, get_response_json, raise_for_status  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from pydantic import BaseModel, ConfigDict  # noqa: E402

from gym_concurrency import MeteredSemaphore  # noqa: E402
from tests.nemo_gym.environment import (  # noqa: E402
    SERVER_NAME,
    Collector,
    build_app,
    episode_row,
    serve,
    serve_on_this_loop,
)
from tests.registry import limits_of  # noqa: E402
from tests.servers import eventually  # noqa: E402

pytestmark = pytest.mark.usefixtures("nemo_gym_http_client")

INNER = "inner"


class CallTask(BaseModel):
    path: str  # the inner route run() calls
    stage: EpisodeStage = "agent"
    helper: bool = True  # inside refusals_as_episode_failures


class CallResult(BaseModel):
    reward: float


class CallRequest(BaseEpisodeRequest[CallTask]):
    pass


class CallResponse(BaseEpisodeResponse[CallResult]):
    pass


class CallingEnvironmentServer(BaseEnvironmentServer[CallRequest, CallResponse]):
    """run() posts to the inner server's `task.path` with NeMo Gym's ServerClient, inside the
    helper unless the task says not to; a local limit of one slot guards `/local`."""

    ray_enabled = False
    config: BaseEnvironmentServerConfig
    request_model = CallRequest
    response_model = CallResponse
    local: MeteredSemaphore

    model_config = ConfigDict(arbitrary_types_allowed=True)

    async def run(self, request: CallRequest, cleanup: CleanupContext) -> CallResponse:
        task = request.task.task_input
        if not task.helper:
            await self.call(task.path)
        else:
            with refusals_as_episode_failures(task.stage):
                await self.call(task.path)
        return CallResponse(
            episode_id=request.episode_id,
            task_id=request.task.task_id,
            result=CallResult(reward=1.0),
        )

    async def call(self, path: str) -> None:
        if path == "/local":
            async with self.local:
                return
        reply = await self.server_client.post(server_name=INNER, url_path=path, json=episode_body())
        await raise_for_status(reply)
        raise_for_episode_refusal(await get_response_json(reply))

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return AggregateMetrics()


def episode_body() -> dict[str, Any]:
    return {
        "episode_id": {"rollout_id": "inner-1", "attempt": 0},
        "task": {"task_id": {"taskset": "inner", "task_id": "1"}, "task_input": {}},
    }


def inner_app(component: str) -> FastAPI:
    """Every failure profile on a route of one slot: openai and episode refuse a full queue at
    once, problem times out the wait; /broken is a bug (500)."""
    app = FastAPI()

    async def answer() -> dict[str, Any]:
        return {**episode_body(), "task_id": episode_body()["task"]["task_id"], "result": {}}

    for path in ("/v1/responses", "/verify", "/run"):
        app.add_api_route(path, answer, methods=["POST"])

    @app.post("/broken")
    async def broken() -> None:
        raise RuntimeError("a bug in the inner server")

    routes = [
        RouteLimit(
            path="/v1/responses",
            limit_name="generation",
            max_concurrent=1,
            max_queue=0,
            failure="openai",
        ),
        RouteLimit(
            path="/verify",
            limit_name="verification",
            max_concurrent=1,
            queue_timeout_seconds=0.01,
            failure="problem",
        ),
        RouteLimit(
            path="/run", limit_name="episodes", max_concurrent=1, max_queue=0, failure="episode"
        ),
    ]
    app.add_middleware(
        ConcurrencyLimitMiddleware, settings=ConcurrencySettings(component=component, routes=routes)
    )
    return app


def environment(inner_port: int) -> CallingEnvironmentServer:
    config = BaseEnvironmentServerConfig(
        host="127.0.0.1", port=0, entrypoint="app.py", name=SERVER_NAME, cleanup_timeout_seconds=5
    )
    global_config = {
        INNER: {"resources_servers": {INNER: {"host": "127.0.0.1", "port": inner_port}}},
    }
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
        global_config_dict=OmegaConf.create(global_config),
    )
    local = MeteredSemaphore(1, timeout=0.01)
    return CallingEnvironmentServer(config=config, server_client=client, local=local)


def row(task: int, path: str, **task_input: Any) -> dict[str, Any]:
    return episode_row(task=task, path=path, **task_input)


async def held(component: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's reply, collected by NeMo Gym's collector with every inner slot held."""
    with serve(inner_app(component)) as inner:
        server = environment(inner.port)
        async with serve_on_this_loop(build_app(server)) as port:
            collector = Collector().point_at(port)
            warm = [row(100, "/v1/responses"), row(101, "/verify"), row(102, "/run")]
            for _, reply in await collector.collect(warm, within=10):  # every slot free
                assert reply["result"] == {"reward": 1.0}, reply
            inner_limits = limits_of(component)
            held_limits = [*inner_limits.values(), server.local]
            for limit in held_limits:
                await take_when_idle(limit)
            try:
                results = await collector.collect(rows, within=10)
            finally:
                for limit in held_limits:
                    limit.release()
    replies = {r["task_id"]["task_id"]: reply for r, reply in results}
    return [replies[r["task_id"]["task_id"]] for r in rows]


async def take_when_idle(limit: MeteredSemaphore) -> None:
    """Take `limit`'s slot once no request holds it: a server gives a slot back just after
    its answer reached the client, so the warm-up's may still be held (and with max_queue=0
    an acquire would be refused). The inner limits belong to the server's thread; once idle,
    nothing there touches them until the rows are sent."""
    idle = lambda: not (limit.active or limit.queue_depth)  # noqa: E731
    await eventually(idle, f"{limit!r} to be idle", seconds=5.0)
    assert limit.try_acquire(), limit


def non_terminal(reply: dict[str, Any], stage: str) -> str:
    """The failure's message, after checking the collector records a non-terminal failure."""
    assert _is_episode_response(reply), reply
    assert reply["failure"]["terminal"] is False
    record = _episode_record(reply)
    assert record["_ng_failure_stage"] == stage
    assert not is_terminal_failure(record)  # so --resume dispatches it again
    return str(record["_ng_failure_message"])


async def test_every_refusal_in_run_is_a_non_terminal_failure(component: str):
    rows = [
        row(1, "/v1/responses"),  # openai: a full queue, 503
        row(2, "/verify", stage="verification"),  # problem: an admission timeout, 503
        row(3, "/run", stage="seed"),  # an inner environment server's episode refusal
        row(4, "/local", stage="cleanup"),  # a limit inside run(): TimeoutError
    ]
    openai, problem, episode, local = await held(component, rows)
    assert non_terminal(openai, "agent").endswith(
        "/v1/responses answered 503: Limit 'generation' (max_concurrent=1) already has 0 "
        "requests queued."
    )
    assert openai["failure"]["failure_kind"] == "gym_concurrency:queue_full"
    assert "/verify answered 503: No slot of limit 'verification'" in non_terminal(
        problem, "verification"
    )
    assert problem["failure"]["failure_kind"] == "gym_concurrency:admission_timeout"
    assert (
        non_terminal(episode, "seed") == "an inner environment server: Episode admission queue full"
    )
    assert "no slot within 0.01 s" in non_terminal(local, "cleanup")
    assert local["failure"]["failure_kind"] == "gym_concurrency:timeout"


async def test_without_the_helper_a_refusal_is_terminal_and_a_bug_stays_terminal(component: str):
    unhelped, bug = await held(
        component, [row(1, "/v1/responses", helper=False), row(2, "/broken")]
    )
    for reply in (unhelped, bug):
        assert _is_episode_response(reply)
        record = _episode_record(reply)
        assert record["_ng_failure_message"].startswith("Unhandled environment server error")
        assert is_terminal_failure(record)  # resume never retries these
    assert "503" in unhelped["failure"]["failure_reason"]
    assert "500" in bug["failure"]["failure_reason"]


def test_the_stages_are_nemo_gyms():
    assert get_args(EpisodeStage) == get_args(FailureStage)
