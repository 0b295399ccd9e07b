"""Chaos soak through a real uvicorn server: after thousands of plain, streaming, crashing,
timing-out, shed and abandoned requests, every slot is back and every request that reached
the middleware has exactly one admission outcome; the server's memory stays flat.

GYM_SOAK_REQUESTS (default 20,000) sets the size; the RSS after 10,000 requests is compared
with the RSS at the end (docs/reliability.md records a 100,000-request run).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.load import KINDS, Tally, run_load
from tests.reliability.soak_app import COMPONENT, ROUTE_LIMITS
from tests.reliability.soak_server import Scrape, SoakServer

SOAK_REQUESTS = int(os.environ.get("GYM_SOAK_REQUESTS", "20000"))
WARM_UP_REQUESTS = 10_000
# Growth of the server's RSS allowed between the 10,000th request and the last one.
RSS_SLACK_MIB = float(os.environ.get("GYM_SOAK_RSS_SLACK_MIB", "4"))

WAIT_COUNT = "gym_concurrency_queue_wait_duration_ms_milliseconds_count"
OUTCOME_COUNTERS = {
    "timeout": "gym_concurrency_admission_timeouts_total",
    "cancelled": "gym_concurrency_admission_cancelled_total",
    "shed": "gym_concurrency_admission_shed_total",
}
# The client's name for each admission outcome of a kind that waits for its answer.
CLIENT_OUTCOMES = {"timeout": "timeout", "shed": "shed"}
DRAIN_SECONDS = 15.0
ABANDONED_PATHS = {"/hold"}  # clients hang up before the server may have read the request


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SoakServer]:
    with SoakServer(tmp_path / "server.log") as running:
        yield running


def limit_labels(limit_name: str) -> dict[str, str]:
    return {
        "nemo_gym_concurrency_component": COMPONENT,
        "nemo_gym_concurrency_limit_name": limit_name,
    }


def admission_outcomes(scrape: Scrape, limit_name: str) -> dict[str, int]:
    """Admission attempts per outcome, from the queue-wait histogram's counts."""
    return {
        outcome: int(
            scrape.value(
                WAIT_COUNT,
                nemo_gym_concurrency_admission_outcome=outcome,
                **limit_labels(limit_name),
            )
            or 0
        )
        for outcome in ("admitted", "timeout", "cancelled", "shed")
    }


def reached(scrape: Scrape, path: str) -> int:
    """Requests that reached the middleware on `path` (the app's outermost counter)."""
    return int(scrape.value("soak_requests_total", path=path) or 0)


def settled(scrape: Scrape) -> bool:
    """Nothing held, nothing queued, and every request that arrived has an outcome."""
    for path, route in ROUTE_LIMITS.items():
        labels = limit_labels(route.limit_name)
        if scrape.value("gym_concurrency_active", **labels) != 0:
            return False
        if scrape.value("gym_concurrency_queue_depth", **labels) != 0:
            return False
        if sum(admission_outcomes(scrape, route.limit_name).values()) != reached(scrape, path):
            return False
    return True


