"""Flows and weights through the middleware, over a real uvicorn: where a request's flow and
weight come from, that a quiet flow goes ahead of a flood, that a weighed request holds its
weight, that bodies read ahead still reach the app whole, and strict settings."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from pydantic import ValidationError
from servers import UvicornServer, eventually

from gym_concurrency import COMPONENT_ATTRIBUTE, set_flow_names_per_limit
from gym_concurrency.names import DEFAULT_FLOW_NAMES_PER_LIMIT, FLOW_ATTRIBUTE, FLOW_HELD_INSTRUMENT
from tests.metrics_capture import MetricsCapture
from tests.registry import limits_of


class Held:
    """Requests held inside the app until released by id; the order they got in."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.released: set[str] = set()

    def release(self, *ids: str) -> None:
        self.released.update(ids)


def served_app(component: str, held: Held, **route: Any) -> FastAPI:
    meter_provider = route.pop("meter_provider", None)
    settings_fields = {k: route.pop(k) for k in list(route) if k.startswith(_SETTINGS_FIELDS)}
    route = {"limit_name": "work", "max_concurrent": 2, "path": "/work/{env}", **route}
    settings = ConcurrencySettings(
        component=component, routes=[RouteLimit(**route)], **settings_fields
    )
    app = FastAPI()

    @app.post("/work/{env}")
    async def work(env: str, request: Request, id: str) -> dict[str, Any]:
        body = await request.body()
        held.order.append(id)
        while id not in held.released:  # noqa: ASYNC110 - released from the test's loop
            await asyncio.sleep(0.002)
        return {"id": id, "bytes": len(body)}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings, meter_provider=meter_provider)
    return app


_SETTINGS_FIELDS = ("max_queued", "flow_series_per_limit", "flow_names_per_limit")


async def post(client: httpx.AsyncClient, id: str, **kwargs: Any) -> httpx.Response:
    env = kwargs.pop("env", "e1")
    return await client.post(
        f"/work/{env}", params={"id": id, **kwargs.pop("params", {})}, **kwargs
    )


async def test_a_quiet_flow_goes_ahead_of_a_flood(component: str) -> None:
    held = Held()
    with UvicornServer(served_app(component, held, flow="header:x-flow")) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            flood = [
                asyncio.create_task(post(client, f"f{i}", headers={"x-flow": "flood"}))
                for i in range(8)
            ]
            await eventually(lambda: limit.queue_depth == 6, "the flood to queue")
            quiet = asyncio.create_task(post(client, "q", headers={"x-flow": "quiet"}))
            await eventually(lambda: limit.queue_depth == 7, "the quiet request to queue")
            assert {s.flow: s.held for s in limit.flow_statistics()} == {"flood": 2, "quiet": 0}
            held.release(held.order[0])
            await eventually(lambda: len(held.order) == 3, "the next admission")
            assert held.order[2] == "q"  # six of the flood came first, yet it goes next
            held.release(*(["q"] + [f"f{i}" for i in range(8)]))
            responses = await asyncio.gather(quiet, *flood)
    assert [r.status_code for r in responses] == [200] * 9
    assert (limit.active, limit.queue_depth, limit.flow_statistics()) == (0, 0, [])


@pytest.mark.parametrize(
    ("flow", "request_kwargs", "expected"),
    [
        ("header:X-Tenant", {"headers": {"x-tenant": "acme"}}, "acme"),
        ("query:taskset", {"params": {"taskset": "math"}}, "math"),
        ("path:env", {"env": "sokoban"}, "sokoban"),
        ("json:meta.tenant", {"json": {"meta": {"tenant": "t7"}}}, "t7"),
        ("client", {}, "127.0.0.1"),
        ("header:x-tenant", {}, None),  # missing: the default flow
        ("json:meta.tenant", {"content": b"not json"}, None),
        ("header:x-tenant", {"headers": {"x-tenant": "x" * 500}}, "x" * 128),  # cut
        # NUL replaced: a global limit orders flows by name in Redis, and could not take it
        ("json:meta.tenant", {"json": {"meta": {"tenant": "a\u0000b"}}}, "a\ufffdb"),
    ],
)
async def test_where_a_flow_comes_from(component: str, flow, request_kwargs, expected) -> None:  # type: ignore[no-untyped-def]
    held = Held()
    with UvicornServer(served_app(component, held, flow=flow)) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            response = asyncio.create_task(post(client, "r", **request_kwargs))
            await eventually(lambda: held.order == ["r"], "the request to get in")
            assert [(s.flow, s.held) for s in limit.flow_statistics()] == [(expected, 1)]
            held.release("r")
            assert (await response).status_code == 200


