"""Fetching an engine's /metrics: a `Fetch` is any coroutine function that GETs a URL within a
timeout and returns the body of a 200 answer no longer than a cap, or raises.

`fetch_metrics` is the default, kept in the core so that following an engine needs no HTTP
library: one HTTP/1.1 GET over `asyncio.open_connection` to a plain `http://` URL, a connection
per scrape (`Connection: close`; a scrape every second or so gains nothing from keeping it).
It reads a Content-Length, chunked or read-to-close body, and refuses one over the cap as
soon as it is known to be (by its Content-Length, or by its size so far), holding at most
the cap. For https, authentication or a proxy, pass another Fetch (`gym_concurrency.clients.
engine_fetch.httpx_fetch` wraps an httpx client).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from ..safe_urls import safe_url

__all__ = ["Fetch", "ScrapeError", "check_metrics_url", "fetch_metrics"]

Fetch = Callable[[str, float, int], Awaitable[bytes]]
"""`fetch(url, timeout_seconds, max_bytes)`: the body of a 200 answer, at most `max_bytes`
long; raises (any Exception) for anything else."""

HEAD_MAX_BYTES: Final = 64 * 1024  # the status line and the headers together
_CHUNK_LINE_MAX_BYTES: Final = 1024
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}")


class ScrapeError(Exception):
    """A /metrics GET that gave no usable body; the message says why (the URL masked)."""


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    path: str
    host_header: str


def check_metrics_url(url: str) -> str:
    """`url` if `fetch_metrics` can GET it (`http://host[:port]/path`); else ValueError."""
    _target(url)
    return url


def _target(url: str) -> _Target:
    try:
        parts = urlsplit(url)
        port = parts.port or 80
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"not a URL: {safe_url(str(url))!r}") from None
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(
            f"fetch_metrics GETs plain http://host[:port]/path URLs, not {safe_url(url)!r}: "
            "pass fetch= (e.g. clients.engine_fetch.httpx_fetch) for https or credentials"
        )
    if parts.username is not None or any(c in url for c in "\r\n "):
        raise ValueError(f"fetch_metrics: no credentials, spaces or line breaks in {url!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    host_header = host if parts.port is None else f"{host}:{port}"
    return _Target(parts.hostname, port, path, host_header)


async def fetch_metrics(url: str, timeout_seconds: float, max_bytes: int) -> bytes:
    """GET `url` (plain http) within `timeout_seconds`; the body of a 200 answer, at most
    `max_bytes` long. ScrapeError for any other answer, a timeout or a broken connection;
    ValueError for a URL it cannot GET. The connection is closed however it ends."""
    target = _target(url)
    try:
        async with asyncio.timeout(timeout_seconds):
            return await _get(target, max_bytes)
    except TimeoutError:
        raise ScrapeError(f"GET {safe_url(url)}: no answer within {timeout_seconds} s") from None
    except ScrapeError as error:
        raise ScrapeError(f"GET {safe_url(url)}: {error}") from None
    except asyncio.LimitOverrunError:
        raise ScrapeError(f"GET {safe_url(url)}: a header or chunk line too long") from None
    except asyncio.IncompleteReadError:
        raise ScrapeError(f"GET {safe_url(url)}: the connection closed mid-answer") from None
    except (OSError, ValueError, EOFError) as error:
        raise ScrapeError(f"GET {safe_url(url)}: {type(error).__name__}: {error}") from None


async def _get(target: _Target, max_bytes: int) -> bytes:
    reader, writer = await asyncio.open_connection(target.host, target.port, limit=HEAD_MAX_BYTES)
    try:
        writer.write(
            f"GET {target.path} HTTP/1.1\r\nHost: {target.host_header}\r\n"
            "Accept: text/plain;version=0.0.4\r\nAccept-Encoding: identity\r\n"
            "User-Agent: gym-concurrency\r\nConnection: close\r\n\r\n".encode("latin-1")
        )
        await writer.drain()
        status, headers = _head(await reader.readuntil(b"\r\n\r\n"))
        if status != 200:
            raise ScrapeError(f"answered {status}")
        if headers.get("content-encoding", "identity").lower() != "identity":
            raise ScrapeError(f"answered in {headers['content-encoding']!r}, not identity")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await _chunked(reader, max_bytes)
        if "content-length" in headers:
            length = _length(headers["content-length"])
            if length > max_bytes:
                raise ScrapeError(f"a {length}-byte body, over the cap of {max_bytes}")
            return await reader.readexactly(length)
        return await _to_close(reader, max_bytes)
    finally:
        writer.close()  # not awaited: a cancelled scrape must not wait on the peer


def _head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status and the headers (names lower-cased; a repeated one: the last)."""
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest.partition(" ")[0]  # three digits, then a space and a reason (maybe empty)
    if not version.startswith("HTTP/1.") or not (
        len(code) == 3 and code.isascii() and code.isdigit()
    ):
        raise ScrapeError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return int(code), headers


def _length(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ScrapeError(f"a Content-Length of {text[:40]!r}")
    return int(text)


async def _chunked(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    body = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        if len(line) > _CHUNK_LINE_MAX_BYTES:
            raise ScrapeError("a chunk line too long")
        size_text = line.split(b";", 1)[0].strip()
        if _HEX.fullmatch(size_text) is None:
            raise ScrapeError(f"a chunk size of {size_text[:20]!r}")
        size = int(size_text, 16)
        if len(body) + size > max_bytes:
            raise ScrapeError(f"a chunked body over the cap of {max_bytes} bytes")
        if size == 0:
            return bytes(body)  # trailers, if any, are not read: the connection closes
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise ScrapeError("a chunk not ended by CRLF")


async def _to_close(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    body = bytearray()
    while chunk := await reader.read(min(65536, max_bytes + 1 - len(body))):
        body += chunk
        if len(body) > max_bytes:
            raise ScrapeError(f"a body over the cap of {max_bytes} bytes")
    return bytes(body)
