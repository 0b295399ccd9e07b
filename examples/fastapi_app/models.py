"""The request and response bodies of the demo's routes."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Task(BaseModel):
    """One task of an environment: the prompt and the answer the verifier looks for."""

    task_id: str | None = None
    prompt: str = Field(min_length=1, max_length=20_000)
    expected: str = Field(min_length=1, max_length=20_000)


class EpisodeRequest(BaseModel):
    """NeMo Gym's BaseEpisodeRequest shape, plus how long the verifier should work."""

    episode_id: str | None = None
    task: Task
    verifier_work_seconds: float = Field(default=0.0, ge=0, le=60)


class EpisodeResult(BaseModel):
    reward: float
    response: str


class EpisodeFailure(BaseModel):
    failure_reason: str
    terminal: bool
    stage: str


class EpisodeResponse(BaseModel):
    """NeMo Gym's BaseEpisodeResponse: a result, or a failure (never both)."""

    episode_id: str | None
    task_id: str | None
    result: EpisodeResult | None
    failure: EpisodeFailure | None


class VerifyRequest(BaseModel):
    response: str = Field(max_length=100_000)
    expected: str = Field(min_length=1, max_length=20_000)
    work_seconds: float = Field(default=0.0, ge=0, le=60)


class JudgeRequest(BaseModel):
    response: str = Field(max_length=20_000)
    expected: str = Field(min_length=1, max_length=20_000)


class JudgeResponse(BaseModel):
    verdict: bool
    reward: float
    judge_output: str
