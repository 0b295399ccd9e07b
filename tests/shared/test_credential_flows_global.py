"""A credential read as a flow never leaves the request raw: two real uvicorn processes with a
route `flow: header:authorization` on a global limit (a real redis-server, paused once so that
the lost-leases WARNING lists lease ids) and on a process limit. The secret, and every part of
it 8 characters long, is in no Redis key or value, no /metrics line, no status page (JSON or
HTML) and no log line; the two processes, sharing flow_key, see one flow per credential."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from gym_concurrency.hashed_flows import hashed_flow
from tests.shared.redis_server import RedisServer
from tests.uvicorn_process import Uvicorn, clean_env

APP = """
import asyncio, logging

from fastapi import FastAPI
from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import make_asgi_app

from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencyStatusView

logging.basicConfig(level=logging.INFO)  # every line the library logs reaches the log file
logging.getLogger("gym_concurrency").setLevel(logging.DEBUG)
metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
app = FastAPI()


@app.post("/run")
async def run(hold: float = 0.0) -> dict[str, bool]:
    await asyncio.sleep(hold)
    return {"ok": True}


@app.post("/local")
async def local(hold: float = 0.0) -> dict[str, bool]:
    await asyncio.sleep(hold)
    return {"ok": True}


@app.get("/health")
async def health() -> dict[str, bool]:
    return {"ok": True}


