"""`backfill_seconds` on route, operation and client limits: the process limits made from the
settings backfill (docs/flows.md, "Backfill"); a bad value, a global limit with backfill, routes
sharing a limit that disagree on it and a reload that changes it are refused, naming it."""

from __future__ import annotations

import pytest
from gym_concurrency.middleware import (
    ClientLimit,
    ConcurrencySettings,
    OperationLimit,
    RouteLimit,
)
from gym_concurrency.middleware.limits import ConcurrencyLimits
from pydantic import ValidationError

from gym_concurrency import MeteredSemaphore


def every_kind(component: str, backfill: float, **route: object) -> ConcurrencySettings:
    return ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path="/judge",
                limit_name="judge_tokens",
                max_concurrent=64_000,
                weight="openai_tokens",
                backfill_seconds=backfill,
                **route,  # type: ignore[arg-type]
            )
        ],
        operations=[
            OperationLimit(
                limit_name="verify",
                operation="verify",
                executor="inline",
                max_concurrent=8,
                backfill_seconds=backfill,
            )
        ],
        clients=[ClientLimit(limit_name="model", max_concurrent=4, backfill_seconds=backfill)],
    )


def test_every_process_limit_made_from_settings_backfills(component: str) -> None:
    limits = ConcurrencyLimits(every_kind(component, 0.5))
    made = [limits.routes[0].limit, limits.operation("verify").limit, limits.client("model").limit]
    for limit in made:
        assert isinstance(limit, MeteredSemaphore)
        assert limit.backfill_seconds == 0.5
    default = ConcurrencyLimits(every_kind(component + "_default", 0.0)).routes[0].limit
    assert isinstance(default, MeteredSemaphore)
    assert default.backfill_seconds == 0.0


@pytest.mark.parametrize("value", [-1, float("inf"), float("nan"), "soon"])
def test_a_bad_backfill_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ValidationError, match="backfill_seconds"):
        RouteLimit(path="/judge", limit_name="judge", max_concurrent=4, backfill_seconds=value)  # type: ignore[arg-type]


def test_a_global_limit_backfills_only_with_a_budget() -> None:
    def settings(**budget: int) -> ConcurrencySettings:
        route = RouteLimit(
            path="/judge",
            limit_name="judge",
            max_concurrent=4,
            scope="global",
            backfill_seconds=1.0,
            **budget,
        )
        return ConcurrencySettings(
            component="c", redis_url="redis://127.0.0.1:6379/0", routes=[route]
        )

    with pytest.raises(ValidationError, match=r"routes\.0\.backfill_seconds: .* has none"):
        settings()
    assert settings(requests_per_minute=60).routes[0].backfill_seconds == 1.0


def test_routes_sharing_a_limit_agree_on_backfill() -> None:
    with pytest.raises(ValidationError, match=r"routes\.1\.backfill_seconds: limit_name 'judge'"):
        ConcurrencySettings(
            component="c",
            routes=[
                RouteLimit(path="/a", limit_name="judge", max_concurrent=4, backfill_seconds=1),
                RouteLimit(path="/b", limit_name="judge", max_concurrent=4),
            ],
        )


def test_backfill_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYM_CONCURRENCY_COMPONENT", "judge_server")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__PATH", "/judge")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__LIMIT_NAME", "judge_tokens")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__MAX_CONCURRENT", "64000")
    monkeypatch.setenv("GYM_CONCURRENCY_ROUTES__0__BACKFILL_SECONDS", "0.75")
    assert ConcurrencySettings().routes[0].backfill_seconds == 0.75


def test_a_reload_cannot_change_backfill(component: str) -> None:
    before = ConcurrencyLimits(every_kind(component, 0.5))
    with pytest.raises(ValueError, match=r"routes\.0\.backfill_seconds.*restart"):
        ConcurrencyLimits(every_kind(component, 1.0), previous=before)
