"""The body race of issue 9, reproduced step by step in process, behind every outer middleware
of the matrix (NeMo Gym's only on 3.13).

One /run slot, held by the test. Request B waits for it while reading its client, and B's
whole body reaches the server `offset` event-loop steps before (or after) the moment that
decides B: the slot's release (B admitted), B's queue timeout (B refused), or B's own arrival
at a full queue (B refused at once). Whatever the offset, B must get its answer: the
admitted handler its whole body, a refusal its ids. Behind an outer BaseHTTPMiddleware a
receive in flight that is cancelled at that moment loses the message Starlette already took
from the server; the connection here is cancel-safe like uvicorn's, so only the middleware
under test can lose it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.nemo_gym.requires import needs_nemo_gym
from tests.nemo_gym.stacks import (
    NEEDS_NEMO_GYM,
    OUTER_MIDDLEWARES,
    Connection,
    episode_settings,
    limited_app,
    slot_of,
    steps,
    until,
    warm_up,
)

EPISODE_ID = {"rollout_id": "7-0", "attempt": 0}
TASK_ID = {"taskset": "echo:train", "task_id": "7"}
BODY = json.dumps(
    {"episode_id": EPISODE_ID, "task": {"task_id": TASK_ID, "task_input": {"prompt": "p"}}}
).encode()
# Refusals carry string ids here, which the middleware kept even before it kept objects, so
# these tests see only the race (tests/nemo_gym/test_episode_bodies.py judges the ids).
REFUSED_BODY = json.dumps({"episode_id": "7-0", "task": {"task_id": "7"}}).encode()
ANSWER_WITHIN = 1.0  # s: every answer here is due within milliseconds

# Where B's body arrives, in loop steps: > 0 before the deciding moment, < 0 after it.
ADMISSION_OFFSETS = range(-3, 9)
FULL_QUEUE_OFFSETS = range(-1, 6)  # -1: the body is there before B's app is called
TIMEOUT_OFFSETS = range(0, 6)  # after B's queue wait ended (it ends on the loop's timer)


def stacks() -> Iterator[Any]:
    for outer in OUTER_MIDDLEWARES:
        marks = [needs_nemo_gym] if outer in NEEDS_NEMO_GYM else []
        yield pytest.param(outer, marks=marks, id=outer)
    # The real thing: a NeMo Gym BaseEnvironmentServer app built as run_webserver builds it.
    yield pytest.param("nemo_gym_run_webserver", marks=[needs_nemo_gym], id="nemo_gym_webserver")


def make_app(outer: str, component: str, **limit: Any) -> Any:
    settings = episode_settings(component, **limit)
    if outer == "nemo_gym_run_webserver":
        from tests.nemo_gym.environment import build_app, echo_server

        return build_app(echo_server(settings))
    return limited_app(settings, outer)[0]


def admitted_whole(connection: Connection) -> bool:
    """B was admitted and its handler read the whole body (the echo app echoes it; NeMo Gym's
    /run parsed it as an EchoRequest and echoes its prompt)."""
    if connection.status != 200:
        return False
    result = connection.json().get("result") or {}
    return result.get("body") == BODY.decode() or result.get("response") == "p"


def refused_with_ids(connection: Connection, reason: str) -> bool:
    """B got the episode failure for `reason`, with the ids of its whole body."""
    if connection.status != 200:
        return False
    body = connection.json()
    return (
        body.get("episode_id") == "7-0"
        and body.get("task_id") == "7"
        and body.get("failure", {}).get("failure_reason") == reason
    )


async def finish(connection: Connection, task: asyncio.Task[None]) -> str | None:
    """Wait for B's answer; None if it came, else what happened. Then let B's client leave."""
    try:
        await asyncio.wait_for(connection.complete.wait(), ANSWER_WITHIN)
        problem = None
    except TimeoutError:
        problem = f"no answer within {ANSWER_WITHIN} s (sent: {connection.sent})"
    connection.disconnect()
    try:
        await asyncio.wait_for(task, 5)
    except Exception as error:  # the app may fail once its client is gone; the answer counts
        problem = problem or f"the app raised {error!r}"
    return problem


@pytest.mark.parametrize("outer", list(stacks()))
async def test_admitted_as_its_body_arrives(outer: str, component: str):
    app = make_app(outer, component)
    await warm_up(app, BODY)
    slot = slot_of(component)
    lost = {}
    for offset in ADMISSION_OFFSETS:
        await slot.acquire()  # the test holds the only slot
        connection = Connection(BODY)
        task = connection.run(app)
        await until(lambda: slot.queue_depth == 1)
        await steps(10)  # B is reading its client while it waits
        if offset >= 0:
            connection.deliver_body()
            await steps(offset)
            slot.release()
        else:
            slot.release()
            await steps(-offset)
            connection.deliver_body()
        problem = await finish(connection, task)
        if problem is None and not admitted_whole(connection):
            problem = f"answered {connection.status} {connection.response_body[:200]!r}"
        if problem is not None:
            lost[offset] = problem
        await asyncio.sleep(0.01)
        assert (slot.active, slot.queue_depth) == (0, 0), f"offset {offset}: slot not back"
    assert not lost, f"B's body lost behind {outer} at offsets {sorted(lost)}: {lost}"


@pytest.mark.parametrize("outer", list(stacks()))
async def test_refused_at_a_full_queue_as_its_body_arrives(outer: str, component: str):
    app = make_app(outer, component, max_queue=0)
    await warm_up(app, BODY)
    slot = slot_of(component)
    unanswered = {}
    for offset in FULL_QUEUE_OFFSETS:
        await slot.acquire()
        connection = Connection(REFUSED_BODY)
        if offset < 0:
            connection.deliver_body()
        task = connection.run(app)
        if offset >= 0:
            await steps(offset)
            connection.deliver_body()
        problem = await finish(connection, task)
        if problem is None and not refused_with_ids(connection, "Episode admission queue full"):
            problem = f"answered {connection.status} {connection.response_body[:200]!r}"
        if problem is not None:
            unanswered[offset] = problem
        slot.release()
        await asyncio.sleep(0.01)
        assert (slot.active, slot.queue_depth) == (0, 0), f"offset {offset}: slot not back"
    assert not unanswered, (
        f"full-queue refusal behind {outer} at offsets {sorted(unanswered)}: {unanswered}"
    )


@pytest.mark.parametrize("outer", list(stacks()))
async def test_refused_at_the_queue_timeout_as_its_body_arrives(outer: str, component: str):
    app = make_app(outer, component, queue_timeout_seconds=0.02)
    await warm_up(app, BODY)
    slot = slot_of(component)
    unanswered = {}
    for offset in TIMEOUT_OFFSETS:
        await slot.acquire()
        connection = Connection(REFUSED_BODY)
        task = connection.run(app)
        await until(lambda: slot.queue_depth == 1)
        await until(lambda: slot.queue_depth == 0)  # the wait ended, on the loop's timer
        await steps(offset)
        connection.deliver_body()
        problem = await finish(connection, task)
        if problem is None and not refused_with_ids(connection, "Episode admission timed out"):
            problem = f"answered {connection.status} {connection.response_body[:200]!r}"
        if problem is not None:
            unanswered[offset] = problem
        slot.release()
        await asyncio.sleep(0.01)
        assert (slot.active, slot.queue_depth) == (0, 0), f"offset {offset}: slot not back"
    assert not unanswered, (
        f"timeout refusal behind {outer} at offsets {sorted(unanswered)}: {unanswered}"
    )


# The moment a queue wait times out is the loop's timer, not a step the test can count to:
# sweep the body's arrival across it instead, every 20 µs from 0.3 ms before the deadline to
# 0.3 ms after (a loop step of this stack takes 10-40 µs, so some arrivals land in any window
# a few steps wide).
SWEEP_SECONDS = [delta * 1e-6 for delta in range(-300, 301, 20)]


@pytest.mark.parametrize("outer", list(stacks()))
async def test_refused_at_the_queue_timeout_swept_around_the_deadline(outer: str, component: str):
    timeout = 0.005
    app = make_app(outer, component, queue_timeout_seconds=timeout)
    await warm_up(app, BODY)
    slot = slot_of(component)
    loop = asyncio.get_running_loop()
    unanswered = {}
    for delta in SWEEP_SECONDS:
        await slot.acquire()
        connection = Connection(REFUSED_BODY)
        task = connection.run(app)
        await until(lambda: slot.queue_depth == 1)
        deadline = loop.time() + timeout  # just after the middleware's own deadline
        await until(lambda d=deadline + delta: loop.time() >= d)
        connection.deliver_body()
        problem = await finish(connection, task)
        if problem is None and not refused_with_ids(connection, "Episode admission timed out"):
            problem = f"answered {connection.status} {connection.response_body[:200]!r}"
        if problem is not None:
            unanswered[round(delta * 1e6)] = problem
        slot.release()
        await asyncio.sleep(0.002)
        assert (slot.active, slot.queue_depth) == (0, 0), f"delta {delta}: slot not back"
    assert not unanswered, (
        f"timeout refusal behind {outer} with the body arriving at these µs from the deadline "
        f"{sorted(unanswered)}: {unanswered}"
    )