app.mount("/metrics", make_asgi_app())
app.add_route("/concurrency", ConcurrencyStatusView())
app.add_middleware(ConcurrencyLimitMiddleware)  # settings from GYM_CONCURRENCY_*
"""
KEY = "replicas-share-this-flow-key-0123"
LEASE_SECONDS = 1.5
HOLD = 5.0  # the holders': long enough to dump, scrape and pause Redis while they are in


def token() -> str:
    # Letters no hex id, uuid or number in the outputs has: a window of it found is a leak.
    return "sk-live-" + "".join(secrets.choice("GHJKLMNPQRSTUVWXYZ") for _ in range(32))


def windows(secret: str, size: int = 8) -> set[str]:
    """Every part of `secret` `size` characters long (any longer part contains one)."""
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


def routes() -> str:
    common = {"max_concurrent": 2, "queue_timeout_seconds": 30, "flow": "header:authorization"}
    return json.dumps(
        [
            {"path": "/run", "limit_name": "global_runs", "scope": "global", **common},
            {"path": "/local", "limit_name": "local_runs", **common},
        ]
    )


@contextmanager
def two_servers(folder: Path, redis_url: str, key: str, **env: str) -> Iterator[list[Uvicorn]]:
    (folder / "credential_app.py").write_text(APP)
    variables = clean_env(
        GYM_CONCURRENCY_REDIS_URL=redis_url,
        GYM_CONCURRENCY_COMPONENT=f"creds_{key}",
        GYM_CONCURRENCY_ROUTES=routes(),
        GYM_CONCURRENCY_REDIS_LEASE_SECONDS=str(LEASE_SECONDS),
        **env,
    )
    started = [Uvicorn(folder, "credential_app:app", variables) for _ in range(2)]
    try:
        for server in started:
            server.wait_serving("/health")
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def servers(tmp_path: Path, own_redis: RedisServer, key: str) -> Iterator[list[Uvicorn]]:
    with two_servers(tmp_path, own_redis.url, key, GYM_CONCURRENCY_FLOW_KEY=KEY) as started:
        yield started


def redis_dump(client: redis.Redis, match: str = "*") -> str:
    """Every key of the Redis (matching `match`) and everything in it, whatever its type, as
    one text."""
    lines = []
    for name in client.scan_iter(match=match, count=1000):
        kind = client.type(name)
        if kind == "string":
            value: object = client.get(name)
        elif kind == "hash":
            value = client.hgetall(name)
        elif kind == "list":
            value = client.lrange(name, 0, -1)
        elif kind == "set":
            value = sorted(client.smembers(name))
        elif kind == "zset":
            value = client.zrange(name, 0, -1, withscores=True)
        elif kind == "stream":
            value = client.xrange(name)
        else:
            value = f"<{kind}>"
        lines.append(f"{name} {kind} {value!r}")
    return "\n".join(lines)


def flows_by_process(dump: str) -> dict[str, set[str]]:
    """The processes with a lease or a waiter in each named flow, by the ids in Redis."""
    found: dict[str, set[str]] = {}
    for proc, flow in re.findall(r"([0-9a-f]{32}):\d+(?:\*\d+)?@(h:[0-9a-f]{16})", dump):
        found.setdefault(flow, set()).add(proc)
    return found


def scrape(server: Uvicorn) -> str:
    pages = [
        httpx.get(server.url + "/metrics/", timeout=10).text,
        httpx.get(server.url + "/concurrency?format=json", timeout=10).text,
        httpx.get(server.url + "/concurrency?format=html", timeout=10).text,
    ]
    return "\n".join(pages)


async def send(
    server: Uvicorn, path: str, credential: str, n: int, hold: float = 0.0
) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        return await asyncio.gather(
            *(
                client.post(path, params={"hold": hold}, headers={"authorization": credential})
                for _ in range(n)
            )
        )


async def until(condition, what: str, seconds: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_credential_flow_is_nowhere_raw_and_one_flow_across_processes(
    servers: list[Uvicorn], own_redis: RedisServer
) -> None:
    first, second = servers
    team_a, team_b = f"Bearer {token()}", f"Bearer {token()}"
    client = own_redis.client()

    def count(kind: str) -> int:
        return int(client.zcard(next(client.scan_iter(f"*global_runs*{kind}"), "none")) or 0)

    sent = [  # a holder in each process, then waiters behind them (which then run at once)
        asyncio.create_task(send(first, "/run", team_a, 1, HOLD)),
        asyncio.create_task(send(second, "/run", team_a, 1, HOLD)),
        asyncio.create_task(send(first, "/local", team_a, 2, HOLD)),
    ]
    await until(lambda: count("leases") == 2, "the two holders to get in")
    sent += [
        asyncio.create_task(send(first, "/run", team_a, 2)),
        asyncio.create_task(send(second, "/run", team_a, 2)),
        asyncio.create_task(send(second, "/run", team_b, 2)),
        asyncio.create_task(send(first, "/local", team_b, 1)),
    ]
    await until(lambda: count("queue") == 6, "6 waiters to queue in Redis")
    dump = redis_dump(client)
    pages = await asyncio.to_thread(lambda: scrape(first) + scrape(second))

    # Two processes, one key: one flow per credential on the global limit, across both.
    a, b = hashed_flow(team_a, KEY.encode()), hashed_flow(team_b, KEY.encode())
    by_flow = flows_by_process(dump)
    assert set(by_flow) == {a, b}, dump
    assert len(by_flow[a]) == 2  # team a's leases and waiters in both processes: one flow
    assert a in pages  # the process limit's flows are on the status page and in /metrics

    own_redis.pause()  # the heartbeat cannot renew: a WARNING lists the leases lost
    try:
        await until(
            lambda: "could not renew" in first.log + second.log, "the lost-leases WARNING", 15
        )
    finally:
        own_redis.resume()
    for task in sent:
        responses = await task
        assert all(r.status_code in (200, 503) for r in responses), [r.text for r in responses]
    logs = first.log + second.log
    assert re.search(rf"could not renew .*\(leases: [^)]*@{a}", logs), logs

    everything = "\n".join([dump, redis_dump(client), pages, logs])
    for credential in (team_a, team_b):
        leaked = [part for part in windows(credential) if part in everything]
        assert leaked == [], f"parts of a credential were kept raw: {leaked}"


async def test_without_a_key_each_process_hashes_apart_and_says_so_once(
    tmp_path: Path, redis_server: RedisServer, key: str
) -> None:
    credential = f"Bearer {token()}"
    with two_servers(tmp_path, redis_server.url, key) as (first, second):
        sent = [
            asyncio.create_task(send(server, path, credential, 2, hold=1.0))
            for server in (first, second)
            for path in ("/run", "/local")
        ]
        client, mine = redis_server.client(), f"*creds_{key}*"
        await until(lambda: len(flows_by_process(redis_dump(client, mine))) == 2, "two ids")
        by_flow = flows_by_process(redis_dump(client, mine))
        for task in sent:
            assert [r.status_code for r in await task] == [200, 200]
        logs = [first.log, second.log]
    assert sorted(len(procs) for procs in by_flow.values()) == [1, 1]  # one flow per process
    assert [log.count("flow_key is not set") for log in logs] == [1, 1], logs
    assert not any(part in "".join(logs) for part in windows(credential))
