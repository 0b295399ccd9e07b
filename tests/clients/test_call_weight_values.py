"""An outbound call's weight never fails it or lies about it: `weight=openai_tokens` prices any
body (huge output bounds, past Python's 4300-digit int limit, NaN, nesting, not JSON) at an int
in [1, limit], a bound over the limit capped and counted; a weight function returning a number
too long to write out is capped (or refused) with a short message. Hypothesis over arbitrary
bodies, and real httpx and aiohttp against a real uvicorn upstream."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from gym_concurrency import MeteredSemaphore
from gym_concurrency.clients import json_body, openai_tokens
from gym_concurrency.clients.weights import CallAsk
from tests.clients.callers import KINDS, Caller
from tests.clients.upstream import Reply, Upstream
from tests.json_bodies import json_bodies
from tests.servers import eventually

OUTPUT_BOUNDS = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
PAST_THE_DIGIT_LIMIT = "1" + "0" * 5000


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=json_bodies(*OUTPUT_BOUNDS))
def test_any_body_is_priced_within_the_limit(body: bytes) -> None:
    limit = MeteredSemaphore(100, component="values", limit_name="model")
    ask = CallAsk(limit, weight=openai_tokens)
    request = httpx.Request("POST", "http://upstream/v1/chat/completions", content=body)
    weight, _ = ask.of(request)
    capped = ask.capped_weight(weight)
    assert type(capped) is int
    assert 1 <= capped <= 100
    json_body(request)  # never raises either


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("field", OUTPUT_BOUNDS)
async def test_an_output_bound_past_the_digit_limit_takes_the_whole_limit(
    kind: str, field: str, upstream: Upstream, name: str
) -> None:
    # Python cannot read this integer from text: the body used to go unparsed, priced at the
    # default output alone (1024); it is a bound over the limit, so capped at it.
    limit = MeteredSemaphore(5000, component=name, limit_name="model")
    upstream.script("/v1/chat/completions", Reply(delay=0.3))
    body = b'{"messages": [], "%s": %s}' % (field.encode(), PAST_THE_DIGIT_LIMIT.encode())
    async with Caller(kind, upstream.url, limit, None, weight=openai_tokens) as caller:
        call = asyncio.create_task(caller.post("/v1/chat/completions", content=body))
        await eventually(lambda: upstream.answering(1), "the call to reach the upstream")
        assert limit.active == 5000
        assert (await call)[0] == 200
        assert caller.view.weights_capped == 1
    assert (limit.active, limit.flow_statistics()) == (0, [])


def a_googol_googol(request: Any) -> int:
    return 10**5000  # more digits than Python writes out (4300)


def less_than_nothing(request: Any) -> int:
    return -(10**5000)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_weight_too_long_to_write_out_is_capped_with_a_short_warning(
    kind: str, upstream: Upstream, limit: MeteredSemaphore, caplog: pytest.LogCaptureFixture
) -> None:
    async with Caller(kind, upstream.url, limit, None, weight=a_googol_googol) as caller:
        with caplog.at_level(logging.WARNING, logger="gym_concurrency.clients"):
            assert (await caller.get("/judge"))[0] == 200
    capped = [r.getMessage() for r in caplog.records if "capped" in r.getMessage()]
    assert len(capped) == 1
    assert "asked for weight about 10^5000, more than the limit 4" in capped[0]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_weight_too_long_to_write_out_below_one_is_refused_naming_it(
    kind: str, upstream: Upstream, limit: MeteredSemaphore
) -> None:
    async with Caller(kind, upstream.url, limit, None, weight=less_than_nothing) as caller:
        with pytest.raises(ValueError, match=r"less_than_nothing returned about -10\^5000 for"):
            await caller.get("/judge")
    assert upstream.attempts() == []


def test_a_huge_constant_weight_below_one_is_refused_naming_it(limit: MeteredSemaphore) -> None:
    with pytest.raises(ValueError, match=r"weight= must be an int >= 1 .*got about -10\^5000"):
        CallAsk(limit, weight=-(10**5000))
