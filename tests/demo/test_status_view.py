"""The status view's JSON snapshot and content negotiation, in process (no browser)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import httpx
import pytest
from gym_concurrency.middleware.status import ConcurrencyStatusView, status_snapshot
from starlette.applications import Starlette
from starlette.routing import Route

from gym_concurrency import (
    COMPONENT_ATTRIBUTE,
    MeteredSemaphore,
    QueueFullError,
    observe_concurrency,
    resources_operation,
    set_flow_names_per_limit,
)
from gym_concurrency.names import (
    DEFAULT_FLOW_NAMES_PER_LIMIT,
    FLOW_ATTRIBUTE,
    FLOW_HELD_INSTRUMENT,
)


def client_for(view: ConcurrencyStatusView) -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/concurrency", view)])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def rows(snapshot: dict[str, Any], component: str) -> dict[str, dict[str, Any]]:
    return {row["limit_name"]: row for row in snapshot["limits"] if row["component"] == component}


@pytest.fixture
def component() -> str:
    """A component name no other test's semaphores use (the registry is process-wide)."""
    return f"status-test-{uuid.uuid4().hex[:8]}"


async def test_the_snapshot_shows_each_limit_full_with_its_queue_and_failures(component: str):
    episodes = MeteredSemaphore(
        2, component=component, limit_name="episodes", timeout=0.01, max_queue=1
    )
    await episodes.acquire()
    await episodes.acquire()
    with pytest.raises(TimeoutError):
        await episodes.acquire()
    waiter = asyncio.create_task(episodes.acquire())
    await asyncio.sleep(0)
    with pytest.raises(QueueFullError):
        await episodes.acquire()
    async with client_for(ConcurrencyStatusView()) as client:
        response = await client.get("/concurrency")
    waiter.cancel()
    assert response.headers["cache-control"] == "no-store"
    assert rows(response.json(), component) == {
        "episodes": {
            "component": component,
            "limit_name": "episodes",
            "server": None,
            "limit": 2,
            "active": 2,
            "available": 0,
            "queue_depth": 1,
            "queued_weight": 1,
            "timeouts": 1,
            "cancelled": 0,
            "shed": 1,
            "timeout_seconds": 0.01,
            "max_queue": 1,
            "flows": [{"flow": "default", "held": 2, "queue_depth": 1, "queued_weight": 1}],
            "other_flows": None,
        }
    }


async def test_semaphores_with_the_same_names_are_one_limit(component: str):
    first = MeteredSemaphore(2, component=component, limit_name="judge", server="a")
    second = MeteredSemaphore(3, component=component, limit_name="judge", server="a")
    other = MeteredSemaphore(1, component=component, limit_name="judge", server="b")
    await first.acquire()
    await second.acquire()
    async with client_for(ConcurrencyStatusView()) as client:
        snapshot = (await client.get("/concurrency?format=json")).json()
    judged = [row for row in snapshot["limits"] if row["component"] == component]
    by_server = {row["server"]: (row["limit"], row["active"]) for row in judged}
    assert by_server == {"a": (5, 2), "b": (1, 0)}
    assert other.limit == 1  # keeps `other` alive until the snapshot was taken


async def test_each_limit_lists_its_busiest_flows_and_sums_the_rest(component: str):
    judge = MeteredSemaphore(20, component=component, limit_name="judge")
    twin = MeteredSemaphore(4, component=component, limit_name="judge")  # one limit with judge
    idle = MeteredSemaphore(2, component=component, limit_name="idle")
    for flow, weight in [("env-a", 6), ("env-b", 5), ("env-c", 1), ("env-d", 2), (None, 6)]:
        await judge.acquire(weight, flow)
    await twin.acquire(3, "env-c")
    waiters = [asyncio.create_task(judge.acquire(w, f)) for f, w in [("env-e", 4), ("env-d", 1)]]
    await asyncio.sleep(0)
    async with client_for(ConcurrencyStatusView(flows_per_limit=3)) as client:
        snapshot = (await client.get("/concurrency")).json()
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    shown = rows(snapshot, component)
    assert shown["judge"]["flows"] == [
        {"flow": "default", "held": 6, "queue_depth": 0, "queued_weight": 0},
        {"flow": "env-a", "held": 6, "queue_depth": 0, "queued_weight": 0},
        {"flow": "env-b", "held": 5, "queue_depth": 0, "queued_weight": 0},
    ]
    # env-c (1 + 3 held), env-d (2 held, 1 queued), env-e (4 queued): 3 flows beyond the top 3.
    assert shown["judge"]["other_flows"] == {
        "flows": 3,
        "held": 6,
        "queue_depth": 2,
        "queued_weight": 5,
    }
    assert (shown["judge"]["active"], shown["judge"]["queued_weight"]) == (23, 5)
    assert shown["idle"]["flows"] == []
    assert shown["idle"]["other_flows"] is None
    assert idle.limit == 2  # kept alive until the snapshot was taken


