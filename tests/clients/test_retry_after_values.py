"""A Retry-After too long to be a float (400 ASCII digits: valid RFC 9110 delta-seconds) is a
Retry-After over `max_retry_after_seconds`, not an absent one: the call ends with that
response, counted as `retry_after_too_long`, with no backoff and no retry. The same for
`retry-after-ms`. Real httpx and aiohttp against a real uvicorn upstream."""

from __future__ import annotations

import math
import time

import pytest

from gym_concurrency import MeteredSemaphore, names
from gym_concurrency.clients import RetryPolicy
from gym_concurrency.clients.retry import retry_after_seconds
from tests.clients.callers import KINDS, Caller
from tests.clients.upstream import Reply, Upstream
from tests.metrics_capture import MetricsCapture

HUGE = "1" + "0" * 400  # 10^400 seconds: past the largest float
PAST_THE_DIGIT_LIMIT = "9" * 5000  # more digits than Python reads as an int


@pytest.mark.parametrize("digits", [HUGE, PAST_THE_DIGIT_LIMIT, "9" * 309])
def test_huge_delta_seconds_are_longer_than_any_maximum(digits: str) -> None:
    assert retry_after_seconds(None, digits, 0.0) == math.inf
    assert retry_after_seconds(digits, "3", 0.0) == math.inf  # retry-after-ms comes first
    assert retry_after_seconds(None, f" {digits}\t", 0.0) == math.inf


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("header", ["retry-after", "retry-after-ms"])
async def test_a_huge_retry_after_ends_the_call_with_that_response(
    kind: str,
    header: str,
    upstream: Upstream,
    limit: MeteredSemaphore,
    metrics: MetricsCapture,
) -> None:
    upstream.script("/judge", Reply(429, {header: HUGE}))
    retry = RetryPolicy(backoff_seconds=0.5, backoff_max_seconds=0.5)
    async with Caller(kind, upstream.url, limit, retry, meter_provider=metrics.provider) as caller:
        started = time.monotonic()
        status, _ = await caller.get("/judge")
    assert status == 429  # that response, not the next attempt's 200
    assert len(upstream.attempts("/judge")) == 1
    assert time.monotonic() - started < 0.5  # no backoff was waited
    denied = metrics.values(names.CLIENT_RETRIES_DENIED_INSTRUMENT)
    reasons = {dict(k)[names.RETRY_DENIED_REASON_ATTRIBUTE]: v for k, v in denied.items()}
    assert reasons == {"retry_after_too_long": 1}
