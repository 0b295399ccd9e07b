"""An outbound call made while a request is handled goes in that request's flow, as it ends
with its deadline: with httpx and aiohttp, unless the client says otherwise (`flow=` given:
None, a flow, a function). Configured clients (`ClientLimit.flow` / `.weight`) ask for what
the settings say, unless the code that makes one gives its own; a reload changes it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gym_concurrency.middleware import ClientLimit, ConcurrencySettings
from gym_concurrency.middleware.clients import LimitedClient
from pydantic import ValidationError

from gym_concurrency import MeteredSemaphore, tokens
from gym_concurrency.clients import ROUTE_FLOW
from gym_concurrency.flow import process_flow, within_flow
from tests.clients.callers import KINDS, Caller
from tests.clients.upstream import Reply, Upstream
from tests.servers import eventually

PROMPT = {"model": "judge", "messages": [{"role": "user", "content": "x" * 400}]}


def by_env_header(request: Any) -> str | None:
    env: str | None = request.headers.get("x-env")
    return env


async def held_while_answered(
    caller: Caller, upstream: Upstream, limit: MeteredSemaphore, flow: Any = None, **call: Any
) -> list[tuple[Any, int]]:
    """(flow, weight held) of every flow of `limit` while one call, made in the request flow
    `flow` (None: outside a request), is being answered."""
    upstream.script("/judge", Reply(delay=0.3))
    number = len(upstream.attempts()) + 1
    with within_flow(flow):
        if "json" in call:
            made = asyncio.create_task(caller.post("/judge", call["json"]))
        else:
            made = asyncio.create_task(caller.get("/judge", call.get("headers")))
    await eventually(lambda: upstream.answering(number), "the call to reach the upstream")
    held = sorted(((f.flow, f.held) for f in limit.flow_statistics()), key=repr)
    assert (await made)[0] == 200
    return held


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("given", "held_in"),
    [
        ({}, "tenant-a"),  # nothing said: the request's flow
        ({"flow": ROUTE_FLOW}, "tenant-a"),
        ({"flow": None}, None),  # said: the default flow
        ({"flow": "batch"}, "batch"),
        ({"flow": by_env_header}, "env-1"),
    ],
)
async def test_a_call_goes_in_the_flow_of_the_request_being_handled(
    kind: str, given: dict[str, Any], held_in: Any, upstream: Upstream, limit: MeteredSemaphore
) -> None:
    async with Caller(kind, upstream.url, limit, None, **given) as caller:
        held = await held_while_answered(
            caller, upstream, limit, "tenant-a", headers={"x-env": "env-1"}
        )
    assert held == [(held_in, 1)]  # and the fixture checks it was given back in that flow


@pytest.mark.parametrize("kind", KINDS)
async def test_outside_a_request_a_call_is_in_the_default_flow(
    kind: str, upstream: Upstream, limit: MeteredSemaphore
) -> None:
    async with Caller(kind, upstream.url, limit, None) as caller:
        assert await held_while_answered(caller, upstream, limit) == [(None, 1)]


def configured(limit: MeteredSemaphore, **fields: Any) -> LimitedClient:
    config = ClientLimit(limit_name="judge", max_concurrent=limit.limit, retry=None, **fields)
    return LimitedClient(config, limit)


class ConfiguredCaller(Caller):
    """A Caller over a transport or middleware made from a configured client."""

    def __init__(self, kind: str, url: str, client: LimitedClient, **given: Any) -> None:
        import aiohttp
        import httpx

        self.kind = kind
        if kind == "httpx":
            self.view = client.transport(**given)
            self._httpx = httpx.AsyncClient(transport=self.view, base_url=url, timeout=30)
        else:
            self.view = client.middleware(**given)
            self._aiohttp = aiohttp.ClientSession(base_url=url, middlewares=(self.view,))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("fields", "given", "held"),
    [
        ({}, {}, [("tenant-a", 1)]),  # flow: route, the default
        ({"flow": "none"}, {}, [(None, 1)]),
        ({"flow": "header:x-env"}, {}, [("env-1", 1)]),
        ({"flow": "process"}, {}, [(process_flow(), 1)]),  # this process's, not the route's
        ({"weight": 3}, {}, [("tenant-a", 3)]),
        ({"flow": "none", "weight": 3}, {"flow": "batch", "weight": 2}, [("batch", 2)]),
        ({"flow": "none"}, {"flow": ROUTE_FLOW}, [("tenant-a", 1)]),
    ],
)
async def test_a_configured_client_asks_what_its_settings_say_unless_its_code_says(
    kind: str,
    fields: dict[str, Any],
    given: dict[str, Any],
    held: list[tuple[Any, int]],
    upstream: Upstream,
    limit: MeteredSemaphore,
) -> None:
    client = configured(limit, **fields)
    async with ConfiguredCaller(kind, upstream.url, client, **given) as caller:
        seen = await held_while_answered(
            caller, upstream, limit, "tenant-a", headers={"x-env": "env-1"}
        )
    assert seen == held


@pytest.mark.parametrize("kind", KINDS)
async def test_a_configured_client_weighs_openai_bodies_in_tokens(
    kind: str, upstream: Upstream, name: str
) -> None:
    limit = MeteredSemaphore(100_000, component=name, limit_name="judge_tokens")
    client = configured(limit, weight="openai_tokens")
    async with ConfiguredCaller(kind, upstream.url, client) as caller:
        held = await held_while_answered(caller, upstream, limit, "tenant-a", json=PROMPT)
    assert held == [("tenant-a", tokens.openai_tokens(PROMPT))]  # 400 / 4 + 1024 and the role
    assert limit.active == 0


async def test_a_reload_changes_what_calls_ask_for_where_the_settings_decide(
    upstream: Upstream, limit: MeteredSemaphore
) -> None:
    client = configured(limit)
    async with (
        ConfiguredCaller("httpx", upstream.url, client) as by_settings,
        ConfiguredCaller("aiohttp", upstream.url, client, flow="batch") as by_code,
    ):
        client.reconfigure(client.config.model_copy(update={"flow": "none", "weight": 2}))
        assert await held_while_answered(by_settings, upstream, limit, "tenant-a") == [(None, 2)]
        assert await held_while_answered(by_code, upstream, limit, "tenant-a") == [("batch", 2)]
        client.reconfigure(client.config.model_copy(update={"flow": "process"}))
        mine = [(process_flow(), 2)]
        assert await held_while_answered(by_settings, upstream, limit, "tenant-a") == mine
        client.reconfigure(client.config.model_copy(update={"flow": "route", "weight": 1}))
        assert await held_while_answered(by_settings, upstream, limit, "tenant-a") == [
            ("tenant-a", 1)
        ]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"flow": "tenant"}, "clients.0.flow\n  Value error, must be 'route'"),
        ({"flow": "processes"}, "'none', 'process' (this process's own) or 'header:<name>'"),
        ({"flow": "header:"}, "clients.0.flow\n  Value error, must be 'route'"),
        ({"flow": "query:x"}, "clients.0.flow\n  Value error, must be 'route'"),
        ({"flow": "header:x env"}, "clients.0.flow\n  Value error, 'x env' is not an HTTP header"),
        ({"flow": "header:Authorization"}, "'Authorization' carries a credential"),
        ({"flow": "header:x-api-key"}, "'x-api-key' carries a credential"),
        ({"flow": None}, "clients.0.flow\n  Input should be a valid string"),
        ({"weight": 0}, "clients.0.weight\n  Value error, must be an int >= 1 or 'openai_tokens'"),
        ({"weight": "tokens"}, "clients.0.weight\n  Value error, must be an int >= 1 or"),
        ({"weight": True}, "clients.0.weight\n  Value error, must be a number, got the boolean"),
        ({"weight": 1.5}, "clients.0.weight"),
        ({"weight": 9}, "weight 9 is more than max_concurrent 4"),
    ],
)
def test_a_bad_flow_or_weight_fails_naming_the_field(fields: dict[str, Any], error: str) -> None:
    entry = {"limit_name": "judge", "max_concurrent": 4, **fields}
    with pytest.raises(ValidationError) as failed:
        ConcurrencySettings(clients=[entry])
    assert error in str(failed.value)


def test_flow_and_weight_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__0__LIMIT_NAME", "judge")
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__0__MAX_CONCURRENT", "64000")
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__0__WEIGHT", "openai_tokens")
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__0__FLOW", "header:x-env")
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__1__LIMIT_NAME", "tool")
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__1__MAX_CONCURRENT", "16")
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__1__WEIGHT", "4")
    monkeypatch.setenv("GYM_CONCURRENCY_CLIENTS__1__FLOW", "none")
    judge, tool = ConcurrencySettings().clients
    assert (judge.weight, judge.flow) == ("openai_tokens", "header:x-env")
    assert (tool.weight, tool.flow) == (4, "none")
    assert ClientLimit(limit_name="x", max_concurrent=1).flow == "route"


def test_a_client_flow_from_a_header_the_settings_call_a_credential_fails_the_settings() -> None:
    with pytest.raises(ValidationError, match=r"clients\.0\.flow: 'X-Team-Token' is listed"):
        ConcurrencySettings(
            credential_headers=["x-team-token"],
            clients=[ClientLimit(limit_name="judge", max_concurrent=4, flow="header:X-Team-Token")],
        )