async def test_the_view_names_busy_flows_the_metrics_show_in_rank_slots(
    metrics: Any, component: str
):
    observe_concurrency(metrics.provider)
    set_flow_names_per_limit(2)
    limit = MeteredSemaphore(20, component=component, limit_name="judge")
    try:
        for flow, weight in [("first", 1), ("second", 1), ("late", 5)]:
            await limit.acquire(weight, flow)
            metrics.collect()  # first and second take the limit's two names
        flows = {
            dict(attributes)[FLOW_ATTRIBUTE]: value
            for attributes, value in metrics.values(FLOW_HELD_INSTRUMENT).items()
            if dict(attributes).get(COMPONENT_ATTRIBUTE) == component
        }
    finally:
        set_flow_names_per_limit(DEFAULT_FLOW_NAMES_PER_LIMIT)
    assert flows == {"first": 1, "second": 1, "top:1": 5}
    shown = rows(status_snapshot(), component)["judge"]["flows"]
    assert [(row["flow"], row["held"]) for row in shown] == [
        ("late", 5),
        ("first", 1),
        ("second", 1),
    ]


async def test_a_hostile_flow_key_is_data_cut_to_64_characters(component: str):
    hostile = "</script><img src=x onerror=alert(1)>" + "y" * 100
    limit = MeteredSemaphore(2, component=component, limit_name="judge")
    async with limit.hold(1, hostile), client_for(ConcurrencyStatusView()) as client:
        snapshot = (await client.get("/concurrency?format=json")).json()
        page = (await client.get("/concurrency?format=html")).text
    (flow,) = rows(snapshot, component)["judge"]["flows"]
    assert flow["flow"] == hostile[:63] + "…"
    assert "</script><img" not in page
    assert "\\u003c/script>\\u003cimg src=x onerror=alert(1)>" in page


def test_the_number_of_flows_shown_is_checked_at_construction():
    with pytest.raises(ValueError, match=r"flows_per_limit must be >= 0 \(0: only their sum\)"):
        ConcurrencyStatusView(flows_per_limit=-1)
    with pytest.raises(TypeError, match=r"flows_per_limit must be an int, got '3'"):
        ConcurrencyStatusView(flows_per_limit="3")  # type: ignore[arg-type]


async def test_operations_show_how_many_wait_and_run(metrics: Any, component: str):
    limit = MeteredSemaphore(1, component=component, limit_name="tools")
    entered = asyncio.Event()
    release = asyncio.Event()

    async def tool() -> None:
        async with resources_operation(limit, "tool", "thread", meter_provider=metrics.provider):
            entered.set()
            await release.wait()

    tasks = [asyncio.create_task(tool()) for _ in range(3)]
    await entered.wait()
    await asyncio.sleep(0)
    async with client_for(ConcurrencyStatusView()) as client:
        snapshot = (await client.get("/concurrency")).json()
    release.set()
    await asyncio.gather(*tasks)
    assert {"operation": "tool", "executor": "thread", "queued": 2, "active": 1} in snapshot[
        "operations"
    ]


async def test_a_browser_gets_the_page_and_everyone_else_json():
    async with client_for(ConcurrencyStatusView(title="Demo <limits>")) as client:
        page = await client.get("/concurrency", headers={"accept": "text/html,*/*"})
        forced = await client.get("/concurrency?format=json", headers={"accept": "text/html"})
        curl = await client.get("/concurrency", headers={"accept": "*/*"})
        head = await client.head("/concurrency")
    assert page.headers["content-type"].startswith("text/html")
    assert "<title>Demo &lt;limits&gt;</title>" in page.text
    assert "const REFRESH_MS = 1000;" in page.text
    assert forced.headers["content-type"] == "application/json"
    assert curl.headers["content-type"] == "application/json"
    assert head.status_code == 200


async def test_no_limit_name_can_end_the_embedded_snapshot_early(component: str):
    hostile = MeteredSemaphore(1, component=component, limit_name="</script><b>x</b>")
    async with client_for(ConcurrencyStatusView()) as client:
        page = (await client.get("/concurrency?format=html")).text
    assert "</script><b>" not in page
    assert "\\u003c/script>\\u003cb>x\\u003c/b>" in page
    assert hostile.limit == 1


@pytest.mark.parametrize(
    ("request_line", "status", "message"),
    [
        ("POST /concurrency", 405, "Method Not Allowed"),
        ("GET /concurrency?format=xml", 400, "format must be json or html, got 'xml'"),
        ("GET /concurrency?format=html&refresh=0", 400, "refresh must be a number of seconds"),
        ("GET /concurrency?format=html&refresh=soon", 400, "got 'soon'"),
    ],
)
async def test_bad_requests_are_refused_naming_what_was_wrong(
    request_line: str, status: int, message: str
):
    method, target = request_line.split(" ")
    async with client_for(ConcurrencyStatusView()) as client:
        response = await client.request(method, target)
    assert response.status_code == status
    assert message in response.text


def test_a_refresh_interval_out_of_bounds_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"refresh_seconds must be between 0\.2 and 3600"):
        ConcurrencyStatusView(refresh_seconds=0.01)


def test_a_limit_that_cannot_be_read_is_left_out_and_the_rest_still_shows(
    caplog: pytest.LogCaptureFixture,
):
    class Broken(MeteredSemaphore):
        @property
        def active(self) -> int:
            raise RuntimeError("broken reading")

    broken = Broken(1, component="view_broken", limit_name="b")
    fine = MeteredSemaphore(3, component="view_fine", limit_name="f")
    with caplog.at_level(logging.ERROR, logger="gym_concurrency.middleware.status"):
        rows = {r["component"]: r for r in status_snapshot()["limits"]}
        status_snapshot()
    assert "view_broken" not in rows
    assert rows["view_fine"]["limit"] == fine.limit
    assert len([r for r in caplog.records if "cannot read" in r.getMessage()]) == 1
    del broken
