"""The client limit of a goal run's client process (benchmarks/_rate_budget_client.py,
_engine_client.py), made as a server makes it: a `ConcurrencySettings` with one `ClientLimit`
(given as JSON by the driver), the limits the middleware would build from it
(`ConcurrencyLimits`), global ones connected as the middleware connects them at start, and an
httpx client over its `transport()` or an aiohttp session with its `middleware()`.

`expect` names what issue 35's wiring must have given the limit (`budget`, `engine`): a limit
made without it ends the process with "needs issue 35's wiring: ..." rather than a run that
silently measures a plain limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from gym_concurrency.middleware import ConcurrencySettings
from gym_concurrency.middleware.clients import LimitedClient
from gym_concurrency.middleware.limits import ConcurrencyLimits

from gym_concurrency.limits import Limit
from gym_concurrency.upstream_view import upstream_statistics

__all__ = ["client_limit", "configured_limit", "limit_figures", "released", "session_limit"]

LIMIT_NAME = "upstream"  # the one client limit of a goal run's settings
CONNECTIONS = 512  # more than any run keeps in flight a process: httpx's pool never binds


@contextlib.asynccontextmanager
async def configured_limit(settings_json: str, expect: list[str]) -> AsyncIterator[LimitedClient]:
    """The settings' client limit, as the middleware builds it: global ones connected, and
    their leases (and an engine signal's poller) closed on exit."""
    settings = ConcurrencySettings.model_validate(json.loads(settings_json))
    limits = ConcurrencyLimits(settings)
    configured = limits.client(LIMIT_NAME)
    missing = [part for part in expect if getattr(configured.limit, part, None) is None]
    if missing:
        raise SystemExit(
            f"needs issue 35's wiring: the limit made from {settings.clients[0]!r} has no "
            + ", ".join(f"`limit.{part}`" for part in missing)
        )
    for shared in limits.shared():
        if not await shared.connect():
            raise SystemExit(f"the limit's Redis ({settings.redis_url}) cannot be reached")
    try:
        yield configured
    finally:
        for shared in limits.shared():
            await shared.close()
        engine = getattr(configured.limit, "engine", None)
        if engine is not None and hasattr(engine, "aclose"):
            await engine.aclose()


@contextlib.asynccontextmanager
async def client_limit(
    settings_json: str, base_url: str, expect: list[str], warm: int = 0
) -> AsyncIterator[tuple[httpx.AsyncClient, Limit]]:
    """An httpx client to `base_url` whose calls go through the settings' client limit, and
    that limit; closed (a global limit's leases given back) on exit. `warm` connections are
    opened first (GET /stats past the limit), so that a burst does not open them all."""
    async with configured_limit(settings_json, expect) as configured:
        pool = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
        raw = httpx.AsyncHTTPTransport(limits=pool)
        await _warm(raw, base_url, min(warm, CONNECTIONS))
        transport = configured.transport(raw)
        async with httpx.AsyncClient(base_url=base_url, transport=transport, timeout=120) as client:
            yield client, configured.limit


@contextlib.asynccontextmanager
async def session_limit(
    settings_json: str, base_url: str, expect: list[str], warm: int = 0
) -> AsyncIterator[tuple[aiohttp.ClientSession, Limit]]:
    """As `client_limit`, an aiohttp session (the settings' client limit as its middleware)."""
    async with configured_limit(settings_json, expect) as configured:
        connector = aiohttp.TCPConnector(limit=CONNECTIONS)
        timeout = aiohttp.ClientTimeout(total=120)
        middlewares = (configured.middleware(),)
        async with aiohttp.ClientSession(
            base_url, connector=connector, middlewares=middlewares, timeout=timeout
        ) as session:
            await _warm_session(session, min(warm, CONNECTIONS))
            yield session, configured.limit


async def _warm(transport: httpx.AsyncHTTPTransport, base_url: str, connections: int) -> None:
    """Open `connections` pooled connections at once, each with a GET /stats read in full."""
    import asyncio

    async def one() -> None:
        response = await transport.handle_async_request(httpx.Request("GET", base_url + "/stats"))
        await response.aread()
        await response.aclose()

    await asyncio.gather(*(one() for _ in range(connections)))


async def _warm_session(session: aiohttp.ClientSession, connections: int) -> None:
    """As `_warm`, through `session` past its middlewares (the limit)."""
    import asyncio

    async def one() -> None:
        async with session.get("/stats", middlewares=()) as response:
            await response.read()

    await asyncio.gather(*(one() for _ in range(connections)))


def limit_figures(limit: Limit) -> dict[str, Any]:
    """The limit's counters at the end, plain numbers only (a budget's and an engine
    signal's statistics too, when it has them)."""
    figures: dict[str, Any] = {
        k: v
        for k, v in dataclasses.asdict(limit.statistics()).items()
        if isinstance(v, int | float)
    }
    # As the observer reads them: a global limit's budget is the one kept in Redis.
    for part, reading in zip(("budget", "engine"), upstream_statistics(limit), strict=True):
        if reading is not None:
            figures[part] = _plain(dataclasses.asdict(reading))
    return figures


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if isinstance(value, int | float | str | bool | None) else repr(value)


async def released() -> tuple[float, float]:
    """Say "ready" on stdout, read the start moment (time.monotonic()) the driver sends on
    stdin (`_goal_parts.release`), sleep until it; the moment, and how late this process
    already was (>= 0)."""
    import asyncio

    print("ready", flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    moment = float(line)
    late = time.monotonic() - moment
    if late < 0:
        await asyncio.sleep(-late)
    return moment, max(0.0, late)
