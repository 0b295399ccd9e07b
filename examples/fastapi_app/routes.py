"""The demo's routes: an episode, the OpenAI-compatible proxy, the verifier and the judge.

Route limits (episodes, upstream_requests) are applied by ConcurrencyLimitMiddleware before a
handler runs; the verifier and judge limits are taken inside, around the guarded work only.
"""

from __future__ import annotations

from typing import Annotated

import httpx
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from gym_concurrency.middleware import OperationHandle, operation_limit

from .config import DemoConfig
from .fake_model import JUDGE_SUFFIX
from .models import (
    EpisodeFailure,
    EpisodeRequest,
    EpisodeResponse,
    EpisodeResult,
    JudgeRequest,
    JudgeResponse,
    VerifyRequest,
)
from .upstream import UpstreamError, complete, forward
from .verification import VerifyResult, run_verifier

router = APIRouter()


def get_client(request: Request) -> httpx.AsyncClient:
    """The app's one shared upstream client (made in the lifespan)."""
    client: httpx.AsyncClient = request.app.state.upstream
    return client


def get_config(request: Request) -> DemoConfig:
    """The demo configuration the app was made with."""
    config: DemoConfig = request.app.state.config
    return config


UpstreamDep = Annotated[httpx.AsyncClient, Depends(get_client)]
ConfigDep = Annotated[DemoConfig, Depends(get_config)]
VerifierDep = Annotated[OperationHandle, Depends(operation_limit("verifier"))]
JudgeDep = Annotated[OperationHandle, Depends(operation_limit("judge"))]


def _no_slot(limit_name: str) -> HTTPException:
    return HTTPException(
        503, f"{limit_name} limit: no slot within its timeout", headers={"Retry-After": "1"}
    )


async def verify_under_limit(
    verifier: OperationHandle, payload: dict[str, object], config: DemoConfig
) -> VerifyResult:
    """Run the verifier inside the `verifier` operation limit; 503 if no slot came in time."""
    try:
        async with verifier as op:
            return await run_verifier(op, payload, config.verifier_timeout_seconds)
    except TimeoutError:  # only the admission wait raises it: run_verifier handles its own
        raise _no_slot("verifier") from None


@router.post("/run")
async def run_episode(
    request: EpisodeRequest, client: UpstreamDep, verifier: VerifierDep, config: ConfigDep
) -> EpisodeResponse:
    """One episode: ask the model, then verify its answer. A failure is a non-terminal row."""
    task = request.task

    def failed(reason: str, stage: str) -> EpisodeResponse:
        failure = EpisodeFailure(failure_reason=reason, terminal=False, stage=stage)
        return EpisodeResponse(
            episode_id=request.episode_id, task_id=task.task_id, result=None, failure=failure
        )

    try:
        answer = await complete(client, config.upstream_model, task.prompt)
    except UpstreamError as exc:
        return failed(str(exc), "model")
    payload = {
        "response": answer,
        "expected": task.expected,
        "work_seconds": request.verifier_work_seconds,
    }
    try:
        verdict = await verify_under_limit(verifier, payload, config)
    except HTTPException as exc:
        return failed(str(exc.detail), "verify")
    if verdict.outcome != "ok":
        return failed(verdict.detail or f"verifier {verdict.outcome}", "verify")
    return EpisodeResponse(
        episode_id=request.episode_id,
        task_id=task.task_id,
        result=EpisodeResult(reward=verdict.reward, response=answer),
        failure=None,
    )


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, client: UpstreamDep) -> Response:
    """Forward an OpenAI chat completion request to the upstream model; answer as it did."""
    try:
        upstream = await forward(client, await request.body())
    except UpstreamError as exc:
        error = {
            "message": str(exc),
            "type": "upstream_error",
            "param": None,
            "code": "upstream_unavailable",
        }
        return JSONResponse({"error": error}, exc.status_code)
    return Response(
        upstream.content,
        upstream.status_code,
        media_type=upstream.headers.get("content-type", "application/json"),
    )


@router.post("/verify")
async def verify(request: VerifyRequest, verifier: VerifierDep, config: ConfigDep) -> VerifyResult:
    """Run the verifier process on a response; outcome timeout when it ran too long."""
    return await verify_under_limit(verifier, request.model_dump(), config)


@router.post("/judge")
async def judge(
    request: JudgeRequest, judge_limit: JudgeDep, client: UpstreamDep, config: ConfigDep
) -> JudgeResponse:
    """Ask the upstream model, as a judge, whether the response has the expected answer."""
    prompt = f"Expected: {request.expected}\nResponse: {request.response}\n{JUDGE_SUFFIX}"
    try:
        async with judge_limit as op:
            try:
                output = await complete(client, config.upstream_model, prompt)
            except UpstreamError as exc:
                op.outcome = "error"
                raise HTTPException(exc.status_code, str(exc)) from exc
    except TimeoutError:  # complete() raises UpstreamError only: this is the admission wait
        raise _no_slot("judge") from None
    verdict = output.strip().lower().startswith("yes")
    return JudgeResponse(verdict=verdict, reward=1.0 if verdict else 0.0, judge_output=output)
