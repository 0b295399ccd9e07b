"""End to end with NeMo Gym 0.7.0's own code on both sides: its rollout collector
(`RolloutCollectionHelper.run_examples`, which builds each /run body with
`_episode_request_body` and sends it with NeMo Gym's aiohttp client) floods a real
`BaseEnvironmentServer` whose `setup_webserver()` app carries our middleware, wrapped as
`SimpleServer.run_webserver` wraps it (its exception BaseHTTPMiddleware and
`ClientDisconnectCancellationMiddleware` outside ours) and served by real uvicorn with NeMo
Gym's httptools protocol. Also what its clients do with a 503: the collector ends the run, the
model client retries after a fixed 0.5 s whatever `Retry-After` says.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import time
from collections import Counter
from typing import Any

import pytest

from tests.nemo_gym.requires import skip_module_without_nemo_gym

skip_module_without_nemo_gym()

from aiohttp import ClientResponseError  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from gym_concurrency.middleware import (  # noqa: E402
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    RouteLimit,
)
from nemo_gym.episode_types import BaseEpisodeResponse  # noqa: E402
from nemo_gym.openai_utils import NeMoGymAsyncOpenAI  # noqa: E402
from nemo_gym.rollout_collection import (  # noqa: E402
    AGENT_REQUEST_FAILED_FAILURE_CLASS,
    ENVIRONMENT_SERVER_FAILURE_CLASS,
    NG_FAILURE_CLASS_KEY,
    NG_TERMINAL_KEY,
    _episode_record,
    _is_episode_response,
    _materialized_taskset,
)
from nemo_gym.server_utils import ClientDisconnectCancellationMiddleware  # noqa: E402

from tests.nemo_gym.environment import (  # noqa: E402
    Collector,
    RequestLedger,
    build_app,
    echo_server,
    episode_row,
    serve,
)
from tests.nemo_gym.stacks import episode_settings, slot_of  # noqa: E402
from tests.registry import limits_of  # noqa: E402
from tests.servers import eventually  # noqa: E402

pytestmark = pytest.mark.usefixtures("nemo_gym_http_client")

# Floods of the flood test. Before the fix, about one flood in ten without a full queue (and
# every flood with one) lost a body; NEMO_GYM_FLOOD_ROUNDS=2000 soaks for longer.
ROUNDS = int(os.environ.get("NEMO_GYM_FLOOD_ROUNDS", "300"))
ROWS_PER_ROUND = 16
IN_FLIGHT = 8  # the collector's own semaphore: a new /run goes out as soon as one returns
ROUND_WITHIN = 5.0  # s: a round takes ~0.1 s; a hung request fails it
# How long each episode runs: mostly short, some long enough to make the queue time out.
RUN_SECONDS = [0.0, 0.0, 0.001, 0.002, 0.004, 0.05]


def middleware_in(app: FastAPI, kind: type) -> Any:
    """The instance of middleware `kind` in the app's built stack."""
    layer: Any = app.middleware_stack
    while layer is not None:
        if isinstance(layer, kind):
            return layer
        layer = getattr(layer, "app", None)
    raise AssertionError(f"no {kind.__name__} in the stack")


def outcome(row: dict[str, Any], result: Any) -> str:
    """What the collector makes of one /run reply, the way its collection loop does."""
    assert _materialized_taskset(row) is not None
    assert _is_episode_response(result), f"not read as an episode reply: {result!r}"
    response = BaseEpisodeResponse.model_validate(result)
    assert response.episode_id.rollout_id == f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"
    assert response.task_id.model_dump() == row["task_id"]
    record = _episode_record(result)
    if response.result is not None:
        assert record["response"] == row["task_input"]["prompt"]
        return "admitted"
    assert record[NG_FAILURE_CLASS_KEY] == ENVIRONMENT_SERVER_FAILURE_CLASS
    assert record[NG_TERMINAL_KEY] is False
    assert record["_ng_failure_stage"] == "admission"
    return {
        "Episode admission timed out": "timeout",
        "Episode admission queue full": "shed",
    }[record["_ng_failure_message"]]


