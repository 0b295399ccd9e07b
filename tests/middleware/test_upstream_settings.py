"""Budgets and engine signals in the settings: the same names on route, operation and client
limits, read from keyword arguments and GYM_CONCURRENCY_* variables; every value that could not
work fails naming the field; the limits made carry the budget and signal described; a reload
resizes a running budget but never switches one on or off, changes its shape, resizes a global
one, or touches an engine signal."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gym_concurrency.middleware import (
    ClientLimit,
    ConcurrencySettings,
    EngineSignalSettings,
    OperationLimit,
    RouteLimit,
)
from gym_concurrency.middleware.limits import ConcurrencyLimits
from pydantic import ValidationError

ENGINE = {"url": "http://127.0.0.1:9/metrics", "waiting_max": 4}
ROUTE = {"path": "/v1/chat/completions", "limit_name": "chat", "max_concurrent": 4}
OPERATION = {"limit_name": "judge", "operation": "judge", "executor": "inline", "max_concurrent": 4}
CLIENT = {"limit_name": "model", "max_concurrent": 4}


@pytest.mark.parametrize(
    ("kind", "base"), [(RouteLimit, ROUTE), (OperationLimit, OPERATION), (ClientLimit, CLIENT)]
)
@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"tokens_per_minute": 0}, "tokens_per_minute"),
        ({"requests_per_minute": True}, "requests_per_minute"),
        ({"input_tokens_per_minute": "1:30"}, "input_tokens_per_minute"),
        ({"budget_shape": "bucket"}, "budget_shape: set with no budget"),
        ({"budget_shape": "leaky", "tokens_per_minute": 10}, "budget_shape"),
        ({"tokens": 5}, "tokens: the estimate a call reserves of a token budget"),
        ({"requests_per_minute": 10, "tokens": 5}, "tokens: the estimate"),
        ({"tokens_per_minute": 10, "tokens": 11}, "tokens 11 is more than a minute's budget"),
        ({"engine": {"url": "https://h/metrics", "waiting_max": 1}}, "engine.url"),
        ({"engine": {"url": "http://h/metrics", "waiting_max": 0}}, "engine.waiting_max"),
        ({"engine": {**ENGINE, "cache_max": 1.5}}, "engine.cache_max"),
        ({"engine": {**ENGINE, "engine": "tgi"}}, "engine.engine"),
        ({"engine": {**ENGINE, "stale_after_seconds": 0.5}}, "stale_after_seconds (0.5)"),
        ({"engine": {**ENGINE, "colour": "red"}}, "engine.colour"),
    ],
)
def test_a_setting_that_could_not_work_fails_naming_it(
    kind: type[Any], base: dict[str, Any], bad: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        kind(**base, **bad)
    assert named in str(caught.value)


def test_the_route_estimate_takes_the_weight_forms() -> None:
    route = RouteLimit(**ROUTE, tokens_per_minute=1000, tokens="json:usage.max")
    assert route.tokens == "json:usage.max"
    with pytest.raises(ValidationError, match=r"must be an int >= 1, 'json:<dotted\.path>'"):
        RouteLimit(**ROUTE, tokens_per_minute=1000, tokens="header:x")


@pytest.mark.parametrize(
    ("upstream", "named"),
    [
        ({"engine": ENGINE, "weight": 2}, "routes.0.weight: a global limit that follows an "),
        ({"tokens_per_minute": 10, "budget_shape": "bucket"}, "routes.0.budget_shape"),
    ],
)
def test_a_global_limit_takes_no_weighed_engine_calls_nor_bucket(
    upstream: dict[str, Any], named: str
) -> None:
    route = RouteLimit(**ROUTE, scope="global", **upstream)
    with pytest.raises(ValidationError, match=named):
        ConcurrencySettings(redis_url="redis://127.0.0.1:9/0", routes=[route])


def test_budgets_and_an_engine_are_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "GYM_CONCURRENCY_CLIENTS__0__LIMIT_NAME": "model",
        "GYM_CONCURRENCY_CLIENTS__0__MAX_CONCURRENT": "8",
        "GYM_CONCURRENCY_CLIENTS__0__TOKENS_PER_MINUTE": "60000",
        "GYM_CONCURRENCY_CLIENTS__0__BUDGET_SHAPE": "bucket",
        "GYM_CONCURRENCY_CLIENTS__0__TOKENS": "openai_tokens",
        "GYM_CONCURRENCY_CLIENTS__0__ENGINE__URL": "http://127.0.0.1:8000/metrics",
        "GYM_CONCURRENCY_CLIENTS__0__ENGINE__WAITING_MAX": "4",
    }.items():
        monkeypatch.setenv(name, value)
    [client] = ConcurrencySettings().clients
    assert (client.tokens_per_minute, client.budget_shape, client.tokens) == (
        60000,
        "bucket",
        "openai_tokens",
    )
    assert client.engine == EngineSignalSettings(url="http://127.0.0.1:8000/metrics", waiting_max=4)


def limits(component: str, previous: ConcurrencyLimits | None = None, **route: Any) -> Any:
    settings = ConcurrencySettings(component=component, routes=[RouteLimit(**ROUTE, **route)])
    return ConcurrencyLimits(settings, previous=previous)


async def test_the_limits_made_carry_the_budget_and_the_signal() -> None:
    made = limits("made upstream", tokens_per_minute=1000, budget_shape="bucket", engine=ENGINE)
    limit = made.routes[0].limit
    assert limit.budget is not None
    assert (limit.budget.limits, limit.budget.shape) == ({"tokens": 1000}, "bucket")
    assert limit.engine is not None
    assert limit.engine.url == ENGINE["url"]
    assert made.routes[0].upstream
    await limit.engine.aclose()


async def test_a_reload_resizes_a_budget_and_says_so() -> None:
    first = limits("resized budget", tokens_per_minute=1000, requests_per_minute=10)
    second = limits("resized budget", first, tokens_per_minute=2000, requests_per_minute=10)
    assert second.apply() == ["route limit 'chat': tokens_per_minute 1000 -> 2000"]
    limit = second.routes[0].limit
    assert limit is first.routes[0].limit
    assert limit.budget.limits == {"tokens": 2000, "requests": 10}


async def test_a_reload_that_grows_a_budget_admits_the_waiters_it_now_holds() -> None:
    first = limits("grown budget", tokens_per_minute=100, queue_timeout_seconds=90)
    limit = first.routes[0].limit
    assert limit.try_acquire(tokens=100)
    waiter = asyncio.ensure_future(limit.acquire(tokens=100))
    await asyncio.sleep(0.05)
    assert not waiter.done()  # the budget holds it in a minute
    limits("grown budget", first, tokens_per_minute=1000, queue_timeout_seconds=90).apply()
    await asyncio.wait_for(waiter, 2)  # at once, not in a minute nor at a release
    assert limit.active == 2


@pytest.mark.parametrize(
    ("before", "after", "named"),
    [
        ({}, {"tokens_per_minute": 1000}, "routes.0.tokens_per_minute: a reload can resize"),
        ({"tokens_per_minute": 1000}, {}, "routes.0.tokens_per_minute: a reload can resize"),
        (
            {"tokens_per_minute": 1000},
            {"tokens_per_minute": 1000, "budget_shape": "bucket"},
            "routes.0.budget_shape",
        ),
        ({}, {"engine": ENGINE}, "routes.0.engine"),
        ({"engine": ENGINE}, {"engine": {**ENGINE, "waiting_max": 8}}, "routes.0.engine"),
    ],
)
async def test_a_reload_cannot_switch_a_budget_or_move_an_engine(
    before: dict[str, Any], after: dict[str, Any], named: str
) -> None:
    first = limits("fixed upstream", **before)
    with pytest.raises(ValueError, match=named):
        limits("fixed upstream", first, **after)
    engine = first.routes[0].limit.engine
    if engine is not None:
        await engine.aclose()
