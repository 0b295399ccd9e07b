"""Overload the demo and read what happened the way an operator would: through a real
Prometheus scraping the demo's /metrics, and from the failure bodies clients got."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from typing import Any

import httpx
import pytest
from dashboard import dashboard_metric_names
from demo_processes import REPO, demo, example_settings, fake_model, prometheus, wait_for
from failure_docs import matching_documented_body

SHED = "gym_concurrency_admission_shed_total"
EPISODES = '{nemo_gym_concurrency_limit_name="episodes"}'
LOAD_TIMEOUT = "200 episode failure: Episode admission timed out"
LOAD_OK = "200 ok"
LOAD_QUEUE_FULL = "503 openai error: queue_full"


def query(prometheus_url: str, promql: str) -> float | None:
    """The single value of an instant query, or None when it has no sample."""
    response = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": promql}, timeout=5)
    result = response.json()["data"]["result"]
    assert len(result) <= 1, f"{promql} matched {len(result)} series: {result}"
    return float(result[0]["value"][1]) if result else None


def reaches(prometheus_url: str, promql: str, expected: float) -> bool:
    return query(prometheus_url, promql) == expected


def load(base_url: str, path: str, requests: int) -> subprocess.Popen[str]:
    """The demo's own bounded load script, flooding `path` with `requests` at once."""
    argv = [
        sys.executable,
        "-m",
        "examples.fastapi_app.load",
        "--base-url",
        base_url,
        "--path",
        path,
        "--requests",
        str(requests),
        "--concurrency",
        str(requests),
        "--deadline",
        "30",
        "--json",
    ]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)


def summary_of(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=40)
    assert process.returncode == 0
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.fixture(scope="module")
def overloaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the demo (2 episodes at a time, 2.5 s queue timeout, 1 s model) under Prometheus,
    flood three limits at once, and return what the clients saw and Prometheus's URL."""
    logs = tmp_path_factory.mktemp("prometheus")
    settings = example_settings(
        episodes={"max_concurrent": 2, "queue_timeout_seconds": 2.5},
        upstream_requests={"max_concurrent": 2, "queue_timeout_seconds": 2.5, "max_queue": 2},
        verify_requests={"max_concurrent": 1, "queue_timeout_seconds": 2.5, "max_queue": 0},
    )
    with (
        fake_model(logs, latency=1.0) as upstream,
        demo(logs, upstream, settings=settings) as (url, _),
        prometheus(logs, url.removeprefix("http://")) as prom,
    ):
        wait_for(lambda: reaches(prom, 'up{job="demo"}', 1.0), 20, "the first scrape")
        episodes = load(url, "/run", 24)
        chats = load(url, "/v1/chat/completions", 12)
        slow_verify = {"response": "42", "expected": "42", "work_seconds": 1.0}
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            verifies = list(
                pool.map(
                    lambda _: httpx.post(f"{url}/verify", json=slow_verify, timeout=20), range(6)
                )
            )
        yield {
            "prometheus": prom,
            "episodes": summary_of(episodes),
            "chats": summary_of(chats),
            "verifies": verifies,
        }


def test_the_episode_flood_timed_out_in_admission(overloaded: dict[str, Any]):
    counts = overloaded["episodes"]["counts"]
    assert set(counts) == {LOAD_OK, LOAD_TIMEOUT}, counts
    # 2 run at a time for ~1 s each, and a wait is bounded at 2.5 s: 4 to 8 get through.
    assert 4 <= counts[LOAD_OK] <= 8, counts


def test_prometheus_saw_the_limit_full_and_the_queue_deep(overloaded: dict[str, Any]):
    prom = overloaded["prometheus"]
    assert query(prom, f"max_over_time(gym_concurrency_limit{EPISODES}[5m])") == 2
    assert query(prom, f"max_over_time(gym_concurrency_active{EPISODES}[5m])") == 2
    assert query(prom, f"min_over_time(gym_concurrency_available{EPISODES}[5m])") == 0
    # 22 queued at first; a 1 s scrape sees at least half of them.
    deepest = query(prom, f"max_over_time(gym_concurrency_queue_depth{EPISODES}[5m])")
    assert deepest is not None
    assert deepest >= 11


