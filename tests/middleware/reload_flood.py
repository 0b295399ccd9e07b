"""Issue 33's reload-shrink scenario over the wire: real uvicorn servers with a weighted route
(`json:cost`, flows by `x-tenant`) of size 8; a request holds 1, one of weight 8 (all of it)
waits at the head of the queue, a flood of weighted requests queues behind it; a settings
reload shrinks the limit to 2 (below the head's weight) and the app lets everything through.
Every request must finish, and soon. Used for a process limit (test_reload_shrink.py) and a
global one across two servers (tests/shared/test_middleware_reload_shrink.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI
from gym_concurrency.middleware import (
    ConcurrencySettings,
    RouteLimit,
    concurrency_middleware,
    reload_settings,
)

from gym_concurrency import Limit
from tests.middleware.apps import Gate, make_app
from tests.servers import eventually

SIZE, SHRUNK = 8, 2
COSTS = (1, 8, 3, 5, 2, 8, 1, 4, 6, 2)  # the flood's weights, in turn


def weighted(component: str, size: int, **fields: Any) -> ConcurrencySettings:
    """A route limit of `size` on POST /run, weighed by the body's `cost`, flows by tenant;
    `fields` go to the settings (a global limit's `redis_url`) or the route (its `scope`)."""
    route = {"scope": fields.pop("scope", "process")}
    limit = RouteLimit(
        path="/run",
        methods=["POST"],
        limit_name="episodes",
        max_concurrent=size,
        weight="json:cost",
        flow="header:x-tenant",
        **route,
    )
    return ConcurrencySettings(component=component, routes=[limit], **fields)


def reloadable_app(settings: Callable[[int], ConcurrencySettings]) -> tuple[FastAPI, Gate]:
    """make_app's app (POST /run held at its gate) with POST /reload?size=N: the reload a
    server would run on its loop (a signal handler, an admin route), here over HTTP."""
    app, gate = make_app(settings(SIZE))

    async def reload(size: int) -> dict[str, list[str]]:
        return {"changes": reload_settings(app, settings(size))}

    app.add_api_route("/reload", reload, methods=["POST"])
    return app, gate


def route_limit(app: FastAPI) -> Limit:
    """The running limit of the app's /run route."""
    return concurrency_middleware(app).limits.routes[0].limit


@dataclass
class Served:
    """One server of the scenario: its URL, its app's gate, its route's limit."""

    url: str
    gate: Gate
    limit: Limit

    def queued(self) -> int:
        """This process's waiters, queued here or (a global limit) in Redis, with a ticket."""
        waiters = getattr(self.limit, "_waiters", None)
        return self.limit.queue_depth if waiters is None else len(waiters.registered_ids())


@dataclass
class Outcome:
    """How the scenario ended: every request's status (None: unfinished after `within`), and
    the seconds from the reload to the last answer (or to `within`)."""

    statuses: list[int | None]
    drain_seconds: float

    @property
    def unfinished(self) -> int:
        return self.statuses.count(None)


async def flood_and_shrink(servers: list[Served], flood: int = 40, within: float = 20.0) -> Outcome:
    """Run the scenario across `servers` (the head waiter on the last one, the flood spread
    over all); the reload is sent to each server, as an operator would."""
    first, last = servers[0], servers[-1]
    async with httpx.AsyncClient(timeout=within + 30) as client:

        def post(served: Served, n: int, cost: int) -> asyncio.Task[httpx.Response]:
            headers = {"x-tenant": f"t{n % 3}"}
            run = client.post(served.url + "/run", json={"cost": cost}, headers=headers)
            return asyncio.ensure_future(run)

        tasks = [post(first, 0, 1)]
        try:
            await eventually(lambda: first.gate.inside == 1, "the first request to get in")
            tasks.append(post(last, 1, SIZE))  # 1 + 8 > 8: chosen next, capacity kept for it
            await eventually(lambda: last.queued() == 1, "the heavy request to queue", 10.0)
            for n in range(flood):
                tasks.append(post(servers[n % len(servers)], n + 2, COSTS[n % len(COSTS)]))
            waiting = flood + 1
            await eventually(
                lambda: sum(s.limit.queue_depth for s in servers) == waiting,
                "the flood to queue",
                10.0,
            )
            for served in servers:
                reloaded = await client.post(served.url + "/reload", params={"size": SHRUNK})
                reloaded.raise_for_status()
            for served in servers:
                served.gate.open = True
            started = time.monotonic()
            await asyncio.wait(tasks, timeout=within)
            drained = time.monotonic() - started
            statuses = [t.result().status_code if t.done() else None for t in tasks]
        finally:
            for served in servers:
                served.gate.open = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return Outcome(statuses, drained)
