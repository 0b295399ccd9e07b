"""The failure profiles: the status, headers and body a request gets when it is not admitted.

`problem` (RFC 9457 problem details) and `openai` (the OpenAI error shape) answer 503 with
`Retry-After` (429 for a spent rate budget: a rate limit, with the seconds until the budget
holds the request); `episode` answers 200 with NeMo Gym's BaseEpisodeResponse carrying a
non-terminal admission failure, so a rollout collector records it instead of retrying.
Each reason (`Refusal`) has its own body; a deadline refusal also its own Retry-After rule
(`retry_after_seconds`).

Every response is encoded once per route (`RouteFailures`): a refusal only copies the headers
and sends; an episode refusal splices the request's ids, copied verbatim, into its body.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from starlette.types import Scope, Send

from gym_concurrency.limits import REFUSALS, Refusal

from .settings import RouteLimit

__all__ = ["RouteFailures", "episode_ids", "retry_after_seconds", "send_misconfigured"]

PROBLEM_TYPES: dict[Refusal, str] = {
    "timeout": "urn:gym-concurrency:admission-timeout",
    "deadline": "urn:gym-concurrency:deadline-exceeded",
    "shed": "urn:gym-concurrency:queue-full",
    "unavailable": "urn:gym-concurrency:limit-unavailable",
    "budget": "urn:gym-concurrency:budget-exhausted",
    "saturated": "urn:gym-concurrency:engine-saturated",
}
PROBLEM_TITLES: dict[Refusal, str] = {
    "timeout": "Admission timed out",
    "deadline": "Admission deadline exceeded",
    "shed": "Admission queue full",
    "unavailable": "Admission unavailable",
    "budget": "Rate budget exhausted",
    "saturated": "Engine saturated",
}
OPENAI_CODES: dict[Refusal, str] = {
    "timeout": "admission_timeout",
    "deadline": "deadline_exceeded",
    "shed": "queue_full",
    "unavailable": "limit_unavailable",
    "budget": "rate_limit_exceeded",  # OpenAI's own code for a spent rate limit (with a 429)
    "saturated": "engine_saturated",
}
EPISODE_FAILURE_REFUSALS: dict[Refusal, str] = {
    "timeout": "Episode admission timed out",
    "deadline": "Episode admission deadline exceeded",
    "shed": "Episode admission queue full",
    "unavailable": "Episode admission unavailable",
    "budget": "Episode admission budget exhausted",
    "saturated": "Episode admission engine saturated",
}
# A spent rate budget is a rate limit: 429, as OpenAI and Anthropic answer theirs.
_STATUS: dict[Refusal, int] = {"budget": 429}
# A request refused because the server shuts down (reason "unavailable", while draining).
DRAINING_DETAIL = "The server is shutting down (draining); send the request to another replica."
EPISODE_DRAINING = "Episode admission unavailable: the server is draining"
_JSON = b"application/json"
_PROBLEM_JSON = b"application/problem+json"
_NULL = b"null"


class RouteFailures:
    """The failure responses of one route, one per reason, encoded once."""

    __slots__ = (
        "_bodies",
        "_budget_fallback",
        "_deadline_retry_after",
        "_draining",
        "_handover_wait",
        "_headers",
        "_retry_after",
        "_statuses",
        "_with_ms",
        "episode",
    )

    def __init__(
        self,
        route: RouteLimit,
        *,
        close_connection: bool = False,
        retry_after: Callable[[], int] | None = None,
        handover_wait: Callable[[], float | None] | None = None,
    ) -> None:
        self.episode = route.failure == "episode"
        self._statuses = {
            reason: 200 if self.episode else _STATUS.get(reason, 503) for reason in REFUSALS
        }
        self._bodies = {reason: _encoded_body(route, reason) for reason in REFUSALS}
        self._draining = _encoded_body(route, "unavailable", draining=True)
        # `retry_after` (Retry-After auto): computed for each refusal, from the hand-over rate.
        self._retry_after = None if self.episode else retry_after
        # A deadline refusal where no Retry-After is configured: the seconds the limit's
        # measured hand-over rate takes to clear its queue, when measured (`handover_wait`).
        if self.episode or retry_after is not None or route.retry_after_seconds is not None:
            handover_wait = None
        self._handover_wait = handover_wait
        # The openai profile also says it in milliseconds, as OpenAI's API does (its client
        # reads `retry-after-ms` first).
        self._with_ms = route.failure == "openai"
        self._deadline_retry_after = self._retry_after_headers(
            retry_after_seconds(route, "deadline")
        )
        content_type = _PROBLEM_JSON if route.failure == "problem" else _JSON
        self._headers: dict[Refusal, list[tuple[bytes, bytes]]] = {}
        for reason in REFUSALS:
            headers = [(b"content-type", content_type)]
            computed = (
                retry_after is not None
                or (reason == "deadline" and handover_wait is not None)
                or reason == "budget"  # the budget's own wait, at each refusal
            )
            if not self.episode and not computed:
                headers += self._retry_after_headers(retry_after_seconds(route, reason))
            if close_connection:  # a client that retries at once pays a reconnect
                headers.append((b"connection", b"close"))
            self._headers[reason] = headers
        self._budget_fallback = retry_after_seconds(route, "budget")

    def body(
        self, reason: Refusal, request_body: bytes | None = None, *, draining: bool = False
    ) -> bytes:
        """The body for `reason` ("unavailable" with `draining`: the server shuts down); an
        episode body carries the ids of `request_body` (None: not read in full, null ids)."""
        encoded = self._draining if draining and reason == "unavailable" else self._bodies[reason]
        if not self.episode:
            return encoded
        episode_id, task_id = episode_ids(request_body) if request_body else (_NULL, _NULL)
        return b'{"episode_id":%s,"task_id":%s%s' % (episode_id, task_id, encoded)

    async def send(
        self,
        send: Send,
        reason: Refusal,
        request_body: bytes | None = None,
        *,
        draining: bool = False,
        budget_wait: int | None = None,
    ) -> None:
        """Send the whole response for `reason` over ASGI `send`; `budget_wait`: for a
        refusal for the budget, whole seconds until it holds the request (its Retry-After)."""
        body = self.body(reason, request_body, draining=draining)
        # A fresh headers list each time: outer middlewares may append to it in place.
        headers = [*self._headers[reason], (b"content-length", b"%d" % len(body))]
        if reason == "budget" and not self.episode:
            wait = self._budget_fallback if budget_wait is None else budget_wait
            headers += self._retry_after_headers(wait)
        elif self._retry_after is not None:
            headers += self._retry_after_headers(self._retry_after())
        elif reason == "deadline" and self._handover_wait is not None:
            headers += self._handover_retry_after(self._handover_wait())
        status = self._statuses[reason]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _handover_retry_after(self, seconds: float | None) -> list[tuple[bytes, bytes]]:
        """A deadline refusal's Retry-After: `seconds` rounded and clamped to 1..60, or the
        route's fixed rule before the hand-over rate is measured (None)."""
        if seconds is None:
            return self._deadline_retry_after
        return self._retry_after_headers(min(60, max(1, round(seconds))))

    def _retry_after_headers(self, seconds: int) -> list[tuple[bytes, bytes]]:
        headers = [(b"retry-after", b"%d" % seconds)]
        if self._with_ms:
            headers.append((b"retry-after-ms", b"%d" % (seconds * 1000)))
        return headers


