"""One way to make a limited call through each transport, so a test can run against both:
httpx with LimitedTransport, aiohttp with limited_middleware."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import aiohttp
import httpx

from gym_concurrency.clients import (
    LimitedMiddleware,
    LimitedTransport,
    RetryPolicy,
    limited_middleware,
)

__all__ = ["KINDS", "Caller"]

KINDS = ("httpx", "aiohttp")


class Caller:
    """A client of `kind` whose calls go through `limit` (`kw`: the transport's or middleware's
    other arguments); `get(path)` reads the whole body and answers (status, body)."""

    def __init__(self, kind: str, url: str, limit: Any, retry: RetryPolicy | None, **kw: Any):
        self.kind = kind
        self.view: LimitedTransport | LimitedMiddleware  # its limit, policy and counts
        if kind == "httpx":
            self.view = transport = LimitedTransport(limit, retry=retry, **kw)
            self._httpx = httpx.AsyncClient(transport=transport, base_url=url, timeout=30)
        else:
            self.view = middleware = limited_middleware(limit, retry=retry, **kw)
            self._aiohttp = aiohttp.ClientSession(base_url=url, middlewares=(middleware,))

    async def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        if self.kind == "httpx":
            response = await self._httpx.get(path, headers=headers)
            return response.status_code, response.content
        async with self._aiohttp.get(path, headers=headers) as reply:
            return reply.status, await reply.read()

    async def post(
        self, path: str, json: Any = None, *, content: bytes | None = None
    ) -> tuple[int, bytes]:
        """POST `json` as the body, or `content` as it is (in memory either way: weight and
        flow functions can read it)."""
        if self.kind == "httpx":
            sent = {"json": json} if content is None else {"content": content}
            response = await self._httpx.post(path, **sent)
            return response.status_code, response.content
        body = {"json": json} if content is None else {"data": content}
        async with self._aiohttp.post(path, **body) as reply:
            return reply.status, await reply.read()

    async def __aenter__(self) -> Caller:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.kind == "httpx":
            await self._httpx.aclose()
        else:
            await self._aiohttp.close()
