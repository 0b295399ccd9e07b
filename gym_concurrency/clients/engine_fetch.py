"""An engine's /metrics fetched through an httpx client, for what the core's plain-http
`fetch_metrics` does not do: https, credentials, a proxy.

    client = httpx.AsyncClient(headers={"authorization": "Bearer ..."})
    EngineSignal("https://engine:8000/metrics", waiting_max=4, fetch=httpx_fetch(client))

The body is asked for and taken unencoded only (`Accept-Encoding: identity`: a compressed
body could decode to far more than its bytes) and streamed, refused as soon as it passes the
cap, so no more than the cap is held. Needs httpx (the `[httpx]` extra).
"""

from __future__ import annotations

from ._extras import missing_library

try:
    import httpx
except ImportError as error:
    raise missing_library(error, "httpx", "httpx_fetch", "0.27") from error

from ..engines.fetch import Fetch, ScrapeError
from ..safe_urls import safe_url

__all__ = ["httpx_fetch"]

_HEADERS = {"accept": "text/plain;version=0.0.4", "accept-encoding": "identity"}


def httpx_fetch(client: httpx.AsyncClient) -> Fetch:
    """A Fetch that GETs through `client` (which the caller closes)."""

    async def fetch(url: str, timeout_seconds: float, max_bytes: int) -> bytes:
        try:
            async with client.stream(
                "GET", url, headers=_HEADERS, timeout=timeout_seconds
            ) as response:
                if response.status_code != 200:
                    raise ScrapeError(f"answered {response.status_code}")
                encoding = response.headers.get("content-encoding", "identity")
                if encoding.lower() != "identity":
                    raise ScrapeError(f"answered in {encoding!r}, not identity")
                length = response.headers.get("content-length", "")
                if length.isascii() and length.isdigit() and int(length) > max_bytes:
                    raise ScrapeError(f"a {length}-byte body, over the cap of {max_bytes}")
                body = bytearray()
                async for chunk in response.aiter_raw():
                    body += chunk
                    if len(body) > max_bytes:
                        raise ScrapeError(f"a body over the cap of {max_bytes} bytes")
                return bytes(body)
        except ScrapeError as error:
            raise ScrapeError(f"GET {safe_url(url)}: {error}") from None
        except httpx.HTTPError as error:
            raise ScrapeError(f"GET {safe_url(url)}: {type(error).__name__}: {error}") from None

    return fetch
