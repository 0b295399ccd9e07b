"""A route's weight read from the body never fails a request: a number over the limit, however
large (past the largest float, past Python's 4300-digit int limit), is capped at the limit and
counted; NaN, a number below 1 or anything but a number takes the default. Hypothesis over
arbitrary JSON bodies for each body source, and a real uvicorn for the answer a client gets."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from gym_concurrency.middleware.asks import RouteAsk
from gym_concurrency.middleware.credential_flows import CredentialFlows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_concurrency import MeteredSemaphore
from tests.json_bodies import HUGE, json_bodies
from tests.registry import limits_of
from tests.servers import UvicornServer

LIMIT = 100
NO_KEY = CredentialFlows(ConcurrencySettings())  # no route here hashes its flow


@pytest.mark.parametrize(
    ("weight", "read"),
    [
        ("json:n", ["n"]),
        ("json:a.0.n", ["a", "n"]),
        ("openai_tokens", ["max_tokens", "max_completion_tokens", "max_output_tokens"]),
    ],
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_body_gives_a_weight_within_the_limit(
    weight: str, read: list[str], data: st.DataObject
) -> None:
    body = data.draw(json_bodies(*read), label="body")
    route = RouteLimit(
        path="/work", limit_name="w", max_concurrent=LIMIT, weight=weight, flow="json:n"
    )
    ask = RouteAsk(route, MeteredSemaphore(LIMIT, component="values", limit_name="w"), NO_KEY)
    got, flow = ask({"type": "http", "headers": []}, body)
    assert type(got) is int
    assert 1 <= got <= LIMIT
    hash(flow)


@pytest.mark.parametrize(
    ("n", "expected", "capped"),
    [
        (HUGE, LIMIT, 1),  # 10^400: past the largest float
        ("1" + "0" * 5000, LIMIT, 1),  # past Python's 4300-digit int limit
        ("1e400", LIMIT, 1),
        ("Infinity", LIMIT, 1),
        ("1" + "0" * 400 + ".5", LIMIT, 1),
        ("-" + HUGE, 1, 0),
        ("-1e400", 1, 0),
        ("NaN", 1, 0),
        ("0.25", 1, 0),
        ('"' + HUGE + '"', 1, 0),  # a string is not a number
        ("99.2", LIMIT, 0),  # rounded up: exactly the limit
        ("7", 7, 0),
    ],
)
def test_a_number_over_the_limit_is_capped_and_a_bad_one_is_the_default(
    n: str, expected: int, capped: int
) -> None:
    route = RouteLimit(path="/work", limit_name="w", max_concurrent=LIMIT, weight="json:n")
    ask = RouteAsk(route, MeteredSemaphore(LIMIT, component="values", limit_name="w"), NO_KEY)
    assert ask({"type": "http", "headers": []}, b'{"n": %s}' % n.encode()) == (expected, None)
    assert ask.capped == capped


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "max_output_tokens"])
@pytest.mark.parametrize("bound", [HUGE, "1" + "0" * 5000])
def test_a_huge_output_bound_is_capped(field: str, bound: str) -> None:
    route = RouteLimit(path="/work", limit_name="w", max_concurrent=LIMIT, weight="openai_tokens")
    ask = RouteAsk(route, MeteredSemaphore(LIMIT, component="values", limit_name="w"), NO_KEY)
    body = b'{"messages": [{"role": "user", "content": "hi"}], "%s": %s}'
    assert ask({"type": "http", "headers": []}, body % (field.encode(), bound.encode())) == (
        LIMIT,
        None,
    )
    assert ask.capped == 1


def app_of(component: str, weight: str) -> FastAPI:
    """One route, `weight` from the body; it answers with the weight its request holds."""
    route = RouteLimit(path="/work", limit_name="work", max_concurrent=LIMIT, weight=weight)
    app = FastAPI()

    @app.post("/work")
    async def work(request: Request) -> dict[str, Any]:
        return {"bytes": len(await request.body()), "held": limits_of(component)["work"].active}

    settings = ConcurrencySettings(component=component, routes=[route])
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings)
    return app


@pytest.mark.parametrize(
    ("weight", "body"),
    [
        ("json:n", b'{"n": %s}' % HUGE.encode()),
        ("json:n", b'{"n": 1%s}' % (b"0" * 5000)),
        ("json:n", b'{"n": 1e400}'),
        ("openai_tokens", b'{"messages": [], "max_tokens": %s}' % HUGE.encode()),
        ("openai_tokens", b'{"messages": [], "max_completion_tokens": 1%s}' % (b"0" * 5000)),
    ],
)
async def test_a_huge_weight_gets_its_answer_holding_the_whole_limit(
    component: str, weight: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        UvicornServer(app_of(component, weight)) as server,
        caplog.at_level(logging.WARNING, "gym_concurrency.middleware"),
    ):
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            response = await client.post("/work", content=body)
            again = await client.post("/work", content=body)
    assert response.status_code == again.status_code == 200, response.text
    assert response.json() == {"bytes": len(body), "held": LIMIT}
    warned = [r.getMessage() for r in caplog.records if "capped at the limit" in r.getMessage()]
    assert len(warned) == 1  # logged once, short: not the 5000 digits the client sent
    assert "asked for weight about 10^" in warned[0]
    assert len(warned[0]) < 300
