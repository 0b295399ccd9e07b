"""A NeMo Gym resources server limited by gym-concurrency: `/verify` under a RouteLimit with the
problem profile (a refusal is a 503 with Retry-After, which the environment server's outbound
limit waits out)."""

from fastapi import FastAPI
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    ConcurrencyStatusView,
    RouteLimit,
)
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class MathVerifierConfig(BaseResourcesServerConfig):
    verification: RouteLimit


class MathVerifyRequest(BaseVerifyRequest):
    expected_answer: str


class MathVerifier(SimpleResourcesServer):
    ray_enabled = False
    config: MathVerifierConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()  # NeMo Gym's /verify, /aggregate_metrics, sessions
        settings = ConcurrencySettings(
            component="resources_server",
            server_name=self.config.name,
            routes=[self.config.verification],
        )
        app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
        app.add_route("/concurrency", ConcurrencyStatusView())  # every limit of this server now
        return app

    async def verify(self, body: MathVerifyRequest) -> BaseVerifyResponse:
        reward = 1.0 if body.expected_answer in body.response.output_text else 0.0
        return BaseVerifyResponse(**body.model_dump(), reward=reward)


if __name__ == "__main__":
    MathVerifier.run_webserver()
