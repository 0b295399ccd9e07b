"""LimitedTransport over a real uvicorn upstream with a real httpx client: what is retried and
when, what the caller gets back, how long a slot is held, what a limit's own refusal does, the
deadline, and the three client instruments."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gym_concurrency import MeteredSemaphore, QueueFullError, names
from gym_concurrency.clients import DeadlineExceeded, LimitedTransport, RetryPolicy
from tests.clients.upstream import Reply, Upstream
from tests.metrics_capture import MetricsCapture
from tests.servers import eventually, free_port

FAST = RetryPolicy(backoff_seconds=0.01, backoff_max_seconds=0.05)


def client_for(
    upstream: Upstream, limit: Any, retry: RetryPolicy | None = FAST, **options: Any
) -> httpx.AsyncClient:
    timeout = options.pop("timeout", 10.0)
    transport = LimitedTransport(limit, retry=retry, **options)
    return httpx.AsyncClient(transport=transport, base_url=upstream.url, timeout=timeout)


@pytest.fixture
async def client(upstream: Upstream, limit: MeteredSemaphore) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(upstream, limit) as made:
        yield made


async def test_a_429_is_retried_after_retry_after_and_the_success_returned(
    upstream: Upstream, client: httpx.AsyncClient
):
    upstream.script("/judge", Reply(429, {"retry-after": "1"}))
    started = time.monotonic()
    response = await client.post("/judge", json={"q": 1})
    assert response.status_code == 200
    assert response.json()["attempt"] == 2
    assert time.monotonic() - started >= 1.0
    (gap,) = upstream.gaps("/judge")
    assert gap >= 1.0  # never an attempt before the server's Retry-After


async def test_retry_after_ms_is_read_before_retry_after(
    upstream: Upstream, client: httpx.AsyncClient
):
    upstream.script("/judge", Reply(503, {"retry-after-ms": "300", "retry-after": "30"}))
    response = await client.post("/judge", content=b"x")
    assert response.json()["attempt"] == 2
    (gap,) = upstream.gaps("/judge")
    assert 0.3 <= gap < 5


async def test_retry_after_as_an_http_date_is_waited_for(
    upstream: Upstream, client: httpx.AsyncClient
):
    when = email.utils.formatdate(time.time() + 2, usegmt=True)  # whole seconds: 1-2 s away
    upstream.script("/judge", Reply(429, {"retry-after": when}))
    response = await client.get("/judge")
    assert response.status_code == 200
    (gap,) = upstream.gaps("/judge")
    assert gap >= 0.9


async def test_the_last_response_is_returned_unchanged_once_attempts_run_out(
    upstream: Upstream, client: httpx.AsyncClient
):
    replies = [Reply(503, {"retry-after-ms": "10", "x-reply": str(n)}) for n in range(1, 6)]
    upstream.script("/judge", *replies)
    response = await client.post("/judge", content=b"x")
    assert len(upstream.attempts("/judge")) == 4  # max_attempts
    assert response.status_code == 503
    assert response.headers["x-reply"] == "4"
    assert response.headers["retry-after-ms"] == "10"
    assert response.json() == {"attempt": 4}


async def test_statuses_outside_the_list_are_not_retried(
    upstream: Upstream, client: httpx.AsyncClient
):
    upstream.script("/judge", Reply(500), Reply(400))
    assert (await client.get("/judge")).status_code == 500
    assert (await client.get("/judge")).status_code == 400
    assert len(upstream.attempts("/judge")) == 2


async def test_x_should_retry_overrides_the_status_list(
    upstream: Upstream, client: httpx.AsyncClient
):
    upstream.script("/no", Reply(503, {"x-should-retry": "false"}))
    upstream.script("/yes", Reply(409, {"x-should-retry": "true"}))
    assert (await client.get("/no")).status_code == 503
    assert (await client.get("/yes")).status_code == 200
    assert (len(upstream.attempts("/no")), len(upstream.attempts("/yes"))) == (1, 2)


async def test_without_a_policy_one_attempt_is_made(upstream: Upstream, limit: MeteredSemaphore):
    upstream.script("/judge", Reply(429, {"retry-after-ms": "1"}))
    async with client_for(upstream, limit, retry=None) as client:
        assert (await client.get("/judge")).status_code == 429
    assert len(upstream.attempts("/judge")) == 1


async def test_a_retry_after_over_the_maximum_ends_the_call_with_that_response(
    upstream: Upstream, limit: MeteredSemaphore, metrics: MetricsCapture
):
    upstream.script("/judge", Reply(429, {"retry-after": "3600"}))
    async with client_for(upstream, limit, meter_provider=metrics.provider) as client:
        started = time.monotonic()
        response = await client.get("/judge")
    assert (response.status_code, response.headers["retry-after"]) == (429, "3600")
    assert time.monotonic() - started < 1
    denied = metrics.values(names.CLIENT_RETRIES_DENIED_INSTRUMENT)
    reasons = {dict(k)[names.RETRY_DENIED_REASON_ATTRIBUTE]: v for k, v in denied.items()}
    assert reasons == {"retry_after_too_long": 1}


async def test_the_slot_is_held_until_a_streamed_body_is_read_or_closed(
    upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/stream", Reply(chunks=4, chunk_delay=0.05, body=b"abcdefgh"))
    upstream.script("/stream", Reply(chunks=4, chunk_delay=0.05, body=b"abcdefgh"))
    async with client_for(upstream, limit) as client:
        async with client.stream("GET", "/stream") as response:
            assert limit.active == 1  # headers are in, the body is not
            assert await response.aread() == b"abcdefgh"
            assert limit.active == 0  # read in full: given back before the block ends
        async with client.stream("GET", "/stream") as response:
            async for _ in response.aiter_raw():
                break  # read a piece, then close
            assert limit.active == 1
        assert limit.active == 0
        await client.get("/plain")
        assert limit.active == 0


async def test_each_attempt_takes_a_slot_and_backoff_holds_none(upstream: Upstream, name: str):
    one = MeteredSemaphore(1, component=name, limit_name="one")
    upstream.script("/judge", Reply(429, {"retry-after-ms": "400"}))
    async with client_for(upstream, one) as client:
        retried = asyncio.create_task(client.get("/judge"))
        await eventually(lambda: len(upstream.attempts("/judge")) == 1, "the first attempt")
        await eventually(lambda: one.active == 0, "the slot given back for the backoff")
        other = await client.get("/other")  # takes the free slot during the backoff
        assert other.status_code == 200
        assert (await retried).status_code == 200
    assert upstream.max_active == 1
    assert one.active == 0


async def test_a_limits_own_refusal_reaches_the_caller_and_is_not_retried(
    upstream: Upstream, name: str
):
    waits = MeteredSemaphore(1, component=name, limit_name="waits", timeout=0.05)
    sheds = MeteredSemaphore(1, component=name, limit_name="sheds", max_queue=0)
    for limit, error in ((waits, TimeoutError), (sheds, QueueFullError)):
        await limit.acquire()  # someone else holds the only slot
        async with client_for(upstream, limit) as client:
            with pytest.raises(error) as raised:
                await client.get("/judge")
        assert type(raised.value) is error  # the limit's own, not an httpx error
        limit.release()
        assert (limit.active, limit.queue_depth) == (0, 0)
    assert upstream.attempts() == []


async def test_a_refused_connection_is_retried_until_the_upstream_listens(
    limit: MeteredSemaphore,
):
    from tests.servers import UvicornServer

    late = Upstream()
    server = UvicornServer(late)
    policy = RetryPolicy(max_attempts=100, backoff_seconds=0.05, backoff_max_seconds=0.1)
    transport = LimitedTransport(limit, retry=policy)
    async with httpx.AsyncClient(transport=transport, base_url=server.url) as client:
        call = asyncio.create_task(client.post("/judge", content=b"not idempotent"))
        await asyncio.sleep(0.3)
        assert not call.done()
        await asyncio.to_thread(server.__enter__)
        try:
            response = await call
        finally:
            await asyncio.to_thread(server.__exit__, None, None, None)
    assert response.status_code == 200
    assert len(late.attempts("/judge")) == 1


async def test_a_connection_dropped_before_any_response_byte_is_retried(
    limit: MeteredSemaphore,
):
    """A server that reads the request and hangs up without answering, twice, then answers."""
    seen = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(5)
        seen += 1
        if seen > 2:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server, client_for(Upstream(f"http://127.0.0.1:{port}"), limit) as client:
        response = await client.post("/judge", content=b"hello")
    assert (response.status_code, response.text, seen) == (200, "ok", 3)


async def test_a_read_timeout_is_retried_only_for_an_idempotent_method(
    upstream: Upstream, limit: MeteredSemaphore
):
    upstream.script("/get", Reply(delay=1.0))
    upstream.script("/post", Reply(delay=1.0))
    async with client_for(upstream, limit, timeout=httpx.Timeout(5, read=0.2)) as client:
        assert (await client.get("/get")).json()["attempt"] == 2
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/post", content=b"x")
    await eventually(lambda: upstream.active == 0, "the upstream to finish", seconds=5)
    assert (len(upstream.attempts("/get")), len(upstream.attempts("/post"))) == (2, 1)


async def test_the_deadline_bounds_slot_wait_attempts_and_backoff(
    upstream: Upstream, name: str, metrics: MetricsCapture
):
    limit = MeteredSemaphore(1, component=name, limit_name="deadline")
    policy = RetryPolicy(deadline_seconds=0.5, backoff_seconds=0.01)
    async with client_for(upstream, limit, retry=policy, meter_provider=metrics.provider) as c:
        # an attempt that would outlast the deadline is cut off
        upstream.script("/slow", Reply(delay=3))
        started = time.monotonic()
        with pytest.raises(httpx.TimeoutException) as cut:
            await c.get("/slow")
        assert isinstance(cut.value, DeadlineExceeded)
        assert time.monotonic() - started < 2
        # a wait for a slot that would outlast it, too (the wait leaves the queue)
        await limit.acquire()
        with pytest.raises(DeadlineExceeded):
            await c.get("/judge")
        limit.release()
        assert (limit.active, limit.queue_depth, limit.admission_cancelled) == (0, 0, 1)
        # a retry whose Retry-After ends past it is not made: the response is the answer
        upstream.script("/judge", Reply(429, {"retry-after": "2"}))
        assert (await c.get("/judge")).status_code == 429
    denied = metrics.values(names.CLIENT_RETRIES_DENIED_INSTRUMENT)
    assert {dict(k)[names.RETRY_DENIED_REASON_ATTRIBUTE] for k in denied} == {"deadline"}
    assert limit.active == 0


async def test_the_budget_ends_calls_past_it_with_their_last_response(
    upstream: Upstream, limit: MeteredSemaphore, metrics: MetricsCapture
):
    policy = RetryPolicy(budget_ratio=0.0, budget_min_per_second=0.2, backoff_seconds=0.01)
    upstream.script("/judge", *[Reply(503, {"retry-after-ms": "1"})] * 10)
    async with client_for(upstream, limit, retry=policy, meter_provider=metrics.provider) as c:
        first = await c.get("/judge")  # retried twice (the floor: 0.2/s x 10 s), then denied
        second = await c.get("/judge")  # denied at once
    assert (first.status_code, second.status_code) == (503, 503)
    assert len(upstream.attempts("/judge")) == 4
    denied = metrics.values(names.CLIENT_RETRIES_DENIED_INSTRUMENT)
    assert {dict(k)[names.RETRY_DENIED_REASON_ATTRIBUTE]: v for k, v in denied.items()} == {
        "budget": 2
    }


async def test_the_instruments_carry_the_limits_attributes(
    upstream: Upstream, limit: MeteredSemaphore, metrics: MetricsCapture, name: str
):
    upstream.script("/judge", Reply(429, {"retry-after-ms": "20"}), Reply(503))
    async with client_for(upstream, limit, meter_provider=metrics.provider) as client:
        assert (await client.get("/judge")).status_code == 200
    found = metrics.collect()
    identity = {
        names.COMPONENT_ATTRIBUTE: name,
        names.LIMIT_NAME_ATTRIBUTE: "judge",
        names.SERVER_ATTRIBUTE: "resources",
    }
    (retries,) = found[names.CLIENT_RETRIES_INSTRUMENT]
    assert dict(retries.attributes) == {**identity, names.RETRY_REASON_ATTRIBUTE: "status"}
    assert retries.value == 2
    backoff = {
        dict(p.attributes)[names.BACKOFF_SOURCE_ATTRIBUTE]: p
        for p in found[names.CLIENT_BACKOFF_DURATION_INSTRUMENT]
    }
    assert backoff["retry_after"].count == 1
    # The server's 20 ms, and at most the default 10 % jitter after it (never before).
    assert 20.0 <= backoff["retry_after"].sum <= 22.0 + 1e-9
    assert backoff["backoff"].count == 1
    assert 0 <= backoff["backoff"].sum <= 1000 * FAST.backoff_seconds * 2
    assert names.CLIENT_RETRIES_DENIED_INSTRUMENT not in found


async def test_the_deadline_ends_a_body_that_outlasts_it(upstream: Upstream, name: str):
    # Headers at once, then a body of 4 chunks a second apart: a 1 s deadline ends the read
    # within 1.2 s (it stopped at the headers before), and the slot is given back.
    limit = MeteredSemaphore(1, component=name, limit_name="body_deadline")
    upstream.script("/stream", Reply(chunks=4, chunk_delay=1.0))
    loop = asyncio.get_running_loop()
    async with client_for(upstream, limit, retry=RetryPolicy(deadline_seconds=1.0)) as client:
        started = loop.time()
        with pytest.raises(httpx.TimeoutException) as cut:
            await client.get("/stream")
        assert loop.time() - started < 1.2
        assert isinstance(cut.value, DeadlineExceeded)
        assert "no whole body within the call's deadline of 1 s" in str(cut.value)
        assert limit.active == 0
