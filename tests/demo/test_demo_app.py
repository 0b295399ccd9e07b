"""The demo resources server as a user pokes it: real fake model, real demo, real uvicorn."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from demo_processes import (
    demo,
    example_settings,
    fake_model,
    free_port,
    verifier_processes,
    wait_for,
)

EPISODE = {
    "episode_id": "e-1",
    "task": {"task_id": "t-1", "prompt": "The answer is 42", "expected": "42"},
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(demo URL, demo pid): one verifier at a time, waits 0.5 s for it, killed after 1 s."""
    logs = tmp_path_factory.mktemp("demo-app")
    settings = example_settings(verifier={"max_concurrent": 1, "timeout_seconds": 0.5})
    with (
        fake_model(logs, error_rate=0.0) as upstream,
        demo(logs, upstream, settings=settings, DEMO_VERIFIER_TIMEOUT_SECONDS="1") as (
            url,
            process,
        ),
    ):
        yield url, process.popen.pid


def test_an_episode_succeeds_with_the_reward_and_ids_of_its_request(stack: tuple[str, int]):
    url, _ = stack
    response = httpx.post(f"{url}/run", json=EPISODE, timeout=10)
    assert response.status_code == 200
    assert response.json() == {
        "episode_id": "e-1",
        "task_id": "t-1",
        "failure": None,
        "result": {"reward": 1.0, "response": "The answer is 42"},
    }


def test_a_wrong_answer_gets_reward_zero(stack: tuple[str, int]):
    url, _ = stack
    episode = {"task": {"prompt": "The answer is 41", "expected": "42"}}
    body = httpx.post(f"{url}/run", json=episode, timeout=10).json()
    assert body["result"]["reward"] == 0.0
    assert body["episode_id"] is None
    assert body["task_id"] is None


def test_the_proxy_forwards_openai_chat_completions(stack: tuple[str, int]):
    url, _ = stack
    request = {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}]}
    response = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=10)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"] == {
        "role": "assistant",
        "content": "hello there",
    }


def test_the_upstream_errors_pass_through_the_proxy(stack: tuple[str, int]):
    url, _ = stack
    response = httpx.post(f"{url}/v1/chat/completions", json={"messages": []}, timeout=10)
    assert response.status_code == 422  # the fake model's own validation answer


def test_the_judge_answers_through_the_upstream_model(stack: tuple[str, int]):
    url, _ = stack
    yes = httpx.post(f"{url}/judge", json={"response": "it is 42", "expected": "42"}, timeout=10)
    no = httpx.post(f"{url}/judge", json={"response": "it is 41", "expected": "42"}, timeout=10)
    assert yes.json() == {"verdict": True, "reward": 1.0, "judge_output": "yes"}
    assert no.json()["verdict"] is False


def test_a_verifier_that_runs_too_long_is_killed_and_reports_timeout(stack: tuple[str, int]):
    url, pid = stack
    slow = {"response": "42", "expected": "42", "work_seconds": 30}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{url}/verify", json=slow, timeout=20)
        wait_for(lambda: verifier_processes(pid), 10, "the verifier process to start")
        response = pending.result()
    assert response.status_code == 200
    assert response.json() == {
        "outcome": "timeout",
        "reward": 0.0,
        "matched": False,
        "detail": "verifier did not finish within 1 s",
    }
    assert verifier_processes(pid) == []
    fast = httpx.post(f"{url}/verify", json={"response": "42", "expected": "42"}, timeout=10)
    assert fast.json() == {"outcome": "ok", "reward": 1.0, "matched": True, "detail": None}