def test_prometheus_counts_every_admission_timeout_the_clients_got(overloaded: dict[str, Any]):
    prom = overloaded["prometheus"]
    timeouts = overloaded["episodes"]["counts"][LOAD_TIMEOUT]
    wait_for(
        lambda: reaches(prom, f"gym_concurrency_admission_timeouts_total{EPISODES}", timeouts),
        15,
        f"{timeouts} timeouts in Prometheus",
    )
    waits = (
        "gym_concurrency_queue_wait_duration_ms_milliseconds_count{"
        'nemo_gym_concurrency_limit_name="episodes",'
        'nemo_gym_concurrency_admission_outcome="timeout"}'
    )
    # The middleware records a wait as its request resumes, after the limit counted the
    # timeout: a scrape between the two reads the counter ahead. The next one has both.
    wait_for(lambda: reaches(prom, waits, timeouts), 15, f"{timeouts} timed-out waits")
    # Each timed-out wait lasted the 2.5 s timeout (generous bounds: scheduling only adds).
    mean_wait = query(prom, waits.replace("_count", "_sum")) / timeouts  # type: ignore[operator]
    assert 2400 <= mean_wait <= 4000


def test_prometheus_counts_every_request_shed_from_a_full_queue(overloaded: dict[str, Any]):
    prom = overloaded["prometheus"]
    shed = overloaded["chats"]["counts"].get(LOAD_QUEUE_FULL, 0)
    assert 6 <= shed <= 8, overloaded["chats"]["counts"]  # 2 run, 2 wait, the rest are shed
    chats = f'{SHED}{{nemo_gym_concurrency_limit_name="upstream_requests"}}'
    wait_for(lambda: reaches(prom, chats, shed), 15, f"{shed} shed chats in Prometheus")
    refused = sum(r.status_code == 503 for r in overloaded["verifies"])
    assert refused >= 3
    verify = f'{SHED}{{nemo_gym_concurrency_limit_name="verify_requests"}}'
    wait_for(lambda: reaches(prom, verify, refused), 15, f"{refused} shed verifies")


def test_the_failure_bodies_are_the_documented_ones(overloaded: dict[str, Any]):
    episode = overloaded["episodes"]["samples"][LOAD_TIMEOUT]
    chat = overloaded["chats"]["samples"][LOAD_QUEUE_FULL]
    problem = next(r for r in overloaded["verifies"] if r.status_code == 503)
    assert episode["body"]["failure"] == {
        "failure_reason": "Episode admission timed out",
        "terminal": False,
        "stage": "admission",
    }
    assert episode["body"]["episode_id"].startswith("episode-")
    assert episode["body"]["task_id"].startswith("task-")
    assert chat["status"] == 503
    assert chat["headers"]["retry-after"] == "3"
    assert chat["body"]["error"]["code"] == "queue_full"
    assert problem.headers["content-type"] == "application/problem+json"
    assert problem.headers["retry-after"] == "3"
    assert problem.json()["limit_name"] == "verify_requests"
    for body in (episode["body"], chat["body"], problem.json()):
        assert matching_documented_body(body) is not None, (
            f"not in docs/failure-responses.md: {body}"
        )


def test_every_metric_the_dashboard_reads_is_in_prometheus(overloaded: dict[str, Any]):
    response = httpx.get(f"{overloaded['prometheus']}/api/v1/label/__name__/values", timeout=5)
    scraped = set(response.json()["data"])
    missing = dashboard_metric_names() - scraped
    assert not missing, f"the dashboard reads metrics Prometheus never saw: {sorted(missing)}"
