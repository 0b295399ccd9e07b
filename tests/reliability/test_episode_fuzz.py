"""Fuzzed request bodies on an `episode` route, over a real uvicorn: whatever the client sends
(not JSON, huge, missing or odd ids, wrong types, nested garbage, chunked), a refused request
gets the documented episode failure body, ids echoed only when they are what the contract
says, and no slot leaks.

The expected ids come from this file's own reading of the contract (docs: DESIGN.md,
"Failure responses"), not from the middleware's code: `episode_id` is the body's
`episode_id`, `task_id` is `task.task_id`, else a top-level `task_id`; an id is echoed when it
is a string or an integer, and is null otherwise, when the body is not a JSON object, or
when the body is longer than `max_queued_body_bytes` (docs/failure-responses.md).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits import registered_limits
from tests.servers import UvicornServer, wait_until

MAX_BODY = 16 * 1024
# path -> the failure reason a refused request on it gets (both are held full throughout).
ROUTES = {
    "/episode": "Episode admission queue full",
    "/episode/slow": "Episode admission timed out",
}
EPISODE_KEYS = {"episode_id", "task_id", "result", "failure"}


def episode_app(component: str, release: threading.Event) -> FastAPI:
    """Two episode routes: one that sheds at once (max_queue 0), one whose wait times out."""
    app = FastAPI()

    async def held() -> dict[str, Any]:
        await asyncio.to_thread(release.wait)  # set by the test's thread at the end
        return {"episode_id": None, "task_id": None, "result": {}, "failure": None}

    app.add_api_route("/episode", held, methods=["POST"])
    app.add_api_route("/episode/slow", held, methods=["POST"])
    settings_ = ConcurrencySettings(
        component=component,
        max_queued_body_bytes=MAX_BODY,
        routes=[
            RouteLimit(
                path="/episode", limit_name="shed", max_concurrent=1, max_queue=0, failure="episode"
            ),
            RouteLimit(
                path="/episode/slow",
                limit_name="timeout",
                max_concurrent=1,
                queue_timeout_seconds=0.01,
                failure="episode",
            ),
        ],
    )
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings_)
    return app


def expected_id(value: Any) -> Any:
    """An id is copied verbatim, whatever JSON value it is; one holding a number too large
    for a float (which JSON cannot write back) is null."""
    return None if _has_non_finite(value) else value


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def expected_ids(body: bytes) -> tuple[Any, Any]:
    """(episode_id, task_id) the contract says a refused request with `body` gets back."""
    if len(body) > MAX_BODY:
        return None, None
    try:
        request = json.loads(body, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(request, dict):
        return None, None
    task = request.get("task")
    task_id = task.get("task_id") if isinstance(task, dict) else None
    if task_id is None:
        task_id = request.get("task_id")
    task_id = expected_id(task_id)
    return expected_id(request.get("episode_id")), task_id


# --- bodies -------------------------------------------------------------------------------

ids = st.one_of(
    st.text(max_size=20),
    st.integers(),
    st.integers(-(10**40), 10**40),
    st.booleans(),
    st.none(),
    st.floats(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)


@st.composite
def episode_requests(draw: st.DrawFn) -> dict[str, Any]:
    """A JSON object shaped more or less like NeMo Gym's BaseEpisodeRequest."""
    request: dict[str, Any] = {}
    if draw(st.booleans()):
        request["episode_id"] = draw(ids)
    if draw(st.booleans()):
        request["task_id"] = draw(ids)
    task = draw(
        st.one_of(
            st.none(),
            json_values,
            st.fixed_dictionaries({}, optional={"task_id": ids, "prompt": json_values}),
        )
    )
    if task is not None:
        request["task"] = task
    request.update(
        draw(
            st.dictionaries(st.sampled_from(["input", "x", "Episode_ID"]), json_values, max_size=2)
        )
    )
    return request


def padded(body: bytes, pad: int) -> bytes:
    """`body` with a `pad` key of `pad` bytes added if it is a JSON object (huge bodies)."""
    if not pad or not body.startswith(b"{"):
        return body
    separator = b", " if body != b"{}" else b""
    return body[:-1] + separator + b'"pad": "' + b"x" * pad + b'"}'


# (body, pad): the test pads, so that hypothesis never prints a huge body.
bodies = st.tuples(
    st.one_of(
        episode_requests().map(lambda r: json.dumps(r).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),  # JSON, but maybe not an object
        st.binary(max_size=300),  # not JSON (or, rarely, by chance)
        st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.just(b""),
    ),
    st.sampled_from([0, 0, 0, 0, MAX_BODY - 300, MAX_BODY * 3, 600_000]),
)


