"""The status page in headless Chromium: it renders a bar per limit, shows a saturated limit
as full, and refreshes itself when the limit's state changes."""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chromium import Chromium
from demo_processes import wait_for
from gym_concurrency.middleware.status import ConcurrencyStatusView
from servers import UvicornServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gym_concurrency import MeteredSemaphore

COMPONENT = f"page-test-{uuid.uuid4().hex[:8]}"
LIMIT_STATE = f"""[...document.querySelectorAll('.limit')]
    .filter(e => e.dataset.component === '{COMPONENT}')
    .map(e => ({{name: e.dataset.limitName, state: e.dataset.state, active: e.dataset.active,
                 queued: e.dataset.queueDepth, text: e.innerText}}))"""


class Limits:
    """Semaphores the test fills and empties through HTTP, on the server's own event loop."""

    def __init__(self) -> None:
        self.episodes = MeteredSemaphore(3, component=COMPONENT, limit_name="episodes", timeout=60)
        self.hostile = MeteredSemaphore(1, component=COMPONENT, limit_name="<b>bold</b>")
        self.held = 0
        self.waiters: list[asyncio.Task[Any]] = []

    async def fill(self, request: Request) -> PlainTextResponse:
        while self.episodes.available:
            await self.episodes.acquire()
            self.held += 1
        self.waiters += [asyncio.create_task(self.episodes.acquire()) for _ in range(2)]
        await asyncio.sleep(0)
        return PlainTextResponse("full")

    async def empty(self, request: Request) -> PlainTextResponse:
        for waiter in self.waiters:
            waiter.cancel()
        await asyncio.gather(*self.waiters, return_exceptions=True)
        self.waiters.clear()
        for _ in range(self.held):
            self.episodes.release()
        self.held = 0
        return PlainTextResponse("empty")


@pytest.fixture
def server() -> Iterator[str]:
    limits = Limits()
    app = Starlette(
        routes=[
            Route("/concurrency", ConcurrencyStatusView(title="Demo limits")),
            Route("/fill", limits.fill, methods=["POST"]),
            Route("/empty", limits.empty, methods=["POST"]),
        ]
    )
    with UvicornServer(app) as running:
        yield running.url


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_page_shows_a_full_limit_and_refreshes_when_it_empties(server: str, tmp_path: Path):
    httpx.post(f"{server}/fill", timeout=5)
    with Chromium(tmp_path) as browser:
        browser.navigate(f"{server}/concurrency?refresh=0.3")
        shown = {row["name"]: row for row in browser.evaluate(LIMIT_STATE)}
        assert shown["episodes"]["state"] == "full"
        assert shown["episodes"]["active"] == "3"
        assert shown["episodes"]["queued"] == "2"
        assert "FULL" in shown["episodes"]["text"]
        assert "active 3 / limit 3, available 0, queued 2" in shown["episodes"]["text"]
        # A limit name is text, never markup.
        assert shown["<b>bold</b>"]["state"] == "idle"
        assert browser.evaluate("document.querySelectorAll('#limits b').length") == 0
        bar = browser.evaluate(
            # This test's limit: an earlier test's limit still alive may be full too.
            f'document.querySelector(\'.limit[data-component="{COMPONENT}"]'
            "[data-state=full] .fill').style.width"
        )
        assert bar == "100%"
        width, height = png_size(browser.screenshot(tmp_path / "full.png"))
        assert width == 900
        assert height > 300

        httpx.post(f"{server}/empty", timeout=5)

        def emptied() -> bool:
            rows = {row["name"]: row for row in browser.evaluate(LIMIT_STATE)}
            return rows["episodes"]["state"] == "idle" and rows["episodes"]["queued"] == "0"

        wait_for(emptied, 10, "the page to show the emptied limit")
        assert "updated" in browser.evaluate("document.getElementById('updated').textContent")
        browser.screenshot(tmp_path / "idle.png")


HOSTILE_FLOW = '<img src=x onerror="window.pwned = true">' + "z" * 80
FLOW_ROWS = f"""[...document.querySelectorAll('.limit')]
    .filter(e => e.dataset.component === '{COMPONENT}' && e.dataset.limitName === 'judge')
    .flatMap(e => [...e.querySelectorAll('.flows tr:not(:first-child)')])
    .map(tr => ({{flow: tr.dataset.flow ?? null, other: tr.dataset.otherFlows ?? null,
                  cells: [...tr.querySelectorAll('td')].map(td => td.textContent)}}))"""


def test_the_page_lists_the_busiest_flows_as_text(tmp_path: Path):
    judge = MeteredSemaphore(40, component=COMPONENT, limit_name="judge")

    async def hold(request: Request) -> PlainTextResponse:
        # On the server's loop: 7 flows, the hostile one the busiest; the 2 lightest summed.
        for flow, weight in [(HOSTILE_FLOW, 9), ("env-a", 8), ("env-b", 7), (None, 6)]:
            await judge.acquire(weight, flow)
        for flow, weight in [("env-c", 5), ("env-d", 2), ("env-e", 1)]:
            await judge.acquire(weight, flow)
        return PlainTextResponse("held")

    app = Starlette(
        routes=[
            Route("/concurrency", ConcurrencyStatusView()),
            Route("/hold", hold, methods=["POST"]),
        ]
    )
    with UvicornServer(app) as server, Chromium(tmp_path) as browser:
        httpx.post(f"{server.url}/hold", timeout=5)
        browser.navigate(f"{server.url}/concurrency")
        shown = browser.evaluate(FLOW_ROWS)
        cut = HOSTILE_FLOW[:63] + "…"
        assert shown == [
            {"flow": cut, "other": None, "cells": [cut, "9", "0", "0"]},
            {"flow": "env-a", "other": None, "cells": ["env-a", "8", "0", "0"]},
            {"flow": "env-b", "other": None, "cells": ["env-b", "7", "0", "0"]},
            {"flow": "default", "other": None, "cells": ["default", "6", "0", "0"]},
            {"flow": "env-c", "other": None, "cells": ["env-c", "5", "0", "0"]},
            {"flow": None, "other": "2", "cells": ["other (2 flows)", "3", "0", "0"]},
        ]
        # A flow key is text, never markup: no element made of it, no script run.
        assert browser.evaluate("document.querySelectorAll('#limits img').length") == 0
        assert browser.evaluate("window.pwned === undefined") is True
        browser.screenshot(tmp_path / "flows.png")
