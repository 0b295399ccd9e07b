"""A second ConcurrencyLimitMiddleware on the same app (`add_middleware` run twice, or by a
factory and again by its caller) fails the start naming both (issue 19, item 1). Before, it
started: /metrics and the status view showed limit 8 and active 8 while at most 4 requests ran,
the outer layer's holders waiting in the inner layer's queue."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit
from starlette.testclient import TestClient

from tests.registry import limits_of
from tests.servers import UvicornServer
from tests.uvicorn_process import clean_env, uvicorn

TWICE_APP = """
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencySettings, RouteLimit

app = FastAPI()


@app.post("/run")
async def run() -> dict[str, bool]:
    return {"ok": True}


app.add_middleware(ConcurrencyLimitMiddleware)  # settings from the environment
app.add_middleware(
    ConcurrencyLimitMiddleware,
    settings=ConcurrencySettings(
        component="from_code",
        routes=[RouteLimit(path="/run", limit_name="coded_runs", max_concurrent=4)],
    ),
)
"""
ROUTE_ENV = {
    "GYM_CONCURRENCY_COMPONENT": "from_env",
    "GYM_CONCURRENCY_ROUTES__0__PATH": "/run",
    "GYM_CONCURRENCY_ROUTES__0__LIMIT_NAME": "env_runs",
    "GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT": "4",
}


def settings(component: str, name: str) -> ConcurrencySettings:
    return ConcurrencySettings(
        component=component, routes=[RouteLimit(path="/run", limit_name=name, max_concurrent=4)]
    )


def factory(component: str) -> FastAPI:
    """An app factory that adds the middleware itself (as a library's server might)."""
    app = FastAPI()

    @app.post("/run")
    async def run() -> dict[str, int]:
        return {name: s.active for name, s in limits_of(component).items()}

    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings(component, "factory_runs"))
    return app


@pytest.mark.parametrize("lifespan", ["auto", "on"])
def test_added_twice_fails_the_uvicorn_start_naming_both(tmp_path: Path, lifespan: str):
    (tmp_path / "twice.py").write_text(TWICE_APP)
    env = clean_env(**ROUTE_ENV)
    with uvicorn(tmp_path, "twice:app", env, "--lifespan", lifespan) as server:
        status = server.exit_status()
        log = server.log
    assert status == 3, log
    assert "ConcurrencyLimitMiddleware is added twice to this app" in log
    # Both named: the outer one (added last, from code), the inner one (from the environment).
    assert "the outer one: component 'from_code', route limit 'coded_runs' (/run, 4)" in log
    assert (
        "the inner one: component 'from_env' (settings from GYM_CONCURRENCY_* variables), "
        "route limit 'env_runs' (/run, 4)"
    ) in log
    assert "Application startup complete" not in log


def test_a_factory_and_its_caller_adding_it_fail_the_start(component: str):
    app = factory(component)
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings(component, "caller_runs"))
    with (
        pytest.raises(RuntimeError, match=r"added twice.*'caller_runs'.*'factory_runs'"),
        TestClient(app),
    ):
        pass


def test_without_lifespan_added_twice_answers_500_misconfigured(
    component: str, caplog: pytest.LogCaptureFixture
):
    app = factory(component)
    app.add_middleware(ConcurrencyLimitMiddleware, settings=settings(component, "caller_runs"))
    with (
        caplog.at_level(logging.ERROR, "gym_concurrency.middleware"),
        UvicornServer(app, lifespan="off") as server,
    ):
        answers = [httpx.post(server.url + "/run", timeout=5) for _ in range(2)]
    assert [a.status_code for a in answers] == [500, 500]
    assert "misconfigured" in answers[1].text
    errors = [r.getMessage() for r in caplog.records if "added twice" in r.getMessage()]
    assert len(errors) == 1, errors  # logged once, not per request
    assert "'caller_runs'" in errors[0]
    assert "'factory_runs'" in errors[0]


def test_one_middleware_per_app_is_no_error_however_often_the_app_starts(component: str):
    app = factory(component)
    for _ in range(2):  # the same app (and middleware) started twice
        with TestClient(app) as client:
            assert client.post("/run").json() == {"factory_runs": 1}
    # An app wrapped by hand, then wrapped again by a new middleware: one at a time.
    plain = FastAPI()

    @plain.post("/run")
    async def run() -> dict[str, int]:
        return {name: s.active for name, s in limits_of(component).items()}

    for name in ("first_wrap", "second_wrap"):
        wrapped = ConcurrencyLimitMiddleware(plain, settings=settings(component, name))
        with TestClient(wrapped) as client:
            assert client.post("/run").json()[name] == 1


def test_wrapped_twice_by_hand_fails_the_start(component: str):
    plain = FastAPI()
    inner = ConcurrencyLimitMiddleware(plain, settings=settings(component, "inner_runs"))
    outer = ConcurrencyLimitMiddleware(inner, settings=settings(component, "outer_runs"))
    with (
        pytest.raises(RuntimeError, match=r"added twice.*'outer_runs'.*'inner_runs'"),
        TestClient(outer),
    ):
        pass


def test_a_mounted_app_may_have_its_own_middleware(component: str):
    inner = factory(component)
    outer = FastAPI()
    outer.mount("/sub", inner)

    @outer.post("/mine")
    async def mine() -> dict[str, int]:
        return {name: s.active for name, s in limits_of(component).items()}

    outer_settings = ConcurrencySettings(
        component=component,
        routes=[RouteLimit(path="/mine", limit_name="outer_runs", max_concurrent=4)],
    )
    outer.add_middleware(ConcurrencyLimitMiddleware, settings=outer_settings)
    with UvicornServer(outer) as server:
        # (The mounted app gets no lifespan: its middleware starts on its first request.)
        assert httpx.post(server.url + "/sub/run", timeout=5).json() == {
            "factory_runs": 1,
            "outer_runs": 0,
        }
        assert httpx.post(server.url + "/mine", timeout=5).json() == {
            "factory_runs": 0,
            "outer_runs": 1,
        }
