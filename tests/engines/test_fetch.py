"""fetch_metrics, the core's one GET of an engine's /metrics: the bodies HTTP/1.1 can send
(a length, chunks, read to close), the cap (refused as soon as known, never held), every way
an answer goes wrong (a clear ScrapeError), a timeout or a cancellation closing the
connection; and httpx_fetch, the same through an httpx client."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from gym_concurrency.clients.engine_fetch import httpx_fetch
from gym_concurrency.engines import ScrapeError, fetch_metrics
from tests.engines.raw_server import endless, raw_server, sending
from tests.servers import eventually

BODY = b'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"


async def test_a_body_with_a_length_and_the_request_sent() -> None:
    answer = sending(OK + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY, then_hang=True)
    async with raw_server(answer, path="/metrics?x=1") as server:
        assert await fetch_metrics(server.url, 5, 1000) == BODY
        [request] = server.requests
    port = server.url.split(":")[2].split("/")[0]
    assert request.startswith(b"GET /metrics?x=1 HTTP/1.1\r\n")
    assert f"\r\nHost: 127.0.0.1:{port}\r\n".encode() in request
    assert b"\r\nConnection: close\r\n" in request
    assert b"\r\nAccept-Encoding: identity\r\n" in request


async def test_a_chunked_body_and_one_read_to_its_close() -> None:
    chunked = OK + b"Transfer-Encoding: chunked\r\n\r\n"
    chunked += b"a;ext=1\r\n" + BODY[:10] + b"\r\n"
    chunked += b"%x\r\n" % (len(BODY) - 10) + BODY[10:] + b"\r\n0\r\n\r\n"
    async with raw_server(sending(chunked, then_hang=True)) as server:
        assert await fetch_metrics(server.url, 5, 1000) == BODY
    async with raw_server(sending(OK + b"\r\n", BODY[:7], BODY[7:], delay=0.01)) as server:
        assert await fetch_metrics(server.url, 5, 1000) == BODY


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (OK + b"Content-Length: 1001\r\n\r\n", "a 1001-byte body, over the cap of 1000"),
        (
            OK + b"Transfer-Encoding: chunked\r\n\r\n3e8\r\n" + b"x" * 1000 + b"\r\n1\r\n",
            "a chunked body over the cap of 1000 bytes",
        ),
    ],
)
async def test_a_body_over_the_cap_is_refused_as_soon_as_it_is_known(
    answer: bytes, error: str
) -> None:
    async with raw_server(sending(answer, then_hang=True)) as server:
        with pytest.raises(ScrapeError, match=error):
            await fetch_metrics(server.url, 5, 1000)
        await asyncio.wait_for(server.client_closed.wait(), 5)


async def test_an_endless_body_is_refused_at_the_cap_and_its_connection_closed() -> None:
    async with raw_server(endless()) as server:
        started = time.monotonic()
        with pytest.raises(ScrapeError, match="a body over the cap of 200000 bytes"):
            await fetch_metrics(server.url, 5, 200_000)
        assert time.monotonic() - started < 2
        await asyncio.wait_for(server.client_closed.wait(), 5)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", "answered 503"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line: 'SSH-2.0-OpenSSH'"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP/1.x status line: 'HTTP/1.1 2000 OK'"),
        (OK + b"Content-Length: 12x\r\n\r\n", "a Content-Length of '12x'"),
        (OK + b"Content-Encoding: gzip\r\n\r\n", "answered in 'gzip', not identity"),
        (OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", "a chunk size of b'zz'"),
        (OK + b"Content-Length: 100\r\n\r\n" + BODY, "the connection closed mid-answer"),
        (OK + b"X: " + b"y" * 70000 + b"\r\n\r\n", "a header or chunk line too long"),
        (b"", "the connection closed mid-answer"),
    ],
)
async def test_an_answer_that_is_not_a_body_is_a_clear_scrape_error(
    answer: bytes, error: str
) -> None:
    async with raw_server(sending(answer)) as server:
        with pytest.raises(ScrapeError, match=f"GET {server.url}: {error}"):
            await fetch_metrics(server.url, 5, 1000)


async def test_no_answer_within_the_timeout_closes_the_connection() -> None:
    async with raw_server(sending(then_hang=True)) as server:
        started = time.monotonic()
        with pytest.raises(ScrapeError, match=f"GET {server.url}: no answer within 0.2 s"):
            await fetch_metrics(server.url, 0.2, 1000)
        assert 0.15 < time.monotonic() - started < 2
        await asyncio.wait_for(server.client_closed.wait(), 5)


async def test_a_cancelled_fetch_closes_its_connection_and_stays_cancelled() -> None:
    async with raw_server(sending(OK, then_hang=True)) as server:
        task = asyncio.ensure_future(fetch_metrics(server.url, 30, 1000))
        await eventually(lambda: bool(server.requests), "the request to be sent")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.client_closed.wait(), 5)


async def test_a_refused_connection_and_urls_it_cannot_get() -> None:
    async with raw_server(sending()) as server:
        url = server.url
    with pytest.raises(ScrapeError, match=f"GET {url}: ConnectionRefusedError"):
        await fetch_metrics(url, 5, 1000)
    with pytest.raises(ValueError, match="plain http://host"):
        await fetch_metrics("https://engine:8000/metrics", 5, 1000)
    with pytest.raises(ValueError, match="no credentials"):
        await fetch_metrics("http://user:secret@engine:8000/metrics", 5, 1000)
    with pytest.raises(ValueError, match="not a URL"):
        await fetch_metrics("http://engine:99999/metrics", 5, 1000)


async def test_httpx_fetch_reads_streams_and_refuses_as_fetch_metrics_does() -> None:
    async with httpx.AsyncClient() as client:
        fetch = httpx_fetch(client)
        answer = sending(OK + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
        async with raw_server(answer) as server:
            assert await fetch(server.url, 5, 1000) == BODY
        async with raw_server(endless()) as server:
            with pytest.raises(ScrapeError, match="a body over the cap of 200000 bytes"):
                await fetch(server.url, 5, 200_000)
        async with raw_server(sending(OK + b"Content-Length: 5000\r\n\r\n")) as server:
            with pytest.raises(ScrapeError, match="a 5000-byte body, over the cap of 1000"):
                await fetch(server.url, 5, 1000)
        async with raw_server(sending(b"HTTP/1.1 404 Not Found\r\n\r\n")) as server:
            with pytest.raises(ScrapeError, match=f"GET {server.url}: answered 404"):
                await fetch(server.url, 5, 1000)
        gzip = OK + b"Content-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc"
        async with raw_server(sending(gzip)) as server:
            with pytest.raises(ScrapeError, match="answered in 'gzip', not identity"):
                await fetch(server.url, 5, 1000)
        async with raw_server(sending(then_hang=True)) as server:
            with pytest.raises(ScrapeError, match="ReadTimeout"):
                await fetch(server.url, 0.2, 1000)