def chat(prompt_characters: int, max_tokens: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "u", "content": "x" * prompt_characters}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


async def test_openai_tokens_weigh_a_request_by_its_body(component: str) -> None:
    held = Held()
    app = served_app(
        component, held, max_concurrent=1000, weight="openai_tokens", default_output_tokens=300
    )
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            big = asyncio.create_task(post(client, "big", json=chat(1596, 200)))  # 400 + 200
            await eventually(lambda: held.order == ["big"], "the first call to get in")
            assert limit.active == 600
            # No max_tokens: the default output; 500 more would not fit in 1000.
            second = asyncio.create_task(post(client, "second", json=chat(796, None)))
            await eventually(lambda: limit.queue_depth == 1, "the second call to wait")
            assert limit.statistics().queued_weight == 500
            small = asyncio.create_task(post(client, "small", json=chat(4, 10)))
            await eventually(lambda: limit.queue_depth == 2, "the small call to wait behind it")
            held.release("big")
            await eventually(lambda: held.order == ["big", "second", "small"], "both to get in")
            assert limit.active == 512  # 500 + 12 (the role's character counts too)
            held.release("second", "small")
            responses = await asyncio.gather(big, second, small)
    assert [r.json()["bytes"] for r in responses] == [len(r.request.content) for r in responses]
    assert (limit.active, limit.flow_statistics()) == (0, [])


async def test_a_weight_over_the_limit_is_capped_and_counted(
    component: str, caplog: pytest.LogCaptureFixture
) -> None:
    held = Held()
    app = served_app(component, held, max_concurrent=100, weight="json:cost")
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            with caplog.at_level(logging.WARNING, "gym_concurrency.middleware"):
                response = asyncio.create_task(post(client, "huge", json={"cost": 10**9}))
                await eventually(lambda: held.order == ["huge"], "the request to get in")
            assert limit.active == 100
            held.release("huge")
            assert (await response).status_code == 200
            for cost, expected in (("7", 1), (-3, 1), (2.2, 3), (None, 1), (True, 1)):
                response = asyncio.create_task(post(client, str(cost), json={"cost": cost}))
                await eventually(lambda c=cost: str(c) in held.order, "the request to get in")
                assert limit.active == expected, cost
                held.release(str(cost))
                await response
    assert "asked for weight 1000000000, more than the limit 100" in caplog.text


async def test_a_body_beyond_the_read_ahead_bound_takes_the_default_and_arrives_whole(
    component: str,
) -> None:
    held = Held()
    app = served_app(
        component, held, max_concurrent=50, weight="json:cost", max_queued_body_bytes=64
    )
    body = json.dumps({"cost": 40, "padding": "p" * 5000}).encode()
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            response = asyncio.create_task(post(client, "long", content=body))
            await eventually(lambda: held.order == ["long"], "the request to get in")
            assert limit.active == 1  # the body was not read in full: the default weight
            held.release("long")
            assert (await response).json()["bytes"] == len(body)


async def test_a_client_that_leaves_while_queued_gives_back_its_weight(component: str) -> None:
    held = Held()
    app = served_app(component, held, max_concurrent=10, weight="json:cost", flow="json:who")
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            first = asyncio.create_task(post(client, "a", json={"cost": 8, "who": "a"}))
            await eventually(lambda: held.order == ["a"], "the first to get in")
            leaving = asyncio.create_task(post(client, "b", json={"cost": 5, "who": "b"}))
            await eventually(lambda: limit.queue_depth == 1, "the second to wait")
            leaving.cancel()
            await eventually(lambda: limit.queue_depth == 0, "the second to leave")
            held.release("a")
            await first
    await eventually(lambda: limit.flow_statistics() == [], "every flow to be idle")
    assert (limit.active, limit.admission_cancelled) == (0, 1)


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ({"flow": "cookie:x"}, "must be 'header:<name>'"),
        ({"flow": "header:bad header"}, "is not an HTTP header name"),
        ({"flow": "json:a..b"}, "is not a dotted path"),
        ({"flow": "path:nope"}, "has no such parameter (it has: env)"),
        ({"weight": 0}, "must be an int >= 1"),
        ({"weight": "tokens"}, "'json:<dotted.path>' or 'openai_tokens', got 'tokens'"),
        ({"weight": "json:"}, "must be an int >= 1, 'json:<dotted.path>' or 'openai_tokens'"),
        ({"weight": 9}, "weight 9 is more than max_concurrent 2"),
        ({"weight": True}, "must be a number, got the boolean true"),
        ({"default_output_tokens": 0}, "greater than or equal to 1"),
    ],
)
def test_bad_flow_and_weight_settings_name_what_was_wrong(route, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as error:
        RouteLimit(path="/work/{env}", limit_name="work", max_concurrent=2, **route)
    assert message in str(error.value)


def test_flow_and_weight_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__PATH", "/judge")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__LIMIT_NAME", "judge")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT", "64000")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__FLOW", "header:x-env")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__WEIGHT", "openai_tokens")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__DEFAULT_OUTPUT_TOKENS", "2048")
    route = ConcurrencySettings().routes[0]
    assert (route.flow, route.weight, route.default_output_tokens) == (
        "header:x-env",
        "openai_tokens",
        2048,
    )
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__WEIGHT", "16")
    assert ConcurrencySettings().routes[0].weight == 16


