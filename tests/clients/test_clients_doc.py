"""docs/clients.md as printed: every python block runs, and each function it defines makes a
call through its limit against a real upstream that answers 429 with Retry-After first."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from gym_concurrency.middleware import ConcurrencySettings

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits import FlowStatistics
from tests.clients.upstream import Reply, Upstream
from tests.servers import UvicornServer, eventually
from tests.shared.redis_server import RedisServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def run(marker: str, **names: Any) -> dict[str, Any]:
    """The namespace of the doc's block containing `marker`, run with `names` defined."""
    (code,) = [block for block in BLOCKS if marker in block]
    namespace: dict[str, Any] = dict(names)
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


def test_every_block_has_a_test() -> None:
    markers = [
        "judge_by_hand",
        "async def judge(",
        "async def grade(",
        "grade_with_aiohttp",
        "weighed_judge",
        "shared_judge",
        "outbound_refused",
        "adaptive_limit",
        "limited_client(request.app",
        "gentle",
        "forwarding_judge",
    ]
    assert len(BLOCKS) == len(markers)
    for block in BLOCKS:
        assert sum(marker in block for marker in markers) == 1, block


def rate_limited_once(upstream: Upstream) -> None:
    upstream.script("/v1/chat/completions", Reply(429, {"retry-after-ms": "200"}))


async def test_the_hand_rolled_semaphore(upstream: Upstream) -> None:
    import httpx

    doc = run("judge_by_hand")
    async with httpx.AsyncClient(base_url=upstream.url) as client:
        assert (await doc["judge_by_hand"](client, "2+2?"))["choices"]


async def test_the_limited_httpx_client_retries_the_429(upstream: Upstream) -> None:
    rate_limited_once(upstream)
    doc = run("async def judge(", JUDGE_URL=upstream.url)
    answer = await doc["judge"]("2+2?")
    assert answer["choices"][0]["message"]["content"] == "ok"
    assert len(upstream.attempts()) == 2
    assert upstream.gaps("/v1/chat/completions")[0] >= 0.2
    limit: MeteredSemaphore = doc["judge_limit"]
    assert (limit.limit, limit.active, limit.limit_name) == (64, 0, "judge")
    await doc["judge_client"].aclose()


async def test_the_openai_client(upstream: Upstream) -> None:
    rate_limited_once(upstream)
    doc = run("async def grade(", JUDGE_URL=upstream.url)
    assert await doc["grade"]("4") == "ok"
    assert len(upstream.attempts()) == 2  # one retry, by the transport alone
    assert doc["judge"].max_retries == 0
    await doc["judge"].close()


async def test_aiohttp(upstream: Upstream) -> None:
    rate_limited_once(upstream)
    doc = run("grade_with_aiohttp", JUDGE_URL=upstream.url)
    assert (await doc["grade_with_aiohttp"]("4"))["choices"]
    assert len(upstream.attempts()) == 2
    assert doc["judge_middleware"].limit.active == 0


async def test_weights_and_flows(upstream: Upstream) -> None:
    rate_limited_once(upstream)
    upstream.script("/v1/chat/completions", Reply(delay=0.3))
    doc = run("weighed_judge", JUDGE_URL=upstream.url)
    limit: MeteredSemaphore = doc["tokens_limit"]
    grading = asyncio.create_task(doc["grade_fairly"]("math", "4"))
    await eventually(lambda: upstream.answering(2), "the retry to reach the upstream")
    # "Grade: 4" and the role "user": 12 characters, 3 tokens; and max_tokens 256.
    assert limit.flow_statistics() == [FlowStatistics("math", 3 + 256, 0, 0)]
    assert await grading == "ok"
    assert len(upstream.attempts()) == 2
    assert (limit.active, limit.flow_statistics()) == (0, [])
    await doc["weighed_judge"].close()


async def test_one_limit_across_replicas(upstream: Upstream, redis_server: RedisServer) -> None:
    rate_limited_once(upstream)
    doc = run("shared_judge", JUDGE_URL=upstream.url, REDIS_URL=redis_server.url)
    client = doc["shared_client"]
    response = await client.post("/v1/chat/completions", json={"model": "judge"})
    assert response.status_code == 200
    limit = doc["shared_judge"]
    assert (limit.scope, limit.limit, limit.active) == ("global", 64, 0)
    await client.aclose()
    await limit.close()


async def test_the_adaptive_limit(upstream: Upstream) -> None:
    rate_limited_once(upstream)
    doc = run("adaptive_limit", JUDGE_URL=upstream.url)
    client = doc["adaptive_client"]
    assert (await client.post("/v1/chat/completions", json={})).status_code == 200
    limiter = client._transport.calls.limiter
    assert limiter is not None
    assert (limiter.controller.min_limit, limiter.controller.max_limit) == (4, 256)
    await client.aclose()


def test_the_budget_examples() -> None:
    doc = run("gentle")
    assert doc["gentle"].budget_ratio == pytest.approx(0.1)
    assert doc["patient"].deadline_seconds == 600


def test_the_settings_file(tmp_path: Path) -> None:
    (yaml_block,) = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    path = tmp_path / "concurrency.yaml"
    path.write_text(yaml_block)
    judge, model = ConcurrencySettings.from_file(path).clients
    assert (judge.limit_name, judge.timeout_seconds) == ("judge", 60)
    assert judge.retry is not None
    assert judge.retry.deadline_seconds == 300
    assert model.adaptive is not None


async def test_the_configured_client_in_a_route(upstream: Upstream) -> None:
    import httpx

    rate_limited_once(upstream)
    doc = run("limited_client(request.app", JUDGE_URL=upstream.url)
    with UvicornServer(doc["app"]) as server:
        async with httpx.AsyncClient(base_url=server.url) as caller:
            answer = await caller.post("/verify")
    assert answer.json() == {"judge_status": 200}
    assert len(upstream.attempts()) == 2  # (its client lived on uvicorn's loop, gone with it)


async def test_an_outbound_refusal_is_a_503_with_retry_after_not_a_500(upstream: Upstream) -> None:
    import httpx

    from gym_concurrency.clients import LimitedTransport

    doc = run("outbound_refused")
    app = doc["app"]
    full = MeteredSemaphore(1, component="doc", limit_name="judge_full", max_queue=0)
    assert full.try_acquire()  # every slot taken, nobody may wait: the next call is refused
    judge = httpx.AsyncClient(base_url=upstream.url, transport=LimitedTransport(full))

    @app.post("/verify")
    async def verify() -> dict[str, int]:
        return {"status": (await judge.post("/v1/chat/completions", json={})).status_code}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        refused = await client.post("/verify")
        full.release()
        served = await client.post("/verify")
    assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
    assert "upstream busy" in refused.json()["detail"]
    assert served.json() == {"status": 200}
    await judge.aclose()


async def test_the_forwarded_deadline(upstream: Upstream) -> None:
    from gym_concurrency.deadline import within_deadline

    rate_limited_once(upstream)  # the retry, 0.2 s later, says 0.2 s less
    doc = run("forwarding_judge")
    async with doc["forwarding_judge"](upstream.url) as client:
        with within_deadline(asyncio.get_running_loop().time() + 5.0):  # as a route's deadline
            answer = await client.post("/v1/chat/completions", json={"model": "judge"})
    assert answer.status_code == 200
    first, retry = (int(a.headers["x-envoy-expected-rq-timeout-ms"]) for a in upstream.attempts())
    assert 4000 < first <= 5000
    assert 150 <= first - retry < 1500
