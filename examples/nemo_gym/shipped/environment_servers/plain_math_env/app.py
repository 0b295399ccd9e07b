"""A NeMo Gym environment server written with NeMo Gym alone (no gym-concurrency import): NeMo
Gym's own admission (`max_concurrent_episodes`, `queue_timeout_seconds`), and each episode one
model call and one verification through NeMo Gym's own `ServerClient`. Under
`gym-concurrency-nemo-gym` its `episodes` limit is visible and a refusal it meets in `run()`
ends as a non-terminal failure (docs/nemo-gym.md, "NeMo Gym as shipped")."""

import time
from typing import Any

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
from nemo_gym.server_utils import get_response_json, raise_for_status
from pydantic import BaseModel


class MathTask(BaseModel):
    responses_create_params: dict[str, Any]
    question: str
    expected_answer: str


class MathResult(BaseModel):
    reward: float
    # The verifier's reading of the answer: math_with_judge's metrics count a row without one
    # as `no_answer`.
    extracted_answer: str | None
    response: dict[str, Any]  # the model's, as it came (the collector reads its usage)
    elapsed_seconds: float


class MathRequest(BaseEpisodeRequest[MathTask]):
    pass


class MathResponse(BaseEpisodeResponse[MathResult]):
    pass


class PlainMathEnvConfig(BaseEnvironmentServerConfig):
    model_server: ModelServerRef
    resources_server: ResourcesServerRef


class PlainMathEnv(BaseEnvironmentServer[MathRequest, MathResponse]):
    ray_enabled = False
    config: PlainMathEnvConfig
    request_model = MathRequest
    response_model = MathResponse

    async def run(self, request: MathRequest, cleanup: CleanupContext) -> MathResponse:
        started, task = time.monotonic(), request.task.task_input
        answer = await self.server_client.post(
            server_name=self.config.model_server.name,
            url_path="/v1/responses",
            json=task.responses_create_params,
        )
        await raise_for_status(answer)
        response = await get_response_json(answer)
        verdict = await self.server_client.post(
            server_name=self.config.resources_server.name,
            url_path="/verify",
            json=task.model_dump() | {"response": response},
        )
        await raise_for_status(verdict)
        verified = await get_response_json(verdict)
        return MathResponse(
            episode_id=request.episode_id,
            task_id=request.task.task_id,
            result=MathResult(
                reward=verified["reward"],
                extracted_answer=verified.get("extracted_answer"),
                response=response,
                elapsed_seconds=time.monotonic() - started,
            ),
        )

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        metrics = await self.server_client.post(
            server_name=self.config.resources_server.name,
            url_path="/aggregate_metrics",
            json=body.model_dump(),
        )
        await raise_for_status(metrics)
        return AggregateMetrics.model_validate(await get_response_json(metrics))


if __name__ == "__main__":
    PlainMathEnv.run_webserver()
