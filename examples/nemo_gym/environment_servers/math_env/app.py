"""A NeMo Gym environment server limited by gym-concurrency: `/run` under a RouteLimit with the
episode profile, and the two calls each episode makes (the model server, then the resources
server's verifier) through outbound limits that retry what those servers refuse."""

import time
from typing import Any

import httpx
from fastapi import FastAPI
from gym_concurrency.middleware import (
    AdaptiveLimit,
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    ConcurrencyStatusView,
    RouteLimit,
)
from gym_concurrency.middleware.nemo_gym import refusals_as_episode_failures
from nemo_gym.base_environment_server import (
    BaseEnvironmentServer,
    BaseEnvironmentServerConfig,
    CleanupContext,
)
from nemo_gym.config_types import (
    AggregateMetrics,
    AggregateMetricsRequest,
    ModelServerRef,
    ResourcesServerRef,
)
from nemo_gym.episode_types import BaseEpisodeRequest, BaseEpisodeResponse
from nemo_gym.global_config import get_first_server_config_dict
from pydantic import BaseModel, PositiveInt, PrivateAttr

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import LimitedTransport, RetryPolicy


class MathTask(BaseModel):
    responses_create_params: dict[str, Any]  # what the model is asked
    expected_answer: str


class MathResult(BaseModel):
    reward: float
    response: dict[str, Any]  # the model's, as it came: the collector's aggregation reads its usage
    elapsed_seconds: float  # how long the episode ran (NeMo Gym's name for it)


class MathRequest(BaseEpisodeRequest[MathTask]):
    pass


class MathResponse(BaseEpisodeResponse[MathResult]):
    pass


class MathEnvironmentServerConfig(BaseEnvironmentServerConfig):
    model_server: ModelServerRef
    resources_server: ResourcesServerRef
    episodes: RouteLimit  # instead of max_concurrent_episodes / queue_timeout_seconds
    max_concurrent_model_calls: PositiveInt  # what the model server can take
    max_concurrent_verify_calls: PositiveInt  # what the resources server can take


class MathEnvironmentServer(BaseEnvironmentServer[MathRequest, MathResponse]):
    ray_enabled = False  # it does not use Ray: it starts without joining a Ray cluster
    config: MathEnvironmentServerConfig
    request_model = MathRequest
    response_model = MathResponse
    _model: httpx.AsyncClient = PrivateAttr()
    _verifier: httpx.AsyncClient = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        config = self.config
        self._model = self.client_for(config.model_server.name, config.max_concurrent_model_calls)
        self._verifier = self.client_for(
            config.resources_server.name, config.max_concurrent_verify_calls
        )

    def client_for(self, server_name: str, max_concurrent: int) -> httpx.AsyncClient:
        """Calls to `server_name`: each attempt holds one of at most `max_concurrent` slots
        (fewer while the server refuses), and a 429 or 503 is retried after its Retry-After,
        within a retry budget."""
        server = get_first_server_config_dict(self.server_client.global_config_dict, server_name)
        limit = MeteredSemaphore(
            max_concurrent,
            component="environment_server",
            limit_name=f"calls_to_{server_name}",
            server=self.config.name,
        )
        return httpx.AsyncClient(
            base_url=f"http://{server.host}:{server.port}",
            transport=LimitedTransport(limit, retry=RetryPolicy(), adaptive=finds(max_concurrent)),
            timeout=httpx.Timeout(None, connect=10),  # the episode's own deadline bounds it
        )

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()  # NeMo Gym's /run and /aggregate_metrics
        settings = ConcurrencySettings(
            component="environment_server",
            server_name=self.config.name,
            routes=[self.config.episodes],
        )
        app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
        app.add_route("/concurrency", ConcurrencyStatusView())  # every limit of this server now
        return app

    async def run(self, request: MathRequest, cleanup: CleanupContext) -> MathResponse:
        started, task = time.monotonic(), request.task.task_input
        with refusals_as_episode_failures("agent"):  # a refusal: a non-terminal failure
            answer = await self._model.post("/v1/responses", json=task.responses_create_params)
            answer.raise_for_status()
        response = answer.json()  # the verifier validates it as NeMo Gym's response
        with refusals_as_episode_failures("verification"):
            verdict = await self._verifier.post(
                "/verify",
                json={
                    "responses_create_params": task.responses_create_params,
                    "response": response,
                    "expected_answer": task.expected_answer,
                },
            )
            verdict.raise_for_status()
        return MathResponse(
            episode_id=request.episode_id,
            task_id=request.task.task_id,
            result=MathResult(
                reward=verdict.json()["reward"],
                response=response,
                elapsed_seconds=time.monotonic() - started,
            ),
        )

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        # The resources server scores the rollouts (NeMo Gym's reward profile).
        metrics = await self._verifier.post("/aggregate_metrics", json=body.model_dump())
        metrics.raise_for_status()
        return AggregateMetrics.model_validate(metrics.json())


def finds(max_concurrent: int) -> AdaptiveLimit:
    """An outbound limit that finds what the next hop takes: it starts at `max_concurrent`,
    shrinks at once at a 429 / 503 (or a connection error) and grows back by one slot after a
    window that used every slot, never above `max_concurrent` (and back to a size that was
    refused, ever more slowly: docs/adaptive-limits.md, AIMD); latency never moves it."""
    return AdaptiveLimit(
        min_concurrent=1, max_concurrent=max_concurrent, algorithm="aimd", latency_tolerance=None
    )


if __name__ == "__main__":
    MathEnvironmentServer.run_webserver()