async def drain(server: SoakServer) -> Scrape:
    """The first scrape after the traffic stops at which everything has settled (or the
    last one, after DRAIN_SECONDS, for the assertions to report on)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_SECONDS
    scrape = await server.scrape()
    while not settled(scrape) and loop.time() < deadline:
        await asyncio.sleep(0.05)
        scrape = await server.scrape()
    return scrape


def client_sent(tally: Tally, path: str) -> int:
    return sum(tally.sent[kind] for kind, (_, _, kind_path) in KINDS.items() if kind_path == path)


def client_got(tally: Tally, path: str, outcome: str) -> int:
    return sum(
        tally.count(kind, outcome) for kind, (_, _, kind_path) in KINDS.items() if kind_path == path
    )


def check_limit(scrape: Scrape, tally: Tally, path: str) -> dict[str, int]:
    """Every promise about one limit after the drain; its outcome counts."""
    name = ROUTE_LIMITS[path].limit_name
    labels = limit_labels(name)
    assert scrape.value("gym_concurrency_active", **labels) == 0, f"{name}: a slot leaked"
    assert scrape.value("gym_concurrency_queue_depth", **labels) == 0, f"{name}: still queued"
    assert scrape.value("gym_concurrency_available", **labels) == ROUTE_LIMITS[path].max_concurrent
    outcomes = admission_outcomes(scrape, name)
    arrived = reached(scrape, path)
    assert sum(outcomes.values()) == arrived, f"{name}: {outcomes} vs {arrived} arrived"
    for outcome, counter in OUTCOME_COUNTERS.items():
        # The semaphore's own counter agrees with the histogram (absent: never happens).
        assert int(scrape.value(counter, **labels) or 0) == outcomes[outcome], (name, outcome)
    calls = int(scrape.value("soak_handler_calls_total", path=path) or 0)
    assert calls == outcomes["admitted"], f"{name}: app called {calls}x, admitted {outcomes}"
    if path in ABANDONED_PATHS:
        assert arrived <= client_sent(tally, path)
    else:
        assert arrived == client_sent(tally, path), f"{name}: sent vs arrived"
        assert outcomes["cancelled"] == 0, f"{name}: cancelled with no client leaving"
        for outcome, client_name in CLIENT_OUTCOMES.items():
            assert outcomes[outcome] == client_got(tally, path, client_name), (name, outcome)
    return outcomes


def check_server_log(log: str, crashes: int) -> None:
    """The only errors the server logged are the crashing route's, once per crash."""
    errors = [line for line in log.splitlines() if re.match(r"(ERROR|CRITICAL|WARNING)", line)]
    assert errors.count("ERROR:    Exception in ASGI application") == crashes
    assert len(errors) == crashes, [e for e in errors if "Exception in ASGI" not in e][:5]
    assert log.count("RuntimeError: soak: this route always crashes") == crashes


@pytest.mark.slow
@pytest.mark.timeout(60 + SOAK_REQUESTS // 400)
async def test_chaos_soak_keeps_exact_counts_and_returns_every_slot(server: SoakServer):
    assert SOAK_REQUESTS > WARM_UP_REQUESTS
    tally = await run_load(server.port, WARM_UP_REQUESTS, seed=1)
    await drain(server)
    rss_warm = server.rss_kib()
    tally.add(
        await run_load(
            server.port, SOAK_REQUESTS - WARM_UP_REQUESTS, seed=2, first_index=WARM_UP_REQUESTS
        )
    )
    scrape = await drain(server)
    rss_end = server.rss_kib()

    assert not tally.violations, tally.violations
    assert sum(tally.sent.values()) == SOAK_REQUESTS
    outcomes = {path: check_limit(scrape, tally, path) for path in ROUTE_LIMITS}
    # The mix really did what it is for: each failure mode happened, many times.
    assert outcomes["/slow"]["timeout"] > 100
    assert outcomes["/shed"]["shed"] > 100
    assert outcomes["/episode"]["shed"] + outcomes["/episode"]["timeout"] > 10
    assert outcomes["/hold"]["cancelled"] > 100  # clients that left while queued
    assert outcomes["/hold"]["admitted"] > 10  # ... and some that left while running
    assert tally.count("stream_abandon", "abandoned") > 100
    assert outcomes["/crash"]["admitted"] == tally.count("crash", "error 500") > 100
    check_server_log(server.log(), outcomes["/crash"]["admitted"])

    growth_mib = (rss_end - rss_warm) / 1024
    total = {o: sum(by_path[o] for by_path in outcomes.values()) for o in outcomes["/plain"]}
    print(
        f"\nsoak: {SOAK_REQUESTS} requests, {sum(total.values())} reached the middleware "
        f"{total}; RSS after {WARM_UP_REQUESTS}: {rss_warm / 1024:.1f} MiB, "
        f"after {SOAK_REQUESTS}: {rss_end / 1024:.1f} MiB (growth {growth_mib:+.2f} MiB)"
    )
    assert growth_mib < RSS_SLACK_MIB, f"RSS grew {growth_mib:.2f} MiB"
