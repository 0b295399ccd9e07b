"""Inside a NeMo Gym environment server's `run()`: a refusal met further down becomes NeMo Gym's
non-terminal `HandledEpisodeError`, so the rollout collector records a failure row that
`gym eval run --resume` runs again, never a terminal "Unhandled environment server error".

    async def run(self, request, cleanup):
        with refusals_as_episode_failures("agent"):
            reply = await self.model.post("/v1/chat/completions", json=...)
            reply.raise_for_status()

A refusal is what a gym-concurrency limit answers or raises when it does not admit: an inner
hop's 503 `problem` / `openai` failure response (admission timeout, deadline exceeded, full
queue, shared limit unavailable), an inner environment server's `episode` admission failure, a
local limit's TimeoutError (DeadlineExceededError) / QueueFullError / LimitUnavailableError,
or an outbound call whose retries ran out on a 429 / 502 / 503 / 504. Anything else passes
through unchanged.

NeMo Gym is imported only when a refusal is turned into its error, and aiohttp / httpx are never
imported here: this module imports without any of them.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from gym_concurrency import DeadlineExceededError, LimitUnavailableError, QueueFullError
from gym_concurrency.clients import RetryPolicy
from gym_concurrency.limits import Refusal, UpstreamCapacityError
from gym_concurrency.safe_urls import safe_url

from .failures import EPISODE_FAILURE_REFUSALS, OPENAI_CODES, PROBLEM_TYPES

if TYPE_CHECKING:
    from nemo_gym.base_environment_server import HandledEpisodeError

__all__ = [
    "REFUSAL_STATUSES",
    "EpisodeRefusedError",
    "EpisodeStage",
    "RefusalMet",
    "episode_failure",
    "raise_for_episode_refusal",
    "refusal_of",
    "refusals_as_episode_failures",
]

# NeMo Gym 0.7.0's `nemo_gym.failure_kinds.FailureStage`.
EpisodeStage = Literal["admission", "seed", "agent", "verification", "cleanup"]
# The statuses an outbound RetryPolicy retries by default: one that still ends the call means
# the hop was overloaded past what the retries (or their budget) could wait out.
REFUSAL_STATUSES = frozenset(RetryPolicy().statuses)
RefusalKind = Literal[
    "admission_timeout",
    "deadline_exceeded",
    "queue_full",
    "limit_unavailable",
    "budget_exhausted",
    "engine_saturated",
    "timeout",
    "overloaded",
]

_KINDS: dict[Refusal, RefusalKind] = {
    "timeout": "admission_timeout",
    "deadline": "deadline_exceeded",
    "shed": "queue_full",
    "unavailable": "limit_unavailable",
    "budget": "budget_exhausted",
    "saturated": "engine_saturated",
}
_PROBLEM_KINDS = {PROBLEM_TYPES[reason]: kind for reason, kind in _KINDS.items()}
_OPENAI_KINDS = {OPENAI_CODES[reason]: kind for reason, kind in _KINDS.items()}
_EPISODE_KINDS = {EPISODE_FAILURE_REFUSALS[reason]: kind for reason, kind in _KINDS.items()}
_MAX_REASON = 2000  # EpisodeFailure.failure_reason's max_length
_MAX_BODY_SHOWN = 200


@dataclass(frozen=True, slots=True)
class RefusalMet:
    """A refusal met further down: what kind, and one line saying who refused and why."""

    kind: RefusalKind
    detail: str

    @property
    def failure_kind(self) -> str:
        """The `EpisodeFailure.failure_kind` it is reported as (a namespaced NeMo Gym kind)."""
        return f"gym_concurrency:{self.kind}"


class EpisodeRefusedError(Exception):
    """An inner environment server answered `/run` with an `episode` admission failure."""

    def __init__(self, refusal: RefusalMet) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


def refusal_of(error: BaseException) -> RefusalMet | None:
    """The refusal `error` reports, or None if it is not one (see the module's docstring)."""
    if isinstance(error, EpisodeRefusedError):
        return error.refusal
    if isinstance(error, QueueFullError):
        return RefusalMet("queue_full", str(error) or "the limit's queue is full")
    if isinstance(error, LimitUnavailableError):
        return RefusalMet("limit_unavailable", str(error) or "the shared limit cannot be reached")
    if isinstance(error, DeadlineExceededError):  # a limit's wait ended by the deadline
        return RefusalMet("deadline_exceeded", str(error))
    if isinstance(error, UpstreamCapacityError):  # its budget or its engine kept it out
        return RefusalMet(_KINDS[error.reason], str(error))
    if isinstance(error, TimeoutError):  # a limit's admission timeout (also aiohttp's timeouts)
        return RefusalMet("timeout", str(error) or type(error).__name__)
    answered = _http_status_error(error)
    if answered is None or answered[0] not in REFUSAL_STATUSES:
        return None
    return _refusal_in_response(*answered)


def raise_for_episode_refusal(reply: Mapping[str, Any]) -> None:
    """Raise EpisodeRefusedError if `reply` (an inner environment server's `/run` reply, as
    JSON) is the `episode` profile's admission failure."""
    failure = reply.get("failure")
    if not isinstance(failure, Mapping) or failure.get("stage") != "admission":
        return
    reason = failure.get("failure_reason")
    kind = _EPISODE_KINDS.get(reason) if isinstance(reason, str) else None
    if kind is not None and failure.get("terminal") is False:
        raise EpisodeRefusedError(RefusalMet(kind, f"an inner environment server: {reason}"))


def episode_failure(error: BaseException, stage: EpisodeStage) -> HandledEpisodeError | None:
    """NeMo Gym's non-terminal HandledEpisodeError at `stage` for a refusal, else None."""
    _check_stage(stage)
    refusal = refusal_of(error)
    if refusal is None:
        return None
    from nemo_gym.base_environment_server import HandledEpisodeError
    from nemo_gym.episode_types import EpisodeFailure

    failure = EpisodeFailure(
        failure_reason=refusal.detail[:_MAX_REASON],
        terminal=False,
        stage=stage,
        failure_kind=refusal.failure_kind,
    )
    return HandledEpisodeError(failure)


@contextlib.contextmanager
def refusals_as_episode_failures(stage: EpisodeStage) -> Iterator[None]:
    """A refusal raised in the block is raised again as NeMo Gym's non-terminal
    HandledEpisodeError at `stage` (its cause the refusal); anything else passes through."""
    _check_stage(stage)
    try:
        yield
    except Exception as error:
        handled = episode_failure(error, stage)
        if handled is None:
            raise
        raise handled from error


def _check_stage(stage: object) -> None:
    if stage not in get_args(EpisodeStage):
        raise ValueError(f"stage must be one of {get_args(EpisodeStage)}, got {stage!r}")


def _http_status_error(error: BaseException) -> tuple[int, bytes | None, str] | None:
    """(status, body if known, URL) of an HTTP error status raised by aiohttp or httpx."""
    aiohttp = sys.modules.get("aiohttp")  # never imported here: the error's module is loaded
    if aiohttp is not None and isinstance(error, aiohttp.ClientResponseError):
        # NeMo Gym's `raise_for_status` keeps the body on the error; aiohttp's own does not.
        body = getattr(error, "response_content", None)
        info = error.request_info
        url = getattr(info, "real_url", None) or getattr(info, "url", "")
        return error.status, body if isinstance(body, bytes) else None, safe_url(str(url))
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(error, httpx.HTTPStatusError):
        response = error.response
        try:
            content: bytes | None = response.content
        except httpx.ResponseNotRead:  # a streamed response: its body is unknown
            content = None
        return response.status_code, content, safe_url(str(error.request.url))
    return None


def _refusal_in_response(status: int, body: bytes | None, url: str) -> RefusalMet:
    """A gym-concurrency failure response by its type / code, else an overloaded hop."""
    document = _json_object(body)
    error = document.get("error")
    if isinstance(error, Mapping):  # the openai profile
        kind = _OPENAI_KINDS.get(str(error.get("code")))
        text = error.get("message")
    else:  # the problem profile
        kind = _PROBLEM_KINDS.get(str(document.get("type")))
        text = document.get("detail")
    if kind is not None:
        return RefusalMet(kind, f"{url} answered {status}: {text}")
    shown = (body or b"")[:_MAX_BODY_SHOWN].decode(errors="replace")
    return RefusalMet("overloaded", f"{url} answered {status}, after any retries: {shown}")


def _json_object(body: bytes | None) -> dict[str, Any]:
    try:
        document = json.loads(body) if body else None
    except ValueError:  # not JSON (UnicodeDecodeError is a ValueError)
        return {}
    return document if isinstance(document, dict) else {}
