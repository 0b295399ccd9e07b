"""The limits NeMo Gym 0.7.0 lacks, added by the opt-in (docs/nemo-gym.md, "Which limits"): the
wheel's own `vllm_model` and `math_with_judge`, run as `gym env start` runs them, against a fake
engine that counts the calls in flight. `upstream_requests` bounds vllm_model's calls to its
engine and refuses past its wait with the model server's 503; `judge_calls` bounds every judge
call of a resources server and turns a wait that runs out into NeMo Gym's masked judge failure;
both are reported like the seed's limits (console lines with its attributes, back to 0)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.nemo_gym.requires import skip_module_without_nemo_gym

skip_module_without_nemo_gym()

from gym_concurrency.middleware.nemo_gym_shipped.added_limits import (  # noqa: E402
    DEFAULT_CONCURRENT_REQUESTS,
    judge_size,
    vllm_size,
)

from tests.nemo_gym.wheel_server import FakeEngine, response_body, wheel_server  # noqa: E402
from tests.servers import UvicornServer, wait_until  # noqa: E402

CALLS = 6  # at once, against a limit of 2 that waits 0.2 s: 2 served, 4 refused
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "2 + 2?"}]}


@pytest.fixture
def engine() -> Iterator[tuple[FakeEngine, str]]:
    fake = FakeEngine(seconds=0.6)
    with UvicornServer(fake.app()) as served:
        yield fake, served.url


async def post_at_once(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return list(await asyncio.gather(*(client.post(url, json=b) for b in bodies)))


def vllm_config(engine_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "base_url": f"{engine_url}/v1",
        "api_key": "none",
        "model": "fake",
        "return_token_id_information": False,
        "uses_reasoning_parser": False,
    } | extra


def test_vllm_model_calls_its_engine_through_upstream_requests(
    engine: tuple[FakeEngine, str], tmp_path: Path
) -> None:
    fake, url = engine
    config = vllm_config(url, max_concurrent_requests=2, upstream_pool_timeout_seconds=0.2)
    with wheel_server("responses_api_models", "vllm_model", "policy", config, {}, tmp_path) as s:
        answers = asyncio.run(post_at_once(f"{s.url}/v1/chat/completions", [CHAT] * CALLS))
        served = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code == 503]
        assert (len(served), len(refused)) == (2, CALLS - 2), [a.text for a in answers]
        for answer in refused:  # the openai profile, as openai_model's refusal
            assert answer.json()["error"]["code"] == "admission_timeout"
            assert answer.headers["retry-after"] == "1"
        assert fake.peak == 2
        assert asyncio.run(post_at_once(f"{s.url}/v1/responses", [{"input": "hi"}]))[
            0
        ].is_success  # the Responses API goes through the same limit
        wait_until(
            lambda: s.lines("upstream_requests")[-1].values["active"] == 0, 10, "active back to 0"
        )
        lines = s.lines("upstream_requests")
    assert {line.label for line in lines} == {("model_server", "upstream_requests", "policy")}
    assert max(line.values["active"] for line in lines) == 2
    assert max(line.values["queue_depth"] for line in lines) >= 1
    assert lines[-1].values == {
        "limit": 2,
        "active": 0,
        "available": 2,
        "queue_depth": 0,
        "admission_timeouts_total": CALLS - 2,
    }


def test_vllm_model_without_a_size_takes_vllms_default_per_engine(
    engine: tuple[FakeEngine, str], tmp_path: Path
) -> None:
    _fake, url = engine
    config = vllm_config(url) | {"base_url": [f"{url}/v1", f"{url}/v1"]}  # two engines
    with wheel_server("responses_api_models", "vllm_model", "policy", config, {}, tmp_path) as s:
        wait_until(lambda: bool(s.lines("upstream_requests")), 10, "its console line")
        assert s.lines("upstream_requests")[0].values["limit"] == 2 * DEFAULT_CONCURRENT_REQUESTS


def verify_body(number: int) -> dict[str, Any]:
    """A wrong boxed answer: the library says 0, so math_with_judge asks its judge (twice)."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"Task {number}"}]},
        "response": response_body("\\boxed{5}"),
        "question": f"Task {number}",
        "expected_answer": "7",
    }


def test_judge_calls_share_one_limit_and_a_wait_past_it_is_a_judge_failure(
    engine: tuple[FakeEngine, str], tmp_path: Path
) -> None:
    fake, url = engine
    host, port = url.removeprefix("http://").split(":")
    judge = {"judge": {"responses_api_models": {"openai_model": {"host": host, "port": int(port)}}}}
    config = {
        "domain": "math",
        "judge_model_server": {"type": "responses_api_models", "name": "judge"},
        "judge_responses_create_params": {"input": []},
        "should_use_judge": True,
        "max_concurrent_judge_calls": 2,
        "judge_pool_timeout_seconds": 0.2,
    }
    with wheel_server("resources_servers", "math_with_judge", "math", config, judge, tmp_path) as s:
        bodies = [verify_body(n) for n in range(CALLS)]
        answers = [a.json() for a in asyncio.run(post_at_once(f"{s.url}/verify", bodies))]
        judged = [a for a in answers if "_ng_failure_class" not in a]
        failed = [a for a in answers if a.get("_ng_failure_class") == "judge_failed"]
        assert len(judged) + len(failed) == CALLS
        assert judged, answers
        assert failed, answers
        assert all(a["reward"] == 1.0 for a in judged)  # the judge said equal
        for answer in failed:  # NeMo Gym's masked row: the failures sidecar, run again on resume
            assert answer["mask_sample"] is True
            assert answer["reward"] == 0.0
            assert "judge_calls" in answer["_ng_failure_judge_error"]
        assert fake.peak == 2  # every judge call of every verify shared the 2 slots
        wait_until(lambda: s.lines("judge_calls")[-1].values["active"] == 0, 10, "back to 0")
        lines = s.lines("judge_calls")
    assert {line.label for line in lines} == {("resources_server", "judge_calls", "math")}
    last = lines[-1].values
    assert (last["limit"], last["active"], last["queue_depth"]) == (2, 0, 0)
    assert last["admission_timeouts_total"] == len(failed)  # one refused call fails its verify


@pytest.mark.parametrize(
    ("raw", "base_urls", "size"),
    [
        ({"max_concurrent_requests": 16}, 1, 16),
        ({"vllm_serve_kwargs": {"max_num_seqs": 256, "data_parallel_size": 4}}, 1, 1024),
        ({}, 3, 3 * DEFAULT_CONCURRENT_REQUESTS),
    ],
)
def test_vllm_sizes(raw: dict[str, Any], base_urls: int, size: int) -> None:
    assert vllm_size(raw, base_urls) == size


class JudgeConfig:
    judge_endpoint_max_concurrency = 12


def test_judge_sizes() -> None:
    assert judge_size(object(), {"max_concurrent_judge_calls": 3}, {}) == 3
    assert judge_size(JudgeConfig(), {}, {"max_concurrent_requests": 5}) == 12
    assert judge_size(object(), {}, {"max_concurrent_requests": 5}) == 5
    assert judge_size(object(), {}, {"base_url": ["a", "b"]}) == 2 * DEFAULT_CONCURRENT_REQUESTS


def test_a_size_that_is_not_a_count_is_named() -> None:
    with pytest.raises(ValueError, match="max_concurrent_judge_calls must be a positive integer"):
        judge_size(object(), {"max_concurrent_judge_calls": "four"}, {})
