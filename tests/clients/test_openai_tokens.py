"""weight=openai_tokens: the real openai client's request bodies priced in tokens as they leave
(chat completions, completions' output bounds, the Responses API, a stream), the flow read from
the same body; a body that is not JSON, not in memory or too large has a documented price and
never fails the call. Against a real uvicorn upstream that answers after a pause, so the test
reads what the call holds while it is in flight."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, TypeVar

import aiohttp
import httpx
import openai
import pytest

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import LimitedTransport, json_body, limited_middleware, openai_tokens
from gym_concurrency.limits import FlowStatistics
from tests.clients.upstream import Reply, Upstream
from tests.servers import eventually

T = TypeVar("T")
PATH = "/v1/chat/completions"
PROMPT = "x" * 396  # with the role "user": 400 characters, 100 tokens
MESSAGES: Any = [{"role": "user", "content": PROMPT}]


def by_metadata(request: Any) -> Any:
    """The flow: the `env` of the body's metadata (None, the default flow, without one)."""
    body = json_body(request)
    return body.get("metadata", {}).get("env") if isinstance(body, dict) else None


@pytest.fixture
def model(name: str) -> Iterator[MeteredSemaphore]:
    limit = MeteredSemaphore(5000, component=name, limit_name="model")
    yield limit
    assert (limit.active, limit.queue_depth, limit.flow_statistics()) == (0, 0, [])


@pytest.fixture
async def client(upstream: Upstream, model: MeteredSemaphore) -> AsyncIterator[openai.AsyncOpenAI]:
    transport = LimitedTransport(model, weight=openai_tokens, flow=by_metadata)
    async with openai.AsyncOpenAI(
        base_url=upstream.url + "/v1",
        api_key="none",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=transport),
    ) as made:
        yield made


async def in_flight(
    upstream: Upstream, limit: MeteredSemaphore, call: Awaitable[T]
) -> tuple[T, list[FlowStatistics]]:
    """`call`'s result, and what `limit` held by flow while the upstream was answering it."""
    number = len(upstream.attempts()) + 1
    task = asyncio.ensure_future(call)
    await eventually(lambda: upstream.answering(number), "the call to reach the upstream")
    held = limit.flow_statistics()
    return await task, held


async def test_a_chat_completion_is_priced_by_its_prompt_and_max_tokens(
    upstream: Upstream, model: MeteredSemaphore, client: openai.AsyncOpenAI
):
    upstream.script(PATH, Reply(delay=0.3))
    create = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=10, metadata={"env": "math"}
    )
    completion, held = await in_flight(upstream, model, create)
    assert completion.choices[0].message.content == "ok"
    assert held == [FlowStatistics("math", held=110, queue_depth=0, queued_weight=0)]


async def test_max_completion_tokens_counts_before_max_tokens(
    upstream: Upstream, model: MeteredSemaphore, client: openai.AsyncOpenAI
):
    upstream.script(PATH, Reply(delay=0.3))
    create = client.chat.completions.create(
        model="m", messages=MESSAGES, max_completion_tokens=30, max_tokens=10
    )
    _, held = await in_flight(upstream, model, create)
    assert held == [FlowStatistics(None, held=130, queue_depth=0, queued_weight=0)]


async def test_without_an_output_bound_the_default_output_counts(
    upstream: Upstream, model: MeteredSemaphore, client: openai.AsyncOpenAI
):
    upstream.script(PATH, Reply(delay=0.3))
    _, held = await in_flight(
        upstream, model, client.chat.completions.create(model="m", messages=MESSAGES)
    )
    assert [f.held for f in held] == [100 + 1024]


async def test_the_responses_api_input_and_max_output_tokens(
    upstream: Upstream, model: MeteredSemaphore, client: openai.AsyncOpenAI
):
    upstream.script("/v1/responses", Reply(delay=0.3))
    create = client.responses.create(model="m", input="y" * 800, max_output_tokens=50)
    _, held = await in_flight(upstream, model, create)
    assert [f.held for f in held] == [200 + 50]


