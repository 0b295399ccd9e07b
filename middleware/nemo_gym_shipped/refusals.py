"""Refusals under the opt-in, at both ends of a hop.

The server that refuses: a shipped limit's admission timeout (LimitRefusedError) is answered as
the project's failure profiles answer one, a 503 with `Retry-After`: the `openai` profile on a
model server, `problem` elsewhere, so a caller can tell a refusal from a bug.

The environment server that meets one in `run()` (through NeMo Gym's own `ServerClient`, or any
client `refusal_of` knows): the episode ends as NeMo Gym's non-terminal failure at the stage
the refused call belongs to, by the path it called, never as a terminal "Unhandled environment
server error". Anything that is not a refusal stays as NeMo Gym reports it.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..failures import OPENAI_CODES, PROBLEM_TITLES, PROBLEM_TYPES
from ..nemo_gym import EpisodeStage, episode_failure
from .limits import LimitRefusedError

__all__ = ["STAGES_BY_PATH", "handled_failure", "refusal_response", "stage_of"]

# The stage a refused call belongs to, by the path it called; any other path: `agent`.
STAGES_BY_PATH: dict[str, EpisodeStage] = {
    "/seed_session": "seed",
    "/verify": "verification",
    "/run": "admission",
}


def refusal_response(error: LimitRefusedError, *, openai: bool) -> JSONResponse:
    """The 503 a server answers for its shipped limit's admission timeout (Retry-After: the
    timeout) or deadline refusal (Retry-After: 1; it says nothing of when the queue frees)."""
    reason = error.reason
    seconds = 1 if reason == "deadline" else max(1, math.ceil(error.seconds or 1))
    headers = {"Retry-After": str(seconds)}
    if openai:
        body: dict[str, Any] = {
            "error": {
                "message": str(error),
                "type": "server_error",
                "param": None,
                "code": OPENAI_CODES[reason],
            }
        }
        return JSONResponse(body, status_code=503, headers=headers)
    body = {
        "type": PROBLEM_TYPES[reason],
        "title": PROBLEM_TITLES[reason],
        "status": 503,
        "detail": str(error),
        "limit_name": error.limit_name,
    }
    return JSONResponse(body, 503, headers, media_type="application/problem+json")


def exception_handler(openai: bool) -> Any:
    """A Starlette exception handler answering LimitRefusedError with `refusal_response`."""

    async def handle(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, LimitRefusedError)
        return refusal_response(error, openai=openai)

    return handle


def stage_of(error: BaseException) -> EpisodeStage:
    """The stage of the call that raised `error`, by its URL's path (`agent` if unknown)."""
    url = _url_of(error)
    path = urlsplit(url).path if url else ""
    return STAGES_BY_PATH.get(path.rstrip("/") or "/", "agent")


def handled_failure(error: BaseException) -> Any:
    """NeMo Gym's EpisodeFailure for a refusal (non-terminal, at its stage), else None."""
    handled = episode_failure(error, stage_of(error)) if isinstance(error, Exception) else None
    return None if handled is None else handled.failure


def _url_of(error: BaseException) -> str:
    info = getattr(error, "request_info", None)  # aiohttp (NeMo Gym's ServerClient)
    if info is not None:
        return str(getattr(info, "real_url", None) or getattr(info, "url", ""))
    request = getattr(error, "_request", None) or getattr(error, "request", None)  # httpx
    return str(getattr(request, "url", "") or "")
