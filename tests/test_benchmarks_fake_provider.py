"""benchmarks/_fake_provider.py served by real uvicorn and called with httpx: it meters tokens
and requests over a sliding window (or token buckets), answers 429 with an honest Retry-After,
sends OpenAI's and Anthropic's rate-limit headers and usage (streamed too), and counts it all at
/stats; the library's readers read what it sends, and a RateBudget of the same minute refuses
a call before the provider would."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from benchmarks._fake_provider import FakeProvider, go_duration
from gym_concurrency.clients.provider_headers import ProviderReading, provider_readings
from gym_concurrency.limits.rate_budget import RateBudget, Reservation
from gym_concurrency.tokens import openai_tokens
from gym_concurrency.usage import Usage, usage_from_body
from tests.servers import UvicornServer

PROMPT = [{"role": "user", "content": "x" * 36}]  # 10 prompt tokens, "user" counted


def chat(max_tokens: int, **more: object) -> dict[str, object]:
    return {"model": "fake", "messages": PROMPT, "max_tokens": max_tokens, **more}


@pytest.fixture
def serve() -> Iterator[object]:
    servers: list[UvicornServer] = []

    def start(provider: FakeProvider) -> httpx.Client:
        server = UvicornServer(provider, lifespan="off")
        server.__enter__()
        servers.append(server)
        return httpx.Client(base_url=server.url, timeout=10)

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def test_tokens_over_the_window_are_refused_with_an_honest_retry_after(serve) -> None:
    client = serve(FakeProvider(1000, 100, window_seconds=1.5))
    for _ in range(3):  # 3 x 310 tokens of 1000
        assert client.post("/v1/chat/completions", json=chat(300)).status_code == 200
    refused = client.post("/v1/chat/completions", json=chat(300))
    assert refused.status_code == 429
    wait_ms = int(refused.headers["retry-after-ms"])
    assert 0 < wait_ms <= 1500
    assert refused.headers["retry-after"] == str(-(-wait_ms // 1000))
    assert refused.headers["x-ratelimit-remaining-tokens"] == "70"
    assert usage_from_body(refused.content, refused.headers["content-type"]) is None
    time.sleep(wait_ms / 1000 + 0.05)
    assert client.post("/v1/chat/completions", json=chat(300)).status_code == 200
    stats = client.get("/stats").json()
    assert (stats["served"], stats["refused"], stats["refused_by"]) == (4, 1, {"tokens": 1})
    assert stats["most_in_window"]["tokens"] == 930
    assert stats["tokens_served"] == 4 * 310


def test_requests_over_the_window_are_refused_and_a_call_too_large_never_retried(serve) -> None:
    client = serve(FakeProvider(10_000, 2))
    assert [client.post("/v1/chat/completions", json=chat(1)).status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]
    huge = client.post("/v1/chat/completions", json=chat(20_000))
    assert (huge.status_code, huge.headers["x-should-retry"]) == (429, "false")
    assert "retry-after" not in huge.headers
    assert client.post("/v1/chat/completions", content=b"[").status_code == 400
    assert client.get("/stats").json()["refused_by"] == {"requests": 1, "too_large": 1}


def test_openai_answers_carry_headers_and_usage_the_library_reads(serve) -> None:
    client = serve(FakeProvider(1000, 10, completion_share=0.5))
    body = chat(100)
    answer = client.post("/v1/chat/completions", json=body)
    assert usage_from_body(answer.content, answer.headers["content-type"]) == Usage(10, 50)
    assert openai_tokens(body) == 110  # the estimate a budget reserves: refunded to 60
    tokens, requests = provider_readings(answer.headers)
    assert tokens.limit == 1000
    assert tokens.remaining == 940
    assert 59.0 < tokens.reset_seconds <= 60.0  # type: ignore[operator]
    assert (requests.limit, requests.remaining) == (10, 9)
    streamed = client.post(
        "/v1/chat/completions", json=chat(100, stream=True, stream_options={"include_usage": True})
    )
    assert streamed.headers["content-type"] == "text/event-stream"
    assert usage_from_body(streamed.content, streamed.headers["content-type"]) == Usage(10, 50)
    bare = client.post("/v1/chat/completions", json=chat(100, stream=True))
    assert usage_from_body(bare.content, bare.headers["content-type"]) is None  # no usage sent


def test_anthropic_answers_carry_its_headers_and_usage(serve) -> None:
    provider = FakeProvider(
        1000, 10, input_tokens_per_minute=500, output_tokens_per_minute=200, wall=lambda: 1e9
    )
    client = serve(provider)
    body = {"model": "fake", "system": "y" * 8, "messages": PROMPT, "max_tokens": 100}
    answer = client.post("/v1/messages", json=body)
    assert usage_from_body(answer.content, answer.headers["content-type"]) == Usage(12, 100)
    assert answer.headers["anthropic-ratelimit-tokens-reset"] == "2001-09-09T01:47:40Z"
    readings = {r.budget: r for r in provider_readings(answer.headers, now=1e9)}
    assert readings["input_tokens"] == ProviderReading("input_tokens", 500, 488, 60.0)
    assert readings["output_tokens"] == ProviderReading("output_tokens", 200, 100, 60.0)
    assert (readings["tokens"].remaining, readings["requests"].remaining) == (888, 9)
    streamed = client.post("/v1/messages", json={**body, "stream": True})
    assert usage_from_body(streamed.content, streamed.headers["content-type"]) == Usage(12, 100)
    over = client.post("/v1/messages", json=body)  # 100 more output tokens: none left
    assert over.status_code == 429
    assert client.get("/stats").json()["refused_by"] == {"output_tokens": 1}


def test_a_bucket_provider_refills_continuously(serve) -> None:
    client = serve(FakeProvider(1000, 100, meter="bucket", window_seconds=1.0))
    assert client.post("/v1/chat/completions", json=chat(990)).status_code == 200  # a burst
    refused = client.post("/v1/chat/completions", json=chat(490))
    assert refused.status_code == 429
    assert 400 <= int(refused.headers["retry-after-ms"]) <= 500  # half of it refills in 0.5 s
    time.sleep(0.55)
    assert client.post("/v1/chat/completions", json=chat(490)).status_code == 200


def test_a_budget_of_the_same_minute_refuses_before_the_provider_would(serve) -> None:
    client = serve(FakeProvider(1000, 100))
    budget = RateBudget(tokens_per_minute=1000, requests_per_minute=100)
    body = chat(300)
    for _ in range(3):
        reservation = budget.reserve(openai_tokens(body))
        assert isinstance(reservation, Reservation)
        answer = client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200
        budget.settle(reservation, usage_from_body(answer.content) or 0)
    wait = budget.reserve(openai_tokens(body))
    assert isinstance(wait, float)
    assert 58.0 < wait <= 61.0
    assert client.post("/v1/chat/completions", json=body).status_code == 429  # it was right


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.02, "20ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"), (3723.5, "1h2m3.5s")],
)
def test_resets_are_written_as_go_durations(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text
