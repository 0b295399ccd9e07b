"""A moving limit on the status view (its snapshot marks an adaptive limit; the page draws each
limit's history: limit against active and queued) and on the Grafana dashboard."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    ConcurrencyStatusView,
    RouteLimit,
    reload_settings,
)
from gym_concurrency.middleware.status import status_snapshot
from servers import UvicornServer, wait_until

from tests.registry import limits_of

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "gym-concurrency.json"


def route(size: int, **fields: Any) -> RouteLimit:
    return RouteLimit(path="/work", limit_name="work", max_concurrent=size, **fields)


def app_with(settings: ConcurrencySettings) -> FastAPI:
    app = FastAPI()

    @app.post("/test-reload")
    async def test_reload() -> list[str]:
        adaptive = {"min_concurrent": 2, "max_concurrent": 9}
        moved = settings.model_copy(update={"routes": [route(7, adaptive=adaptive)]})
        return reload_settings(app, ConcurrencySettings.model_validate(moved.model_dump()))

    @app.post("/work")
    async def work() -> dict[str, bool]:
        await asyncio.sleep(0.001)
        return {"ok": True}

    app.add_route("/concurrency", ConcurrencyStatusView(refresh_seconds=0.2))
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    return app


async def test_the_snapshot_marks_an_adaptive_limit_with_its_bounds(component: str):
    adaptive = {"min_concurrent": 2, "max_concurrent": 40, "algorithm": "aimd"}
    app = app_with(ConcurrencySettings(component=component, routes=[route(8, adaptive=adaptive)]))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        await client.post("/work")
        row = next(r for r in status_snapshot()["limits"] if r["component"] == component)
        assert row["adaptive"] == {"algorithm": "aimd", "min": 2, "max": 40, "baseline_ms": None}
        await asyncio.gather(*(client.post("/work") for _ in range(40)))
        row = next(r for r in status_snapshot()["limits"] if r["component"] == component)
        assert row["adaptive"]["baseline_ms"] > 0  # a window closed: the baseline is measured
        reload_settings(app, ConcurrencySettings(component=component, routes=[route(8)]))
        row = next(r for r in status_snapshot()["limits"] if r["component"] == component)
        assert "adaptive" not in row  # static again: the row is a static limit's


def test_the_dashboard_draws_each_limit_over_time_against_active_and_queued():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    moving = panels[0]
    assert moving["repeat"] == "limit"  # one panel per limit
    assert moving["gridPos"]["y"] == 0  # the dashboard's first row
    metrics = [t["expr"].split("(")[2].split("{")[0].strip() for t in moving["targets"]]
    assert metrics == [
        "gym_concurrency_limit",
        "gym_concurrency_active",
        "gym_concurrency_queue_depth",
    ]
    assert all('nemo_gym_concurrency_limit_name=~"$limit"' in t["expr"] for t in moving["targets"])
    limit_style = next(
        o for o in moving["fieldConfig"]["overrides"] if o["matcher"]["options"] == "limit"
    )
    assert {"id": "custom.lineInterpolation", "value": "stepAfter"} in limit_style["properties"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    tops = sorted((p["gridPos"]["y"], p["gridPos"]["x"]) for p in panels[1:])
    assert tops[0][0] >= moving["gridPos"]["h"]  # nothing drawn over it


@pytest.fixture
def chromium_dir() -> Iterator[Path]:
    demo = str(ROOT / "tests" / "demo")
    added = demo not in sys.path
    if added:
        sys.path.insert(0, demo)
    yield Path(demo)
    if added:
        sys.path.remove(demo)


def test_the_page_draws_the_limit_moving_against_active_and_queued(
    chromium_dir: Path, tmp_path: Path
):
    from chromium import Chromium  # tests/demo's headless browser (skips without chromium)

    component = f"moving-{uuid.uuid4().hex[:8]}"
    app = app_with(ConcurrencySettings(component=component, routes=[route(3)]))
    state = f"""[...document.querySelectorAll('.limit')]
        .filter(e => e.dataset.component === '{component}')
        .map(e => ({{limit: e.dataset.limit, adaptive: e.dataset.adaptive,
                     points: e.querySelector('.history .limit-line').getAttribute('d'),
                     last: e.querySelector('.history .limit-line').dataset.last,
                     lines: e.querySelectorAll('.history path').length,
                     text: e.innerText}}))[0]"""
    with UvicornServer(app) as server, Chromium(tmp_path) as browser:
        httpx.post(server.url + "/work")
        browser.navigate(f"{server.url}/concurrency?refresh=0.2")
        wait_until(lambda: browser.evaluate(state) is not None, what="the limit on the page")
        shown = browser.evaluate(state)
        assert shown["lines"] == 3  # limit, active, queued
        assert shown["last"] == "3"
        # The app's own way to reload (here a test route; a real app puts it behind auth).
        assert httpx.post(server.url + "/test-reload").status_code == 200
        assert limits_of(component)["work"].limit == 7
        wait_until(lambda: browser.evaluate(state)["last"] == "7", what="the page to redraw")
        shown = browser.evaluate(state)
        assert shown["adaptive"] == "true"
        assert "adaptive gradient 2..9" in shown["text"]
        path = shown["points"]
        assert "V" in path  # a step: the line went from 3 up to 7
        browser.screenshot(tmp_path / "moving.png")
