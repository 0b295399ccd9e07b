"""A NeMo Gym model server limited by gym-concurrency: `/v1/responses` and `/v1/chat/completions`
under one RouteLimit with the openai profile (a refusal is a 503 with Retry-After), and its calls
to the upstream OpenAI-compatible endpoint through an outbound limit sized to what the upstream
can take, retried after the upstream's own Retry-After."""

from typing import Any

import httpx
from fastapi import FastAPI, Response
from gym_concurrency.middleware import (
    AdaptiveLimit,
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    ConcurrencyStatusView,
    RouteLimit,
)
from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from pydantic import PositiveInt, PrivateAttr

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import LimitedTransport, RetryPolicy


class PolicyModelConfig(BaseResponsesAPIModelConfig):
    openai_base_url: str
    openai_api_key: str
    openai_model: str
    generation: RouteLimit  # what this server takes at once, for every caller
    max_concurrent_upstream_calls: PositiveInt  # what the upstream can take


class PolicyModel(SimpleResponsesAPIModel):
    ray_enabled = False
    config: PolicyModelConfig
    _upstream: httpx.AsyncClient = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        limit = MeteredSemaphore(
            self.config.max_concurrent_upstream_calls,
            component="model_server",
            limit_name="upstream",
            server=self.config.name,
        )
        self._upstream = httpx.AsyncClient(
            base_url=self.config.openai_base_url,
            headers={"Authorization": f"Bearer {self.config.openai_api_key}"},
            transport=LimitedTransport(limit, retry=RetryPolicy(), adaptive=finds(limit.limit)),
            timeout=httpx.Timeout(None, connect=10),
        )

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        generation = self.config.generation
        settings = ConcurrencySettings(
            component="model_server",
            server_name=self.config.name,
            routes=[  # both routes share the one limit
                generation.model_copy(update={"path": "/v1/responses"}),
                generation.model_copy(update={"path": "/v1/chat/completions"}),
            ],
        )
        app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
        app.add_route("/concurrency", ConcurrencyStatusView())  # every limit of this server now
        return app

    async def responses(
        self, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse | Response:
        answer = await self.upstream("/responses", body.model_dump(exclude_unset=True))
        if answer.is_error:
            return _passed_on(answer)
        return NeMoGymResponse.model_validate(answer.json())

    async def chat_completions(
        self, body: NeMoGymChatCompletionCreateParamsNonStreaming
    ) -> NeMoGymChatCompletion | Response:
        answer = await self.upstream("/chat/completions", body.model_dump(exclude_unset=True))
        if answer.is_error:
            return _passed_on(answer)
        return NeMoGymChatCompletion.model_validate(answer.json())

    async def upstream(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST `body` to the upstream as this server's model; its last answer."""
        return await self._upstream.post(
            path.lstrip("/"), json=body | {"model": self.config.openai_model}
        )


def _passed_on(answer: httpx.Response) -> Response:
    """The upstream's error, passed on to the caller as it came (status, body, Retry-After)."""
    headers = {
        name: answer.headers[name]
        for name in ("retry-after", "retry-after-ms")
        if name in answer.headers
    }
    return Response(
        answer.content,
        status_code=answer.status_code,
        headers=headers,
        media_type=answer.headers.get("content-type"),
    )


def finds(max_concurrent: int) -> AdaptiveLimit:
    """An outbound limit that finds what the next hop takes: it starts at `max_concurrent`,
    shrinks at once at a 429 / 503 (or a connection error) and grows back by one slot after a
    window that used every slot, never above `max_concurrent` (and back to a size that was
    refused, ever more slowly: docs/adaptive-limits.md, AIMD); latency never moves it."""
    return AdaptiveLimit(
        min_concurrent=1, max_concurrent=max_concurrent, algorithm="aimd", latency_tolerance=None
    )


if __name__ == "__main__":
    PolicyModel.run_webserver()