async def send_misconfigured(scope: Scope, send: Send) -> None:
    """Answer a request to a misconfigured middleware: 500 (websocket: close 1011), saying
    only that (the details are in the log, not for any client to read)."""
    # Without lifespan there is no start to fail: every request says what is wrong.
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1011, "reason": "misconfigured"})
        return
    # Only that it is misconfigured: the details (the invalid field, the app's routes) are
    # in the log, not for any client to read.
    body = (
        b"gym_concurrency: this server is misconfigured (its concurrency limits do not fit "
        b"the app or are invalid) and refuses every request until that is fixed; the "
        b"server's log (logger gym_concurrency.middleware) says what is wrong.\n"
    )
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def retry_after_seconds(route: RouteLimit, reason: Refusal = "timeout") -> int:
    """`retry_after_seconds`, else the queue timeout rounded up to whole seconds, else 1 (also
    for "auto" where no hand-over rate is measured). A deadline refusal says nothing of when the
    queue frees: never the queue timeout."""
    if isinstance(route.retry_after_seconds, int):
        return route.retry_after_seconds
    if route.queue_timeout_seconds is not None and reason != "deadline":
        return max(1, math.ceil(route.queue_timeout_seconds))
    return 1


def _encoded_body(route: RouteLimit, reason: Refusal, *, draining: bool = False) -> bytes:
    """The encoded body; for an episode, all of it after the ids (`,"result":...}`)."""
    if route.failure == "episode":
        rest = _dumps({"result": None, "failure": _episode_failure(reason, draining)})
        return b"," + rest[1:]
    if route.failure == "openai":
        return _dumps(_openai_body(route, reason, draining))
    return _dumps(_problem_body(route, reason, draining))


