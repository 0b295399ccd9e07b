"""Flows from credentials through the middleware, over a real uvicorn: a credential header or a
`hash:` source is the flow only as its keyed hash (or the operator's label for it), read whole;
strict settings that never show the key."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    RouteLimit,
    reload_settings,
)
from pydantic import ValidationError
from servers import UvicornServer, eventually

from gym_concurrency.hashed_flows import hashed_flow
from tests.registry import limits_of

KEY = "a-deployment-secret-0123456789ab"


def h(value: str | bytes) -> str:
    return hashed_flow(value, KEY.encode())


def served_app(component: str, flow: str, release: asyncio.Event, **settings: Any) -> FastAPI:
    route = RouteLimit(path="/work/{env}", limit_name="work", max_concurrent=4, flow=flow)
    settings = {"flow_key": KEY, **settings}
    app = FastAPI()

    @app.post("/work/{env}")
    async def work(env: str, request: Request) -> dict[str, bool]:
        await request.body()
        await release.wait()
        return {"ok": True}

    app.add_middleware(
        ConcurrencyLimitMiddleware,
        settings=ConcurrencySettings(component=component, routes=[route], **settings),
    )
    return app


async def flows_seen(component: str, flow: str, *requests: dict[str, Any], **settings: Any):  # type: ignore[no-untyped-def]
    """The flows the route's limit holds while `requests` are in, by held weight."""
    release = asyncio.Event()
    with UvicornServer(served_app(component, flow, release, **settings)) as server:
        limit = limits_of(component)["work"]
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            sent = [
                asyncio.create_task(client.post(f"/work/{r.pop('env', 'e1')}", **r))
                for r in requests
            ]
            await eventually(lambda: limit.active == len(requests), "the requests to get in")
            held = {s.flow: s.held for s in limit.flow_statistics()}
            release.set()
            assert [r.status_code for r in await asyncio.gather(*sent)] == [200] * len(sent)
    return held


@pytest.mark.parametrize(
    ("flow", "request_kwargs", "value"),
    [
        ("header:authorization", {"headers": {"Authorization": "Bearer sk-1"}}, b"Bearer sk-1"),
        ("header:Proxy-Authorization", {"headers": {"proxy-authorization": "Basic x"}}, b"Basic x"),
        ("header:cookie", {"headers": {"cookie": "session=abc"}}, b"session=abc"),
        ("header:x-api-key", {"headers": {"x-api-key": "k-123"}}, b"k-123"),
        ("header:api-key", {"headers": {"api-key": "k-456"}}, b"k-456"),
        ("hash:header:x-tenant", {"headers": {"x-tenant": "acme"}}, b"acme"),
        ("hash:query:k", {"params": {"k": "v1"}}, "v1"),
        ("hash:path:env", {"env": "sokoban"}, "sokoban"),
        ("hash:json:user.id", {"json": {"user": {"id": 42}}}, "42"),
        ("hash:json:user.id", {"json": {"user": {"id": "ü-7"}}}, "ü-7"),
        ("hash:client", {}, "127.0.0.1"),
    ],
)
async def test_a_credential_or_hash_source_is_kept_as_its_keyed_hash(
    component: str, flow: str, request_kwargs: dict[str, Any], value: str | bytes
) -> None:
    assert await flows_seen(component, flow, request_kwargs) == {h(value): 1}


async def test_a_missing_value_is_still_the_default_flow(component: str) -> None:
    assert await flows_seen(component, "header:authorization", {}) == {None: 1}


async def test_a_credential_is_hashed_whole_not_cut_first(component: str) -> None:
    # Two long tokens alike in their first 128 characters are two flows, not one.
    first, second = "Bearer " + "x" * 200 + "1", "Bearer " + "x" * 200 + "2"
    requests = ({"headers": {"authorization": first}}, {"headers": {"authorization": second}})
    seen = await flows_seen(component, "header:authorization", *requests)
    assert seen == {h(first): 1, h(second): 1}


async def test_headers_the_settings_name_are_credentials_too(component: str) -> None:
    request = {"headers": {"x-team-token": "t0k3n"}}
    assert await flows_seen(component, "header:x-team-token", dict(request)) == {"t0k3n": 1}
    named = await flows_seen(
        component + "2", "header:x-team-token", request, credential_headers=("X-Team-Token",)
    )
    assert named == {h(b"t0k3n"): 1}


async def test_a_label_is_the_flow_of_the_credential_it_names(component: str) -> None:
    team_a, other = "Bearer sk-team-a", "Bearer sk-other"
    requests = (
        {"headers": {"authorization": team_a}},
        {"headers": {"authorization": team_a}},
        {"headers": {"authorization": other}},
    )
    labels = {h(team_a): "team-a"}
    seen = await flows_seen(component, "header:authorization", *requests, flow_labels=labels)
    assert seen == {"team-a": 2, h(other): 1}