# --- the test -----------------------------------------------------------------------------


@pytest.fixture
def held_server() -> Iterator[tuple[UvicornServer, dict[str, MeteredSemaphore]]]:
    """The app on uvicorn with both routes' single slot held by a request until the end."""
    component = f"episode_fuzz_{uuid.uuid4().hex[:8]}"
    release = threading.Event()
    with UvicornServer(episode_app(component, release)) as server:
        limits = {str(s.limit_name): s for s in registered_limits() if s.component == component}
        holders = [
            threading.Thread(
                target=httpx.post,
                args=(server.url + path,),
                kwargs={"content": b"{}", "timeout": 120},
            )
            for path in ROUTES
        ]
        for holder in holders:
            holder.start()
        wait_until(lambda: all(s.active == 1 for s in limits.values()), what="slots held")
        try:
            yield server, limits
        finally:
            release.set()
            for holder in holders:
                holder.join(timeout=10)


def check_refusal(response: httpx.Response, body: bytes, reason: str) -> None:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    assert set(answer) == EPISODE_KEYS, answer
    assert answer["result"] is None
    assert answer["failure"] == {"failure_reason": reason, "terminal": False, "stage": "admission"}
    assert (answer["episode_id"], answer["task_id"]) == expected_ids(body), body[:200]


@pytest.mark.slow
def test_fuzzed_episode_bodies_get_the_documented_failure_and_leak_no_slot(
    held_server: tuple[UvicornServer, dict[str, MeteredSemaphore]],
):
    server, limits = held_server
    sent = {path: 0 for path in ROUTES}

    with httpx.Client(base_url=server.url, timeout=10) as client:

        @settings(
            max_examples=400,
            deadline=None,
            print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(body_and_pad=bodies, path=st.sampled_from(list(ROUTES)), chunked=st.booleans())
        def refused(body_and_pad: tuple[bytes, int], path: str, chunked: bool) -> None:
            body = padded(*body_and_pad)
            content: Any = iter([body[:7], body[7:]]) if chunked else body
            response = client.post(
                path, content=content, headers={"content-type": "application/json"}
            )
            sent[path] += 1
            check_refusal(response, body, ROUTES[path])

        refused()

    shed, timeout = limits["shed"], limits["timeout"]
    assert (shed.admission_shed, shed.admission_timeouts) == (sent["/episode"], 0)
    assert (timeout.admission_timeouts, timeout.admission_shed) == (sent["/episode/slow"], 0)
    for semaphore in limits.values():
        assert (semaphore.active, semaphore.queue_depth, semaphore.admission_cancelled) == (1, 0, 0)


@pytest.mark.parametrize("size", [MAX_BODY + 1, MAX_BODY * 3])
def test_a_body_longer_than_the_bound_gets_null_ids(
    held_server: tuple[UvicornServer, dict[str, MeteredSemaphore]], size: int
):
    # Such a body arrives in the one server message that crosses the bound and completes it
    # (the case middleware/body.py once echoed ids for), not in pieces that stop at the bound.
    server, _ = held_server
    body = json.dumps({"episode_id": "e1", "task_id": "t1", "pad": "x" * size}).encode()
    answer = httpx.post(server.url + "/episode", content=body, timeout=10).json()
    assert (answer["episode_id"], answer["task_id"]) == (None, None)


def test_the_oracle_reads_the_contract():
    # A check on this file's expectations, so the fuzzing compares against the right thing.
    assert expected_ids(b'{"episode_id": "e1", "task": {"task_id": 7}}') == ("e1", 7)
    assert expected_ids(b'{"episode_id": 3, "task_id": "t"}') == (3, "t")
    assert expected_ids(b'{"episode_id": true, "task": {"task_id": 1.5}, "task_id": "t"}') == (
        True,
        1.5,
    )  # verbatim, whatever JSON value
    assert expected_ids(b'{"episode_id": {"rollout_id": "r", "attempt": 1}, "task": {}}') == (
        {"rollout_id": "r", "attempt": 1},
        None,
    )
    assert expected_ids(b'{"episode_id": 1e999, "task_id": [1e999]}') == (None, None)
    assert expected_ids(b'{"episode_id": NaN}') == (None, None)
    assert expected_ids(b'{"task": "t1"}') == (None, None)
    assert expected_ids(b'["e1"]') == (None, None)
    assert expected_ids(b"\xff{") == (None, None)
    assert expected_ids(json.dumps({"episode_id": "e", "pad": "x" * MAX_BODY}).encode()) == (
        None,
        None,
    )
