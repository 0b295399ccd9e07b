"""The failure profiles: the status, headers and body a request gets when it is not admitted.

`problem` (RFC 9457 problem details) and `openai` (the OpenAI error shape) answer 503 with
`Retry-After`; `episode` answers 200 with NeMo Gym's BaseEpisodeResponse carrying a
non-terminal admission failure, so a rollout collector records it instead of retrying.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from starlette.types import Send

from .settings import RouteLimit

__all__ = ["FailureResponse", "Reason", "failure_response", "retry_after_seconds"]

Reason = Literal["timeout", "shed"]

PROBLEM_TYPES: dict[Reason, str] = {
    "timeout": "urn:gym-concurrency:admission-timeout",
    "shed": "urn:gym-concurrency:queue-full",
}
PROBLEM_TITLES: dict[Reason, str] = {
    "timeout": "Admission timed out",
    "shed": "Admission queue full",
}
OPENAI_CODES: dict[Reason, str] = {"timeout": "admission_timeout", "shed": "queue_full"}
EPISODE_FAILURE_REASONS: dict[Reason, str] = {
    "timeout": "Episode admission timed out",
    "shed": "Episode admission queue full",
}


@dataclass(frozen=True, slots=True)
class FailureResponse:
    """A complete HTTP response: status, headers and body."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    async def send(self, send: Send) -> None:
        """Send the whole response over ASGI `send`."""
        headers = [*self.headers, (b"content-length", str(len(self.body)).encode())]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


def retry_after_seconds(route: RouteLimit) -> int:
    """`retry_after_seconds`, else the queue timeout rounded up to whole seconds, else 1."""
    if route.retry_after_seconds is not None:
        return route.retry_after_seconds
    if route.queue_timeout_seconds is not None:
        return max(1, math.ceil(route.queue_timeout_seconds))
    return 1


def failure_response(route: RouteLimit, reason: Reason, request_body: bytes) -> FailureResponse:
    """The response `route`'s failure profile gives for `reason`; `request_body` feeds the
    episode profile's ids."""
    if route.failure == "episode":
        return _json(200, _episode_body(reason, request_body), [])
    retry_after = [(b"retry-after", str(retry_after_seconds(route)).encode())]
    if route.failure == "openai":
        return _json(503, _openai_body(route, reason), retry_after)
    return _json(503, _problem_body(route, reason), retry_after, b"application/problem+json")


def _detail(route: RouteLimit, reason: Reason) -> str:
    if reason == "timeout":
        return (
            f"No slot of limit {route.limit_name!r} (max_concurrent={route.max_concurrent}) "
            f"became free within {route.queue_timeout_seconds:g} s."
        )
    return (
        f"Limit {route.limit_name!r} (max_concurrent={route.max_concurrent}) already has "
        f"{route.max_queue} requests queued."
    )


def _problem_body(route: RouteLimit, reason: Reason) -> dict[str, Any]:
    return {
        "type": PROBLEM_TYPES[reason],
        "title": PROBLEM_TITLES[reason],
        "status": 503,
        "detail": _detail(route, reason),
        "limit_name": route.limit_name,
    }


def _openai_body(route: RouteLimit, reason: Reason) -> dict[str, Any]:
    return {
        "error": {
            "message": _detail(route, reason),
            "type": "server_error",
            "param": None,
            "code": OPENAI_CODES[reason],
        }
    }


def _episode_body(reason: Reason, request_body: bytes) -> dict[str, Any]:
    episode_id, task_id = episode_ids(request_body)
    return {
        "episode_id": episode_id,
        "task_id": task_id,
        "result": None,
        "failure": {
            "failure_reason": EPISODE_FAILURE_REASONS[reason],
            "terminal": False,
            "stage": "admission",
        },
    }


def episode_ids(request_body: bytes) -> tuple[str | int | None, str | int | None]:
    """(episode_id, task_id) of an episode request: `task.task_id` else a top-level `task_id`;
    None where absent, not a string or integer, or the body is not a JSON object."""
    try:
        request = json.loads(request_body)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
        return None, None
    if not isinstance(request, dict):
        return None, None
    task = request.get("task")
    task_id = task.get("task_id") if isinstance(task, dict) else None
    if _id_or_none(task_id) is None:
        task_id = request.get("task_id")
    return _id_or_none(request.get("episode_id")), _id_or_none(task_id)


def _id_or_none(value: object) -> str | int | None:
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None


def _json(
    status: int,
    body: dict[str, Any],
    headers: list[tuple[bytes, bytes]],
    content_type: bytes = b"application/json",
) -> FailureResponse:
    encoded = json.dumps(body, separators=(",", ":")).encode()
    return FailureResponse(status, [(b"content-type", content_type), *headers], encoded)