def test_a_verifier_waiting_past_its_limit_timeout_gets_503(stack: tuple[str, int]):
    url, _ = stack
    slow = {"response": "42", "expected": "42", "work_seconds": 30}
    with httpx.Client(timeout=20) as client, concurrent.futures.ThreadPoolExecutor(2) as pool:
        holder = pool.submit(client.post, f"{url}/verify", json=slow)
        wait_for(lambda: _limit(url, "verifier")["active"] == 1, 10, "the verifier slot")
        waiter = client.post(f"{url}/verify", json=slow)
        assert holder.result().json()["outcome"] == "timeout"
    assert waiter.status_code == 503
    assert waiter.headers["retry-after"] == "1"
    assert "verifier limit" in waiter.json()["detail"]
    assert _limit(url, "verifier")["timeouts"] >= 1


def _limit(url: str, name: str) -> dict[str, object]:
    limits = httpx.get(f"{url}/concurrency", timeout=5).json()["limits"]
    return next(row for row in limits if row["limit_name"] == name)


def test_bad_input_is_rejected_naming_the_field_and_leaks_no_slot(stack: tuple[str, int]):
    url, _ = stack
    response = httpx.post(f"{url}/run", json={"task": {"prompt": "x"}}, timeout=10)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "task", "expected"]
    not_json = httpx.post(
        f"{url}/run", content=b"{oops", timeout=10, headers={"content-type": "application/json"}
    )
    assert not_json.status_code == 422
    assert _limit(url, "episodes")["active"] == 0


def test_the_status_view_lists_every_configured_limit(stack: tuple[str, int]):
    url, _ = stack
    snapshot = httpx.get(f"{url}/concurrency", timeout=5).json()
    names = {row["limit_name"]: row for row in snapshot["limits"]}
    assert set(names) == {"episodes", "upstream_requests", "verify_requests", "verifier", "judge"}
    assert names["episodes"]["limit"] == 8
    assert names["episodes"]["component"] == "demo_resources_server"
    assert {(op["operation"], op["executor"]) for op in snapshot["operations"]} >= {
        ("verify", "subprocess"),
        ("judge", "inline"),
    }


def test_metrics_are_served_for_prometheus(stack: tuple[str, int]):
    url, _ = stack
    text = httpx.get(f"{url}/metrics", timeout=5).text
    assert (
        'gym_concurrency_limit{nemo_gym_concurrency_component="demo_resources_server"'
        ',nemo_gym_concurrency_limit_name="episodes",nemo_gym_server_name="demo"' in text
    )
    assert "http_server_request_duration_seconds_count{" in text
    assert 'service_name="gym-concurrency-demo"' in text  # target_info: the resource


def test_an_unreachable_upstream_is_a_failure_row_and_a_502(tmp_path: Path):
    with demo(tmp_path, f"http://127.0.0.1:{free_port()}/v1") as (url, _):
        episode = httpx.post(f"{url}/run", json=EPISODE, timeout=10).json()
        request = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
        proxied = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=10)
    assert episode["result"] is None
    assert episode["failure"]["stage"] == "model"
    assert episode["failure"]["terminal"] is False
    assert episode["failure"]["failure_reason"].startswith("upstream model unreachable")
    assert proxied.status_code == 502
    assert proxied.json()["error"]["code"] == "upstream_unavailable"


def test_a_failing_model_is_a_failure_row_a_passed_through_500_and_a_judge_502(tmp_path: Path):
    request = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    with fake_model(tmp_path, error_rate=1.0) as upstream, demo(tmp_path, upstream) as (url, _):
        episode = httpx.post(f"{url}/run", json=EPISODE, timeout=10).json()
        proxied = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=10)
        judged = httpx.post(f"{url}/judge", json={"response": "42", "expected": "42"}, timeout=10)
        snapshot = httpx.get(f"{url}/concurrency", timeout=5).json()
    assert episode["failure"] == {
        "failure_reason": "upstream model answered 500",
        "terminal": False,
        "stage": "model",
    }
    assert proxied.status_code == 500
    assert proxied.json()["error"]["code"] == "fake_error"
    assert judged.status_code == 502
    assert judged.json() == {"detail": "upstream model answered 500"}
    assert all(row["active"] == 0 for row in snapshot["limits"])  # every slot came back
