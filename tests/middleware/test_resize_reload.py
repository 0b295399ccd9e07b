"""Reloading settings into a running middleware: sizes change at once (growing admits waiters
in order, shrinking revokes nothing), gym.concurrency.limit shows every change, limits come and
go, all or nothing on a bad reload; and a SIGHUP handler in a real uvicorn process."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import textwrap
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from apps import Gate, make_app
from gym_concurrency.middleware import (
    ClientLimit,
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    OperationLimit,
    RouteLimit,
    concurrency_middleware,
    reload_settings,
)
from gym_concurrency.middleware.admission import ConcurrencyConfigError
from gym_concurrency.middleware.limits import ConcurrencyLimits
from gym_concurrency.middleware.settings.fixed import Fixed, fixed_fields
from servers import eventually

from gym_concurrency import COMPONENT_ATTRIBUTE, CONCURRENCY_LIMIT_INSTRUMENT, LIMIT_NAME_ATTRIBUTE
from tests.metrics_capture import MetricsCapture
from tests.registry import limits_of
from tests.servers import wait_until
from tests.uvicorn_process import clean_env, uvicorn


def settings(component: str, size: int = 1, **route: Any) -> ConcurrencySettings:
    config = {"path": "/run", "limit_name": "episodes", "max_concurrent": size, **route}
    return ConcurrencySettings(component=component, routes=[RouteLimit(**config)])


async def started(component: str, **kwargs: Any) -> tuple[Any, Gate, httpx.AsyncClient]:
    app, gate = make_app(settings(component, **kwargs))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    await client.get("/health")  # the first request builds the table (no lifespan here)
    return app, gate, client


async def hold(client: httpx.AsyncClient, gate: Gate, n: int) -> list[asyncio.Task[Any]]:
    tasks = [asyncio.create_task(client.post("/run", content=f"{i}".encode())) for i in range(n)]
    await asyncio.sleep(0.05)
    return tasks


async def test_growing_admits_the_waiters_at_once_in_arrival_order(component: str):
    app, gate, client = await started(component, size=1)
    tasks = await hold(client, gate, 4)
    semaphore = limits_of(component)["episodes"]
    assert (semaphore.active, semaphore.queue_depth) == (1, 3)
    changes = reload_settings(app, settings(component, size=3))
    assert changes == ["route limit 'episodes': 1 -> 3, static"]
    assert (semaphore.limit, semaphore.active, semaphore.queue_depth) == (3, 3, 1)
    await eventually(lambda: gate.inside == 3, "the two admitted to reach the app")
    gate.open = True
    bodies = [(await t).json()["body"] for t in tasks]
    assert bodies == ["0", "1", "2", "3"]
    await client.aclose()


async def test_shrinking_revokes_no_held_slot(component: str):
    app, gate, client = await started(component, size=3)
    tasks = await hold(client, gate, 5)
    semaphore = limits_of(component)["episodes"]
    reload_settings(app, settings(component, size=1))
    assert (semaphore.limit, semaphore.active, semaphore.available) == (1, 3, 0)
    assert gate.inside == 3  # nobody was stopped
    gate.open = True
    assert [(await t).status_code for t in tasks] == [200] * 5
    assert semaphore.active == 0
    await client.aclose()


async def test_every_change_shows_in_gym_concurrency_limit(component: str, metrics: MetricsCapture):
    app, _ = make_app(settings(component, size=2), meter_provider=metrics.provider)
    mine = {(COMPONENT_ATTRIBUTE, component), (LIMIT_NAME_ATTRIBUTE, "episodes")}

    def reported() -> Any:
        values = metrics.values(CONCURRENCY_LIMIT_INSTRUMENT)
        return next(v for k, v in values.items() if mine <= k)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        await c.get("/health")
        assert reported() == 2
        for size in (5, 1, 8):
            reload_settings(app, settings(component, size=size))
            assert reported() == size
        adaptive = {"min_concurrent": 2, "max_concurrent": 16}
        reload_settings(app, settings(component, size=4, adaptive=adaptive))
        assert reported() == 4  # an adaptive limit starts at max_concurrent


async def test_limits_can_be_added_removed_and_made_adaptive(component: str):
    app, gate, client = await started(component, size=2)
    both = ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(
                path="/run",
                limit_name="episodes",
                max_concurrent=2,
                adaptive={"min_concurrent": 1, "max_concurrent": 8},
            ),
            RouteLimit(path="/other", limit_name="other", max_concurrent=5),
        ],
        operations=[
            OperationLimit(
                limit_name="judge", operation="judge", executor="inline", max_concurrent=3
            )
        ],
    )
    changes = reload_settings(app, both)
    assert changes == [
        "route limit 'episodes': 2 -> 2, adaptive (gradient, 1..8)",
        "route limit 'other' added: 5, static",
        "operation limit 'judge' added: 3",
    ]
    assert {n: s.limit for n, s in limits_of(component).items()} == {
        "episodes": 2,
        "other": 5,
        "judge": 3,
    }
    middleware = concurrency_middleware(app)
    feedback = middleware.limits.routes[0].feedback
    assert feedback is not None
    assert feedback.limiter is not None
    changes = reload_settings(app, settings(component, size=6))
    assert changes == [
        "route limit 'episodes': 2 -> 6, static",
        "route limit 'other' removed",
        "operation limit 'judge' removed",
    ]
    assert feedback.limiter.stopped  # the old controller moves the limit no more
    gate.open = True
    assert (await client.post("/other", content=b"")).status_code == 200  # no longer limited
    await client.aclose()


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"queue_timeout_seconds": 5}, ValueError, r"routes\.0\.queue_timeout_seconds.*restart"),
        ({"max_queue": 3}, ValueError, r"routes\.0\.max_queue.*restart"),
        ({"path": "/nowhere"}, ConcurrencyConfigError, "/nowhere"),
    ],
)
async def test_a_reload_that_cannot_apply_changes_nothing(component: str, change, error, match):
    app, _, client = await started(component, size=2)
    before = concurrency_middleware(app).limits
    with pytest.raises(error, match=match):
        reload_settings(app, settings(component, size=7, **change))
    assert concurrency_middleware(app).limits is before
    assert limits_of(component)["episodes"].limit == 2
    with pytest.raises(ValueError, match="component"):
        reload_settings(app, settings(component + "_other", size=7))
    await client.aclose()


def test_the_fields_a_reload_refuses_are_those_marked_fixed(component: str):
    class TaggedRoute(RouteLimit):  # a field added later, marked: refused with no list to edit
        tag: Annotated[str, Fixed] = "a"

    def tagged(tag: str, size: int) -> ConcurrencySettings:
        route = TaggedRoute(path="/run", limit_name="episodes", max_concurrent=size, tag=tag)
        return ConcurrencySettings(component=component, routes=[route])

    running = ConcurrencyLimits(tagged("a", 1))
    assert ConcurrencyLimits(tagged("a", 2), previous=running).apply() == [
        "route limit 'episodes': 1 -> 2, static"
    ]
    with pytest.raises(ValueError, match=r"routes\.0\.tag: limit 'episodes' is running with"):
        ConcurrencyLimits(tagged("b", 2), previous=running)
    assert fixed_fields(RouteLimit) == {
        "queue_timeout_seconds",
        "max_queue",
        "scope",
        "local_max_concurrent",
        "backfill_seconds",
    }
    assert fixed_fields(OperationLimit) == {
        "timeout_seconds",
        "scope",
        "local_max_concurrent",
        "backfill_seconds",
    }
    assert fixed_fields(ClientLimit) == {
        "timeout_seconds",
        "max_queue",
        "scope",
        "adaptive",
        "local_max_concurrent",
        "backfill_seconds",
    }
    assert fixed_fields(ConcurrencySettings) == {
        "redis_url",
        "redis_unavailable",
        "redis_lease_seconds",
        "redis_key_prefix",
    }


def test_reload_off_the_event_loop_says_how_to_call_it(component: str):
    middleware = ConcurrencyLimitMiddleware(make_app(settings(component))[0])
    with pytest.raises(RuntimeError, match="call_soon_threadsafe"):
        middleware.reload(settings(component, size=2))


def test_before_the_app_starts_there_is_no_middleware_to_find():
    app, _ = make_app(ConcurrencySettings(component="not_started"))
    with pytest.raises(LookupError, match="once the app has started"):
        concurrency_middleware(app)


def test_nothing_reachable_over_http_can_change_a_limit(component: str):
    app, _ = make_app(settings(component))
    paths = {getattr(route, "path", None) for route in app.routes}
    # The middleware adds no route of its own: a reload is an API call in the app.
    assert paths == {getattr(r, "path", None) for r in make_app(settings(component))[0].routes}
    assert not any("reload" in str(p) or "resize" in str(p) for p in paths)


def sighup_app() -> str:
    """docs/adaptive-limits.md's SIGHUP block as it stands, with a route to limit and the
    status view to read the limit from."""
    doc = (Path(__file__).parents[2] / "docs" / "adaptive-limits.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    block = next(b for b in blocks if "add_signal_handler" in b)
    return block + textwrap.dedent("""
        from gym_concurrency.middleware import ConcurrencyStatusView


        @app.post("/run")
        async def run():
            return {"ok": True}


        app.add_route("/concurrency", ConcurrencyStatusView())
    """)


def test_sighup_reloads_the_settings_file_in_a_real_server(tmp_path: Path, component: str):
    (tmp_path / "sighup_app.py").write_text(sighup_app())
    limits_file = tmp_path / "limits.yaml"

    def write(size: int) -> None:
        limits_file.write_text(
            textwrap.dedent(f"""
            component: {component}
            routes:
              - {{path: /run, limit_name: episodes, max_concurrent: {size}}}
        """)
        )

    write(4)
    env = clean_env(LIMITS_FILE=str(limits_file))
    with uvicorn(tmp_path, "sighup_app:app", env, "--lifespan", "on") as server:
        server.wait_serving("/concurrency")

        def limit() -> int:
            rows = httpx.get(server.url + "/concurrency?format=json").json()["limits"]
            return next(r["limit"] for r in rows if r["component"] == component)

        assert limit() == 4
        write(9)
        os.kill(server.process.pid, signal.SIGHUP)
        wait_until(lambda: limit() == 9, what="the reloaded limit")
        # Shown under uvicorn's default logging, one line per change.
        change = "gym_concurrency reload: route limit 'episodes': 4 -> 9, static"
        wait_until(lambda: change in server.log, what="the change in the log")
        limits_file.write_text("routes: [{path: /run, limit_name: episodes}]\n")  # invalid
        os.kill(server.process.pid, signal.SIGHUP)
        wait_until(lambda: server.log.count("reload refused") == 1, what="the refusal")
        limits_file.unlink()  # a missing file is refused the same way, no traceback
        os.kill(server.process.pid, signal.SIGHUP)
        wait_until(lambda: server.log.count("reload refused") == 2, what="the second refusal")
        assert "No such file or directory" in server.log
        assert "Traceback" not in server.log
        assert limit() == 9
        assert server.process.poll() is None
        assert httpx.post(server.url + "/run").status_code == 200


async def test_a_reload_says_every_field_it_changed(component: str):
    app, _, client = await started(component, size=1, retry_after_seconds=5)
    changes = reload_settings(app, settings(component, size=1, retry_after_seconds=7))
    assert changes == ["route limit 'episodes': retry_after_seconds 5 -> 7"]
    changes = reload_settings(
        app, settings(component, size=1, retry_after_seconds=7, failure="openai")
    )
    assert changes == ["route limit 'episodes': failure 'problem' -> 'openai'"]
    same = settings(component, size=1, retry_after_seconds=7, failure="openai")
    assert reload_settings(app, same) == []  # nothing changed: nothing said
    await client.aclose()


async def test_a_kept_adaptive_limit_says_what_else_changed(component: str):
    adaptive = {"min_concurrent": 1, "max_concurrent": 4}
    app, _, client = await started(component, size=2, adaptive=adaptive, retry_after_seconds="auto")
    changes = reload_settings(
        app, settings(component, size=2, adaptive=adaptive, retry_after_seconds=7)
    )
    assert changes == ["route limit 'episodes': retry_after_seconds 'auto' -> 7"]
    await client.aclose()


async def test_a_settings_wide_change_is_said_too(component: str):
    app, _, client = await started(component, size=1)
    both = settings(component, size=1).model_copy(update={"close_connection_on_refusal": False})
    assert reload_settings(app, both) == ["close_connection_on_refusal True -> False"]
    await client.aclose()


async def test_a_refused_reload_names_the_field_once(component: str):
    # The caller says "reload refused: ..." (docs/adaptive-limits.md): the error itself names
    # the field, with one prefix.
    app, _, client = await started(component, size=2)
    with pytest.raises(ConcurrencyConfigError) as refused:
        reload_settings(app, settings(component, size=2, path="/nowhere"))
    message = str(refused.value)
    assert message.startswith("gym_concurrency: routes.0.path '/nowhere' matches no route")
    assert message.count("gym_concurrency") == 1
    assert "refused" not in message
    await client.aclose()


async def test_a_reload_cannot_move_global_limits_and_never_logs_a_password(component: str):
    url = "redis://:hunter2@127.0.0.1:6399/0"  # never connected: no request reaches a limit
    config = {"path": "/run", "limit_name": "episodes", "max_concurrent": 2, "scope": "global"}
    first = ConcurrencySettings(component=component, redis_url=url, routes=[RouteLimit(**config)])
    app, _ = make_app(first)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    await client.get("/health")
    moved = first.model_copy(update={"redis_url": "redis://:s3cret@127.0.0.1:6398/0"})
    with pytest.raises(ValueError, match="redis_url: the running global limits") as refused:
        reload_settings(app, moved)
    assert "hunter2" not in str(refused.value)
    assert "s3cret" not in str(refused.value)
    local = first.model_copy(update={"redis_unavailable": "local"})
    with pytest.raises(ValueError, match="redis_unavailable"):
        reload_settings(app, local)
    await client.aclose()


async def test_a_settings_wide_redis_url_line_hides_the_password(component: str):
    app, _, client = await started(component, size=1)
    with_url = settings(component, size=1).model_copy(
        update={"redis_url": "redis://user:hunter2@127.0.0.1:6379/0"}
    )
    changes = reload_settings(app, with_url)
    assert changes == ["redis_url None -> 'redis://user:***@127.0.0.1:6379/0'"]
    await client.aclose()