def _detail(route: RouteLimit, reason: Refusal, draining: bool) -> str:
    if draining:
        return DRAINING_DETAIL
    limit = f"{route.limit_name!r} (max_concurrent={route.max_concurrent})"
    if route.adaptive is not None:
        bounds = f"{route.adaptive.min_concurrent}..{route.adaptive.max_concurrent}"
        limit = f"{route.limit_name!r} (adaptive, {bounds})"
    if reason == "timeout":
        seconds = route.queue_timeout_seconds
        within = "its queue timeout" if seconds is None else f"{seconds:g} s"
        return f"No slot of limit {limit} became free within {within}."
    if reason == "deadline":
        return (
            f"The request's deadline passed, or could not be met, before a slot of limit "
            f"{limit} became free."
        )
    if reason == "shed":
        return f"Limit {limit} already has {route.max_queue} requests queued."
    if reason == "budget":
        return (
            f"The rate budget of limit {limit} ({_budgets(route)}) would not hold the "
            "request's estimate within the wait allowed; retry after Retry-After."
        )
    if reason == "saturated":
        return f"The engine behind limit {limit} had no room (its queue or cache is full)."
    return f"The shared limit {limit} could not be reached."


def _budgets(route: RouteLimit) -> str:
    sizes = route.budget_sizes()
    return ", ".join(f"{name}_per_minute={size}" for name, size in sizes.items()) or "none"


def _problem_body(route: RouteLimit, reason: Refusal, draining: bool) -> dict[str, Any]:
    return {
        "type": PROBLEM_TYPES[reason],
        "title": PROBLEM_TITLES[reason],
        "status": _STATUS.get(reason, 503),
        "detail": _detail(route, reason, draining),
        "limit_name": route.limit_name,
    }


def _openai_body(route: RouteLimit, reason: Refusal, draining: bool) -> dict[str, Any]:
    return {
        "error": {
            "message": _detail(route, reason, draining),
            # OpenAI's type for a 429 of a rate limit; every other refusal is a 503.
            "type": "rate_limit_error" if reason == "budget" else "server_error",
            "param": None,
            "code": OPENAI_CODES[reason],
        }
    }


def _episode_failure(reason: Refusal, draining: bool) -> dict[str, Any]:
    reason_text = EPISODE_DRAINING if draining else EPISODE_FAILURE_REFUSALS[reason]
    return {"failure_reason": reason_text, "terminal": False, "stage": "admission"}


def episode_ids(request_body: bytes) -> tuple[bytes, bytes]:
    """(episode_id, task_id) of an episode request, each as encoded JSON copied verbatim
    whatever value it is: `task.task_id`, else a top-level `task_id`; `null` where absent or
    the body is not a JSON object."""
    try:
        request = _DECODER.decode(request_body.decode())
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
        return _NULL, _NULL
    if not isinstance(request, dict):
        return _NULL, _NULL
    task = request.get("task")
    task_id = task.get("task_id") if isinstance(task, dict) else None
    if task_id is None:
        task_id = request.get("task_id")
    return _encode_id(request.get("episode_id")), _encode_id(task_id)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _encode_id(value: object) -> bytes:
    if value is None:
        return _NULL
    try:
        return _dumps(value)
    except (ValueError, RecursionError):  # a number too large for a float: inf
        return _NULL


# Made once: json.loads / json.dumps with options build a new decoder / encoder per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _dumps(value: object) -> bytes:
    return _ENCODER.encode(value).encode()
