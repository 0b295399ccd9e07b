"""Every episode failure body the middleware answers, judged by NeMo Gym 0.7.0's own code:
its wire types (`nemo_gym.episode_types.BaseEpisodeResponse`, `EpisodeId`, `TaskId`) and its
rollout collector's parsing (`nemo_gym.rollout_collection._is_episode_response`,
`_episode_record`, `is_terminal_failure`).

The bodies come from the real middleware on a real NeMo Gym environment server's app (built
as `SimpleServer.run_webserver` builds it, see environment.py), called over ASGI in process:
the test holds the only /run slot, then sends the request under test, which times out in the
queue or finds the queue full.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.nemo_gym.requires import skip_module_without_nemo_gym

skip_module_without_nemo_gym()

from nemo_gym.episode_types import BaseEpisodeResponse, EpisodeId, TaskId  # noqa: E402
from nemo_gym.rollout_collection import (  # noqa: E402
    ENVIRONMENT_SERVER_FAILURE_CLASS,
    NG_FAILURE_CLASS_KEY,
    NG_TASK_ID_KEY,
    NG_TERMINAL_KEY,
    _episode_record,
    _episode_request_body,
    _is_episode_response,
    is_terminal_failure,
)

from tests.nemo_gym.environment import EchoResponse, build_app, echo_server, episode_row  # noqa: E402
from tests.nemo_gym.stacks import episode_settings, slot_of  # noqa: E402

REASONS = {
    "timeout": "Episode admission timed out",
    "shed": "Episode admission queue full",
}
NEMO_GYM_REQUEST = _episode_request_body(episode_row(task=42, rollout=3, prompt="2 + 2"))
NEMO_GYM_RETRY = _episode_request_body({**episode_row(task=42, rollout=3), "_ng_attempt_index": 2})
JSON = {"content-type": "application/json"}
ANSWER_WITHIN = 5.0  # s; a refusal is answered at once, or never if its body was lost
# A valid identity, put in place of ids NeMo Gym's types would reject, to check the rest.
SOME_EPISODE_ID = {"rollout_id": "r", "attempt": 0}
SOME_TASK_ID = {"taskset": "t:train", "task_id": "1"}


def dumped(body: Any) -> bytes:
    return json.dumps(body).encode()


# (request body, the episode_id and task_id the failure body must carry)
BODIES: dict[str, tuple[bytes, Any, Any]] = {
    "nemo_gym_object_ids": (
        dumped(NEMO_GYM_REQUEST),
        NEMO_GYM_REQUEST["episode_id"],
        NEMO_GYM_REQUEST["task"]["task_id"],
    ),
    "nemo_gym_retry_attempt_2": (
        dumped(NEMO_GYM_RETRY),
        {"rollout_id": "42-3", "attempt": 2},
        NEMO_GYM_RETRY["task"]["task_id"],
    ),
    "object_ids_unicode_and_extra_keys": (
        dumped(
            {
                "episode_id": {"rollout_id": "r-é", "attempt": 1, "extra": [1, None]},
                "task": {"task_id": {"taskset": "数学:train", "task_id": "7"}},
            }
        ),
        {"rollout_id": "r-é", "attempt": 1, "extra": [1, None]},
        {"taskset": "数学:train", "task_id": "7"},
    ),
    "string_ids": (dumped({"episode_id": "e1", "task": {"task_id": "t1"}}), "e1", "t1"),
    "integer_and_list_ids": (dumped({"episode_id": 7, "task": {"task_id": [1, "a"]}}), 7, [1, "a"]),
    "top_level_task_id": (dumped({"episode_id": "e2", "task_id": {"id": 5}}), "e2", {"id": 5}),
    "without_ids": (dumped({"task": {"prompt": "no ids here"}}), None, None),
    "json_but_not_an_object": (dumped([{"episode_id": "e3"}]), None, None),
    "not_json": (b"episode_id=e4&task_id=t4", None, None),
    "not_utf8": (b'{"episode_id": "\xff"}', None, None),
    "empty": (b"", None, None),
}


@pytest.fixture
async def refuse(component: str) -> AsyncIterator[Any]:
    """refuse(reason, body, chunks=1) -> the refusal the middleware answers for `body` sent to
    a NeMo Gym environment server whose only /run slot the test holds."""
    apps: dict[str, Any] = {}
    held = []

    async def send(reason: str, body: bytes, chunks: int = 1) -> httpx.Response:
        if reason not in apps:
            name = f"{component}_{reason}"
            settings = (
                episode_settings(name, queue_timeout_seconds=0.02)
                if reason == "timeout"
                else episode_settings(name, max_queue=0)
            )
            app = build_app(echo_server(settings))
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://t", headers=JSON
            )
            warm = await client.post("/run", content=dumped(NEMO_GYM_REQUEST))  # builds the table
            assert warm.status_code == 200, warm.text
            slot = slot_of(name)
            await slot.acquire()  # the test holds the only slot from here on
            held.append(slot)
            apps[reason] = client
        size = -(-len(body) // chunks) or 1

        async def pieces() -> AsyncIterator[bytes]:
            for start in range(0, len(body), size):
                yield body[start : start + size]

        content: Any = body if chunks == 1 else pieces()
        try:
            async with asyncio.timeout(ANSWER_WITHIN):
                return await apps[reason].post("/run", content=content)
        except TimeoutError:
            raise AssertionError(f"no answer to a refusal within {ANSWER_WITHIN} s") from None

    yield send
    for slot in held:
        slot.release()
    for client in apps.values():
        await client.aclose()


def cases() -> Iterator[Any]:
    for reason in REASONS:
        for name in BODIES:
            yield pytest.param(reason, name, id=f"{reason}-{name}")


@pytest.mark.parametrize(("reason", "name"), list(cases()))
async def test_failure_body_is_nemo_gyms_episode_response(refuse: Any, reason: str, name: str):
    body, episode_id, task_id = BODIES[name]
    reply = await refuse(reason, body)
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/json"
    failure = reply.json()
    # The identity is the request's, copied verbatim (objects stay objects, key order kept).
    assert failure["episode_id"] == episode_id
    assert failure["task_id"] == task_id
    assert json.dumps(failure["episode_id"]) == json.dumps(episode_id)
    assert failure["result"] is None
    assert failure["failure"] == {
        "failure_reason": REASONS[reason],
        "terminal": False,
        "stage": "admission",
    }
    # NeMo Gym's own type: forbids extra keys (also in failure), needs exactly one of
    # result/failure, and object identities. Where the request's ids are not NeMo Gym's
    # objects, every other part of the body must still validate.
    objects = isinstance(episode_id, dict) and isinstance(task_id, dict)
    valid_identity = objects and name != "object_ids_unicode_and_extra_keys"  # extra: forbidden
    if valid_identity:
        response = BaseEpisodeResponse.model_validate(failure)
        assert response.episode_id == EpisodeId.model_validate(episode_id)
        assert response.task_id == TaskId.model_validate(task_id)
        assert EchoResponse.model_validate(failure).failure == response.failure
    else:
        BaseEpisodeResponse.model_validate(
            {**failure, "episode_id": SOME_EPISODE_ID, "task_id": SOME_TASK_ID}
        )


@pytest.mark.parametrize(("reason", "name"), list(cases()))
async def test_the_collector_reads_a_non_terminal_admission_failure(
    refuse: Any, reason: str, name: str
):
    body, episode_id, task_id = BODIES[name]
    failure = (await refuse(reason, body)).json()
    # The collector's gate (rollout_collection.py, collection loop): a reply to an episode
    # request is parsed as one only when both identities are objects.
    assert _is_episode_response(failure) is (
        isinstance(episode_id, dict) and isinstance(task_id, dict)
    )
    record = _episode_record(failure)
    assert record == {
        NG_TASK_ID_KEY: task_id,
        NG_FAILURE_CLASS_KEY: ENVIRONMENT_SERVER_FAILURE_CLASS,
        NG_TERMINAL_KEY: False,
        "_ng_failure_message": REASONS[reason],
        "_ng_failure_stage": "admission",
    }
    # Resume retries it: not terminal under either retry contract.
    assert not is_terminal_failure(record)
    assert not is_terminal_failure(record, retry_terminal_timeouts=True)


@pytest.mark.parametrize("reason", REASONS)
@pytest.mark.parametrize("chunks", [2, 5])
async def test_a_body_in_several_chunks_keeps_its_ids(refuse: Any, reason: str, chunks: int):
    reply = await refuse(reason, dumped(NEMO_GYM_REQUEST), chunks=chunks)
    response = BaseEpisodeResponse.model_validate(reply.json())
    assert response.episode_id.model_dump() == NEMO_GYM_REQUEST["episode_id"]
    assert response.task_id.model_dump() == NEMO_GYM_REQUEST["task"]["task_id"]
    assert _is_episode_response(reply.json())


async def test_nemo_gyms_own_admission_answers_the_same_failure(component: str):
    # BaseEnvironmentServer.run_request's own admission (max_concurrent_episodes with
    # queue_timeout_seconds) answers this body on a timeout; the episode profile answers the
    # same, so a collector cannot tell which of the two refused it.
    from nemo_gym.base_environment_server import BaseEnvironmentServerConfig

    from tests.nemo_gym.environment import EchoEnvironmentServer, server_client

    settings = episode_settings(component, queue_timeout_seconds=0.02)
    own = EchoEnvironmentServer(
        config=BaseEnvironmentServerConfig(
            host="127.0.0.1",
            port=0,
            entrypoint="app.py",
            name="own_admission",
            cleanup_timeout_seconds=5,
            max_concurrent_episodes=1,
            queue_timeout_seconds=0.02,
        ),
        server_client=server_client(),
        concurrency=settings.model_copy(update={"routes": []}),
    )
    assert own._admission is not None
    await own._admission.acquire()  # hold NeMo Gym's own only slot
    transport = httpx.ASGITransport(app=build_app(own))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        nemo_gyms = (await client.post("/run", json=NEMO_GYM_REQUEST)).json()
    ours = (await _refused_by_us(component, "timeout")).json()
    assert ours == nemo_gyms


async def _refused_by_us(component: str, reason: str) -> httpx.Response:
    name = f"{component}_ours"
    app = build_app(echo_server(episode_settings(name, queue_timeout_seconds=0.02)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.post("/run", json=NEMO_GYM_REQUEST)).status_code == 200
        slot = slot_of(name)
        await slot.acquire()
        try:
            return await c.post("/run", json=NEMO_GYM_REQUEST)
        finally:
            slot.release()