async def test_a_body_nested_too_deep_takes_the_default(component: str) -> None:
    held = Held()
    app = served_app(component, held, max_concurrent=10, weight="json:n", flow="json:who")
    deep = b"[" * 100_000 + b"]" * 100_000
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            response = asyncio.create_task(post(client, "deep", content=deep))
            await eventually(lambda: held.order == ["deep"], "the request to get in")
            assert [(s.flow, s.held) for s in limit.flow_statistics()] == [(None, 1)]
            held.release("deep")
            assert (await response).json()["bytes"] == len(deep)


async def test_a_body_too_long_to_read_ahead_is_priced_by_its_length(component: str) -> None:
    held = Held()
    app = served_app(
        component,
        held,
        max_concurrent=100_000,
        weight="openai_tokens",
        default_output_tokens=256,
        max_queued_body_bytes=1000,
    )
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            body = json.dumps(chat(40_000, 100)).encode()
            response = asyncio.create_task(post(client, "long", content=body))
            await eventually(lambda: held.order == ["long"], "the request to get in")
            # Not read in full (1000 bytes at most): its length / 4 + the default output.
            assert limit.active == -(-len(body) // 4) + 256
            held.release("long")
            assert (await response).json()["bytes"] == len(body)


async def test_on_an_adaptive_route_weights_are_capped_at_its_floor(component: str) -> None:
    held = Held()
    adaptive = {"min_concurrent": 4, "max_concurrent": 20, "algorithm": "aimd"}
    app = served_app(component, held, max_concurrent=20, weight="json:n", adaptive=adaptive)
    with UvicornServer(app) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            response = asyncio.create_task(post(client, "heavy", json={"n": 15}))
            await eventually(lambda: held.order == ["heavy"], "the request to get in")
            # The limit may shrink to 4: a weight above that could wait for ever behind it.
            assert limit.active == 4
            held.release("heavy")
            await response


async def test_the_settings_bound_the_flow_names_each_limit_exports(
    component: str, metrics: MetricsCapture
) -> None:
    def held_by_flow() -> dict[str, Any]:
        return {
            dict(attributes)[FLOW_ATTRIBUTE]: value
            for attributes, value in metrics.values(FLOW_HELD_INSTRUMENT).items()
            if dict(attributes)[COMPONENT_ATTRIBUTE] == component
        }

    held = Held()
    app = served_app(
        component,
        held,
        flow="header:x-flow",
        flow_names_per_limit=1,
        meter_provider=metrics.provider,
    )
    try:
        with UvicornServer(app) as server:
            limit = limits_of(component)["work"]
            async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
                first = asyncio.create_task(post(client, "a", headers={"x-flow": "tenant-a"}))
                await eventually(lambda: limit.active == 1, "the first request in")
                assert held_by_flow() == {"tenant-a": 1}  # the limit's one name
                second = asyncio.create_task(post(client, "b", headers={"x-flow": "tenant-b"}))
                await eventually(lambda: limit.active == 2, "the second request in")
                assert held_by_flow() == {"tenant-a": 1, "top:1": 1}
                held.release("a", "b")
                await asyncio.gather(first, second)
                # (a client can read the whole answer before the server's release runs)
                await eventually(lambda: limit.active == 0, "both requests' slots given back")
                assert held_by_flow() == {"tenant-a": 0, "top:1": 0}
    finally:
        set_flow_names_per_limit(DEFAULT_FLOW_NAMES_PER_LIMIT)
