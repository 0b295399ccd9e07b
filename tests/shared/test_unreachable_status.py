"""A global limit whose Redis cannot be reached shows what an admission would get (issue 19,
item 3): `available` 0 while it refuses ("refuse"), the local fallback's free slots ("local"),
with `connected: false`, in the limit itself, in gym.concurrency.available and in the status
view's JSON and page. Before: `available` stayed the last global reading (3 of 4 here) while
every admission was refused."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

import httpx
import pytest
from gym_concurrency.middleware import ConcurrencyStatusView
from starlette.applications import Starlette
from starlette.routing import Route

from gym_concurrency import SharedLimit, observe_concurrency
from gym_concurrency.names import COMPONENT_ATTRIBUTE, CONCURRENCY_AVAILABLE_INSTRUMENT
from tests.metrics_capture import MetricsCapture
from tests.servers import UvicornServer
from tests.shared.helpers import Limits, wait_for
from tests.shared.redis_server import RedisServer

OUTAGE = {"lease_seconds": 4.0, "redis_timeout": 0.3}


def row_of(snapshot: dict[str, Any], component: str) -> dict[str, Any]:
    (row,) = [r for r in snapshot["limits"] if r["component"] == component]
    return row


def embedded_snapshot(page: str) -> dict[str, Any]:
    """The snapshot the status page is drawn from on load."""
    found = re.search(
        r'<script id="initial-snapshot" type="application/json">(.*?)</script>', page, re.S
    )
    assert found is not None, page[:2000]
    return json.loads(found[1])


@pytest.mark.parametrize(("mode", "available"), [("refuse", 0), ("local", 2)])
async def test_an_unreachable_global_limit_shows_what_an_admission_would_get(
    on_own: Limits, own_redis: RedisServer, metrics: MetricsCapture, mode: str, available: int
) -> None:
    component = f"unreachable_{uuid.uuid4().hex[:8]}"
    fallback = {"redis_unavailable": "local", "local_max_concurrent": 2} if mode == "local" else {}
    limit: SharedLimit = on_own(
        4, component=component, limit_name="shared_runs", timeout=5, **OUTAGE, **fallback
    )
    observe_concurrency(metrics.provider)
    assert await limit.enqueue() == "admitted"
    assert (limit.available, limit.connected) == (3, True)

    own_redis.pause()
    try:
        # Found out by an admission (bounded by redis_timeout) or by the heartbeat.
        if mode == "refuse":
            assert await asyncio.wait_for(limit.enqueue(), 5) == "unavailable"
        else:
            await wait_for(lambda: not limit.connected, 5.0, "the heartbeat to miss Redis")
        assert not limit.connected
        assert limit.available == available

        (point,) = [
            value
            for attributes, value in metrics.values(CONCURRENCY_AVAILABLE_INSTRUMENT).items()
            if (COMPONENT_ATTRIBUTE, component) in attributes
        ]
        assert point == available

        app = Starlette(routes=[Route("/concurrency", ConcurrencyStatusView())])
        with UvicornServer(app) as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
                shown = (await client.get("/concurrency", params={"format": "json"})).json()
                page = (await client.get("/concurrency", headers={"accept": "text/html"})).text
        for row in (row_of(shown, component), row_of(embedded_snapshot(page), component)):
            assert row["available"] == available
            assert row["global"]["connected"] is False
    finally:
        own_redis.resume()
    await wait_for(lambda: limit.connected, 5.0, "Redis reached again")
    # The admission that timed out while Redis was stopped may run once it resumes: the
    # renewal after the one that found Redis again gives that slot back (within a second).
    await wait_for(lambda: limit.available == 3, 2.0, "the timed-out admission's slot back")
    limit.release()