def route(**fields: Any) -> dict[str, Any]:
    return {"path": "/work/{env}", "limit_name": "work", "max_concurrent": 2, **fields}


SECRET = "do-not-show-this-secret-value"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"flow_key": "short"}, "flow_key\n  must be at least 16 characters, got 5"),
        ({"flow_key": 12345678901234567890}, "flow_key\n  must be text (a secret), not int"),
        ({"flow_labels": {"h:0123456789abcdef": "a"}}, "flow_labels: the ids it names are"),
        (
            {"flow_key": SECRET, "flow_labels": {f"Bearer {SECRET}": "a"}},
            "a key is not a hashed flow id, 'h:' and 16 hex digits (not shown",
        ),
        (
            {"flow_key": SECRET, "flow_labels": {"h:0123456789abcdef": "x" * 129}},
            "h:0123456789abcdef: a label is text of 1 to 128 characters",
        ),
        (
            {"flow_key": SECRET, "flow_labels": {"h:0123456789abcdef": "h:team"}},
            "a label has no NUL and does not start with 'h:'",
        ),
        (
            {"flow_key": SECRET, "flow_labels": {"h:0123456789abcdef": "a\0b"}},
            "a label has no NUL and does not start with 'h:'",
        ),
        ({"credential_headers": ["x-ok", "bad header"]}, "'bad header' is not an HTTP header"),
        ({"routes": [route(flow="hash:hash:x")]}, "each optionally after 'hash:', got 'hash:hash"),
        ({"routes": [route(flow="hash:cookie:x")]}, "must be 'header:<name>'"),
        ({"routes": [route(flow="hash:path:nope")]}, "has no such parameter (it has: env)"),
        (  # an error of the settings as a whole shows no input: it would hold the key
            {"flow_key": SECRET, "routes": [route(scope="global")]},
            "limit 'work' is global, which needs redis_url",
        ),
    ],
)
def test_bad_credential_settings_name_the_field_and_never_show_the_key(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as error:
        ConcurrencySettings(**settings)
    assert message in str(error.value)
    shown = f"{error.value} {error.value.errors()!r} {error.value.json()}"
    assert SECRET not in shown
    assert "12345678901234567890" not in shown


def test_the_key_is_read_from_the_environment_and_shown_nowhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GYM_CONCURRENCY_FLOW_KEY", SECRET)
    monkeypatch.setenv("GYM_CONCURRENCY_CREDENTIAL_HEADERS", "X-Team-Token, x-other")
    monkeypatch.setenv("GYM_CONCURRENCY_FLOW_LABELS", '{"H:0123456789ABCDEF": "team-a"}')
    settings = ConcurrencySettings()
    assert settings.flow_key is not None
    assert settings.flow_key.get_secret_value() == SECRET
    assert settings.credential_headers == ("x-team-token", "x-other")
    assert settings.flow_labels == {"h:0123456789abcdef": "team-a"}
    shown = f"{settings!r} {settings} {settings.model_dump()} {settings.model_dump_json()}"
    assert SECRET not in shown


async def test_a_reload_shows_no_key_nor_url_secret_and_applies_new_labels(
    component: str,
) -> None:
    release = asyncio.Event()
    app = served_app(component, "header:authorization", release)
    credential = {"authorization": "Bearer sk-team-a"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

        async def flow_of_a_request() -> object:
            release.clear()
            sent = asyncio.create_task(client.post("/work/e1", headers=credential))

            def held() -> list[object]:  # (the first request builds the limit)
                limit = limits_of(component).get("work")
                return [] if limit is None else [s.flow for s in limit.flow_statistics()]

            await eventually(lambda: len(held()) == 1, "the request to get in")
            (flow,) = held()
            release.set()
            assert (await sent).status_code == 200
            return flow

        assert await flow_of_a_request() == h("Bearer sk-team-a")
        new_key = "another-deployment-secret-456789"
        url = "redis+sentinel://u:MASTERPW@s1:26379/svc/0?sentinel_password=SENTINELPW&ssl=true"
        labels = {hashed_flow("Bearer sk-team-a", new_key.encode()): "team-a"}
        new = ConcurrencySettings(
            component=component,
            routes=[RouteLimit(**route(max_concurrent=4, flow="header:authorization"))],
            flow_key=new_key,
            flow_labels=labels,
            redis_url=url,
        )
        changes = reload_settings(app, new)
        assert await flow_of_a_request() == "team-a"  # the new key's id, by its label
    shown = "\n".join(changes)
    assert "sentinel_password=***" in shown, shown
    assert "u:***@s1" in shown
    for secret in (KEY, new_key, "MASTERPW", "SENTINELPW"):
        assert secret not in shown