async def test_a_stream_holds_its_tokens_until_it_is_closed(
    upstream: Upstream, model: MeteredSemaphore, client: openai.AsyncOpenAI
):
    event = json.dumps(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}],
        }
    )
    body = (f"data: {event}\n\n" * 3 + "data: [DONE]\n\n").encode()
    upstream.script(PATH, Reply(body=body, chunks=3, chunk_delay=0.05))
    stream = await client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=10, stream=True, metadata={"env": "code"}
    )
    assert model.flow_statistics() == [FlowStatistics("code", 110, 0, 0)]
    async for _ in stream:
        break
    await stream.close()
    assert model.flow_statistics() == []


async def test_a_heavy_prompt_is_capped_at_the_limit_and_light_ones_wait_for_it(
    upstream: Upstream, name: str
):
    limit = MeteredSemaphore(1000, component=name, limit_name="model")
    transport = LimitedTransport(limit, weight=openai_tokens)
    upstream.script(PATH, Reply(delay=0.5))
    async with openai.AsyncOpenAI(
        base_url=upstream.url + "/v1",
        api_key="none",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=transport),
    ) as client:
        heavy = asyncio.create_task(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "z" * 40_000}]
            )
        )
        await eventually(lambda: upstream.answering(1), "the heavy call to reach the upstream")
        assert (limit.active, transport.weights_capped) == (1000, 1)
        light = asyncio.create_task(
            client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10)
        )
        await eventually(lambda: limit.queue_depth == 1, "the light call to wait")
        assert limit.statistics().queued_weight == 110
        await asyncio.gather(heavy, light)
    assert (limit.active, limit.flow_statistics()) == (0, [])


async def test_bodies_that_cannot_be_priced_cost_the_default_output(
    upstream: Upstream, model: MeteredSemaphore
):
    async def generated() -> AsyncIterator[bytes]:
        yield b'{"messages": ["never read before it is sent"]}'

    bodies: list[Any] = [
        b"not json",
        b'{"messages": ',
        "\u00e9t\u00e9".encode("latin-1"),
        b"[1, 2]",
    ]
    upstream.script(PATH, *[Reply(delay=0.2)] * (len(bodies) + 1))
    transport = LimitedTransport(model, weight=openai_tokens)
    async with httpx.AsyncClient(transport=transport, base_url=upstream.url) as client:
        for content in [*bodies, generated()]:
            response, held = await in_flight(upstream, model, client.post(PATH, content=content))
            assert response.status_code == 200
            assert [f.held for f in held] == [1024], content


async def test_a_body_too_large_to_parse_is_priced_by_its_length(
    upstream: Upstream, model: MeteredSemaphore
):
    body = json.dumps({"messages": [{"role": "user", "content": "w" * 2000}], "max_tokens": 5})
    upstream.script(PATH, Reply(delay=0.2), Reply(delay=0.2))
    small = functools.partial(openai_tokens, max_bytes=1000, default_output_tokens=100)
    transport = LimitedTransport(model, weight=small)
    async with httpx.AsyncClient(transport=transport, base_url=upstream.url) as client:
        _, held = await in_flight(upstream, model, client.post(PATH, content=body))
        assert [f.held for f in held] == [-(-len(body) // 4) + 100]  # max_tokens unread
        short = json.dumps({"messages": ["v" * 400], "max_tokens": 5})
        _, held = await in_flight(upstream, model, client.post(PATH, content=short))
        assert [f.held for f in held] == [100 + 5]  # parsed: its own bound counts


async def test_aiohttp_prices_a_json_body_and_its_flow(upstream: Upstream, model: MeteredSemaphore):
    upstream.script(PATH, Reply(delay=0.3), Reply(delay=0.3))
    middleware = limited_middleware(model, weight=openai_tokens, flow=by_metadata)
    payload = {"model": "m", "messages": MESSAGES, "max_tokens": 10, "metadata": {"env": "math"}}
    async with aiohttp.ClientSession(base_url=upstream.url, middlewares=(middleware,)) as session:

        async def post(**body: Any) -> int:
            async with session.post(PATH, **body) as response:
                await response.read()
                return response.status

        status, held = await in_flight(upstream, model, post(json=payload))
        assert (status, held) == (200, [FlowStatistics("math", 110, 0, 0)])
        status, held = await in_flight(upstream, model, post(data=b"not json"))
        assert (status, held) == (200, [FlowStatistics(None, 1024, 0, 0)])
