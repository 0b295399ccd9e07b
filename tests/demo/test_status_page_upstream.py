"""The status page in headless Chromium shows a limit's rate budgets (remaining of each a
minute) on a line of its own, as text; a limit without one shows no such line."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
from chromium import Chromium
from gym_concurrency.middleware.status import ConcurrencyStatusView
from servers import UvicornServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gym_concurrency import MeteredSemaphore
from gym_concurrency.limits.rate_budget import RateBudget

COMPONENT = f"page-upstream-{uuid.uuid4().hex[:8]}"
UPSTREAM_LINES = f"""[...document.querySelectorAll('.limit')]
    .filter(e => e.dataset.component === '{COMPONENT}')
    .map(e => [e.dataset.limitName, (e.querySelector('.upstream') || {{}}).innerText || null])"""


def test_the_page_shows_each_budgets_remaining(tmp_path: Path) -> None:
    budget = RateBudget(tokens_per_minute=1000, requests_per_minute=100)
    model = MeteredSemaphore(4, component=COMPONENT, limit_name="model", budget=budget)
    plain = MeteredSemaphore(4, component=COMPONENT, limit_name="plain")

    async def spend(request: Request) -> PlainTextResponse:
        await model.acquire(tokens=200)  # charged in full at once
        model.release()
        return PlainTextResponse("spent")

    app = Starlette(
        routes=[
            Route("/concurrency", ConcurrencyStatusView()),
            Route("/spend", spend, methods=["POST"]),
        ]
    )
    with UvicornServer(app) as server, Chromium(tmp_path) as browser:
        httpx.post(f"{server.url}/spend", timeout=5)
        browser.navigate(f"{server.url}/concurrency")
        shown = dict(browser.evaluate(UPSTREAM_LINES))
    assert shown == {
        "model": "tokens 800 / 1000 a minute · requests 99 / 100 a minute",
        "plain": None,
    }
    del plain