async def test_the_collector_floods_an_environment_server(
    component: str, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING)
    settings = episode_settings(
        component, max_concurrent=2, queue_timeout_seconds=0.03, max_queue=4
    )
    server = echo_server(settings)
    app = build_app(server)
    ledger = RequestLedger(app)
    slot = slot_of  # read after the first request built the limits
    outcomes: Counter[str] = Counter()
    started = time.monotonic()
    with serve(ledger) as uvicorn_server:
        collector = Collector().point_at(uvicorn_server.port)
        for number in range(ROUNDS):
            rng = random.Random(number)
            rows = [
                episode_row(task=task, rollout=number, run_seconds=rng.choice(RUN_SECONDS))
                for task in range(ROWS_PER_ROUND)
            ]
            try:
                results = await collector.collect(
                    rows, within=ROUND_WITHIN, semaphore=asyncio.Semaphore(IN_FLIGHT)
                )
            except TimeoutError:
                sent, answered = ledger.requests, ledger.responses
                pytest.fail(
                    f"flood {number + 1} of {ROUNDS} hung: {sent - answered} of the server's "
                    f"{sent} /run requests so far never got a response within {ROUND_WITHIN} s"
                )
            assert len(results) == ROWS_PER_ROUND
            for row, result in results:
                outcomes[outcome(row, result)] += 1
            limit = slot(component)
            await eventually(
                lambda limit=limit: (limit.active, limit.queue_depth) == (0, 0),
                f"every slot back after flood {number + 1}",
            )
    elapsed = time.monotonic() - started
    total = ROUNDS * ROWS_PER_ROUND
    # Every request reached the server once (the collector retries a dropped connection, so a
    # hidden retry would show here) and every one was answered 200.
    assert (ledger.requests, ledger.responses, ledger.statuses) == (total, total, {200: total})
    assert sum(outcomes.values()) == total
    assert {"admitted", "shed"} <= set(outcomes) <= {"admitted", "timeout", "shed"}, outcomes
    if ROUNDS >= 50:  # long episodes make some queued ones time out
        assert outcomes["timeout"] > 0, outcomes
    # Each admitted episode ran exactly once; no client gave up (NeMo Gym's cancellation
    # middleware counts every disconnect before a response completed).
    assert len(server.episodes_run) == outcomes["admitted"]
    assert len({str(e) for e in server.episodes_run}) == outcomes["admitted"]
    assert middleware_in(app, ClientDisconnectCancellationMiddleware).num_cancelled == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    print(f"\n{ROUNDS} floods of {ROWS_PER_ROUND} in {elapsed:.1f} s: {dict(outcomes)}")


async def test_a_503_on_run_ends_the_collection(component: str):
    # The problem profile answers 503: NeMo Gym's collector raises it (raise_for_status) and,
    # as route_failures_to_sidecar is off by default, the collection ends. Not retried: the
    # server sees each request once.
    settings = ConcurrencySettings(
        component=component,
        routes=[RouteLimit(path="/run", limit_name="episodes", max_concurrent=1, max_queue=0)],
    )
    ledger = RequestLedger(build_app(echo_server(settings)))
    rows = [episode_row(task=task, run_seconds=0.2) for task in range(3)]
    with serve(ledger) as uvicorn_server:
        collector = Collector().point_at(uvicorn_server.port)
        with pytest.raises(ClientResponseError) as raised:
            await collector.collect(rows, within=10)
        assert raised.value.status == 503
        # The two refused were answered 503 at once; the admitted one was still running when
        # the collection ended, and its client is gone.
        await eventually(lambda: ledger.statuses.get(503) == 2, "both refusals answered")
        assert ledger.requests == 3

        # With route_failures_to_sidecar each 503 becomes a failure row that leaves the score.
        results = await collector.collect(
            [episode_row(task=task, rollout=1, run_seconds=0.2) for task in range(3)],
            within=10,
            route_failures_to_sidecar=True,
        )
    failed = [result for _, result in results if NG_FAILURE_CLASS_KEY in result]
    assert len(failed) == 2
    for row in failed:
        assert row[NG_FAILURE_CLASS_KEY] == AGENT_REQUEST_FAILED_FAILURE_CLASS
        assert row["_ng_failure_http_status"] == 503
    assert ledger.requests == 6


async def test_the_model_client_retries_a_503_after_half_a_second_ignoring_retry_after(
    component: str,
):
    # NeMoGymAsyncOpenAI (what NeMo Gym's model servers call an OpenAI-compatible endpoint
    # with) retries 429/502/503/504 after a fixed 0.5 s, max_http_attempts (3) times in all.
    settings = ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path="/v1/chat/completions",
                limit_name="upstream",
                max_concurrent=1,
                max_queue=0,
                failure="openai",
                retry_after_seconds=30,
            )
        ],
    )
    app = FastAPI()
    arrivals: list[float] = []

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> dict[str, Any]:
        await request.body()
        return {"object": "chat.completion", "choices": []}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            arrivals.append(time.monotonic())
        await app(scope, receive, send)

    with serve(timed) as uvicorn_server:
        client = NeMoGymAsyncOpenAI(base_url=uvicorn_server.url + "/v1", api_key="k")
        assert await client.create_chat_completion(model="m", messages=[]) == {
            "object": "chat.completion",
            "choices": [],
        }
        slot = limits_of(component)["upstream"]
        await eventually(lambda: slot.active == 0, "the first call's slot back")
        await slot.acquire()  # the only slot is taken: every attempt is refused at once
        arrivals.clear()
        try:
            with pytest.raises(ClientResponseError) as raised:
                await client.create_chat_completion(model="m", messages=[])
        finally:
            slot.release()
    assert raised.value.status == 503
    assert b"queue_full" in raised.value.response_content
    assert len(arrivals) == 3
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert all(0.45 < gap < 2.0 for gap in gaps), gaps  # 0.5 s each, not Retry-After's 30 s
