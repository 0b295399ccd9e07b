"""The upstream OpenAI-compatible model: one shared httpx.AsyncClient with timeouts set."""

from __future__ import annotations

from typing import Any

import httpx

from .config import DemoConfig


class UpstreamError(Exception):
    """The upstream model could not be reached, timed out or answered with an error."""

    def __init__(self, message: str, *, status_code: int = 502) -> None:
        super().__init__(message)
        self.status_code = status_code


def make_client(config: DemoConfig) -> httpx.AsyncClient:
    """The process's one client to the upstream model: pooled connections, bounded waits."""
    headers = {}
    if config.upstream_api_key:
        headers["Authorization"] = f"Bearer {config.upstream_api_key}"
    timeout = httpx.Timeout(config.upstream_timeout_seconds, connect=5.0)
    # The pool is larger than any demo limit so that limits, not the pool, decide who waits.
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    return httpx.AsyncClient(
        base_url=config.upstream_base_url.rstrip("/") + "/",
        headers=headers,
        timeout=timeout,
        limits=limits,
    )


async def forward(client: httpx.AsyncClient, body: bytes) -> httpx.Response:
    """POST `body` as is to the upstream chat completions endpoint; any answer is returned."""
    return await _post(client, content=body, headers={"Content-Type": "application/json"})


async def complete(client: httpx.AsyncClient, model: str, prompt: str) -> str:
    """The assistant's answer to one user `prompt`; UpstreamError for any failure."""
    payload: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    response = await _post(client, json=payload)
    if response.status_code != 200:
        raise UpstreamError(f"upstream model answered {response.status_code}")
    try:
        return str(response.json()["choices"][0]["message"]["content"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise UpstreamError("upstream model answered with no choices[0].message.content") from exc


async def _post(client: httpx.AsyncClient, **request: Any) -> httpx.Response:
    try:
        return await client.post("chat/completions", **request)
    except httpx.TimeoutException as exc:
        raise UpstreamError(
            f"upstream model timed out ({type(exc).__name__})", status_code=504
        ) from exc
    except httpx.HTTPError as exc:
        raise UpstreamError(f"upstream model unreachable ({type(exc).__name__}: {exc})") from exc
