"""`scope="global"` route limits through the middleware: several real uvicorn processes on
127.0.0.1 configured only from GYM_CONCURRENCY_* variables, one redis-server, a witness
counter in Redis inside the handler."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.shared.redis_server import RedisServer
from tests.uvicorn_process import Uvicorn, clean_env

APP = '''
import asyncio, os

import redis.asyncio as redis
from fastapi import FastAPI

from gym_concurrency.middleware import ConcurrencyLimitMiddleware, ConcurrencyStatusView

witness = redis.from_url(os.environ["WITNESS_URL"])
KEY = os.environ["WITNESS_KEY"]
PEAK = """
local now = redis.call('INCR', KEYS[1])
if now > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], now) end
return now
"""
app = FastAPI()


@app.post("/run")
async def run(hold: float = 0.05, tag: str = "") -> dict[str, int]:
    await witness.eval(PEAK, 2, KEY, KEY + ":peak")
    if tag:
        await witness.rpush(KEY + ":order", tag)  # the order the global limit admitted in
    try:
        await asyncio.sleep(hold)
    finally:
        await witness.decr(KEY)
    return {"pid": os.getpid()}


@app.get("/health")
async def health() -> dict[str, bool]:
    return {"ok": True}


app.add_route("/concurrency", ConcurrencyStatusView())
app.add_middleware(ConcurrencyLimitMiddleware)  # settings from GYM_CONCURRENCY_*
'''


def route(limit: int, **fields: object) -> str:
    return json.dumps(
        [
            {
                "path": "/run",
                "limit_name": "shared_runs",
                "max_concurrent": limit,
                "scope": "global",
                "queue_timeout_seconds": 20,
                **fields,
            }
        ]
    )


class Servers:
    """N uvicorn processes serving the witness app with the same limit settings."""

    def __init__(
        self, folder: Path, redis_url: str, key: str, count: int, witness_url: str = "", **env: str
    ) -> None:
        (folder / "witness_app.py").write_text(APP)
        variables = clean_env(
            WITNESS_URL=witness_url or redis_url,
            WITNESS_KEY=key,
            **{
                "GYM_CONCURRENCY_REDIS_URL": redis_url,
                "GYM_CONCURRENCY_COMPONENT": f"global_{key}",
                **env,
            },
        )
        self._stack = ExitStack()
        self.servers = [Uvicorn(folder, "witness_app:app", variables) for _ in range(count)]
        for server in self.servers:
            self._stack.callback(server.stop)
        for server in self.servers:
            server.wait_serving("/health")

    def close(self) -> None:
        self._stack.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


def peak(redis_server: RedisServer, key: str) -> int:
    return int(redis_server.client().get(key + ":peak") or 0)


async def post_all(urls: list[str], n: int, hold: float = 0.05) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(
            *(client.post(f"{urls[i % len(urls)]}/run", params={"hold": hold}) for i in range(n))
        )


@pytest.fixture
def three(folder: Path, redis_server: RedisServer, key: str) -> Iterator[Servers]:
    servers = Servers(folder, redis_server.url, key, 3, GYM_CONCURRENCY_ROUTES=route(4))
    yield servers
    servers.close()


async def test_three_processes_never_hold_more_than_the_global_limit(
    three: Servers, redis_server: RedisServer, key: str
):
    responses = await post_all([s.url for s in three.servers], 90)
    assert [r.status_code for r in responses] == [200] * 90
    assert len({r.json()["pid"] for r in responses}) == 3
    assert peak(redis_server, key) == 4  # the limit was used to the full, never past it
    assert int(redis_server.client().get(key) or 0) == 0


async def test_a_killed_process_s_slots_pass_to_another_process_within_the_lease(
    folder: Path, redis_server: RedisServer, key: str
):
    servers = Servers(
        folder,
        redis_server.url,
        key,
        2,
        GYM_CONCURRENCY_ROUTES=route(2),
        GYM_CONCURRENCY_REDIS_LEASE_SECONDS="2",
    )
    try:
        doomed, survivor = servers.servers
        async with httpx.AsyncClient(timeout=30) as client:
            held = [
                asyncio.create_task(client.post(f"{doomed.url}/run", params={"hold": 60}))
                for _ in range(2)
            ]
            deadline = time.monotonic() + 10
            while peak(redis_server, key) < 2:
                assert time.monotonic() < deadline, "the doomed process never held both slots"
                await asyncio.sleep(0.05)
            waiting = asyncio.create_task(client.post(f"{survivor.url}/run"))
            await asyncio.sleep(0.5)
            assert not waiting.done()  # the global limit is full
            # The survivor's status view: the global state, and its own share of it.
            rows = (await client.get(f"{survivor.url}/concurrency?format=json")).json()["limits"]
            (row,) = [r for r in rows if r["limit_name"] == "shared_runs"]
            assert (row["scope"], row["limit"], row["available"]) == ("global", 2, 0)
            assert (row["active"], row["queue_depth"]) == (0, 1)  # this process's share
            assert row["global"]["active"] == 2
            assert row["global"]["queue_depth"] >= 1
            os.kill(doomed.process.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            answer = await asyncio.wait_for(waiting, 15)
            took = time.monotonic() - killed_at
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
        assert answer.status_code == 200
        assert took < 2 + 1.5, f"{took:.2f} s after the kill (lease 2 s)"
    finally:
        servers.close()


async def test_waiters_in_different_processes_are_admitted_in_arrival_order(
    folder: Path, redis_server: RedisServer, key: str
):
    servers = Servers(folder, redis_server.url, key, 3, GYM_CONCURRENCY_ROUTES=route(1))
    try:
        holder, first, second = servers.servers
        async with httpx.AsyncClient(timeout=30) as client:
            held = asyncio.create_task(client.post(f"{holder.url}/run", params={"hold": 1.5}))
            deadline = time.monotonic() + 10
            while peak(redis_server, key) < 1:
                assert time.monotonic() < deadline, "the holder was never admitted"
                await asyncio.sleep(0.02)
            # Arrivals 0.3 s apart, alternating processes: admitted in that order.
            waiting = []
            for n, server in enumerate([second, first, second, first]):
                waiting.append(
                    asyncio.create_task(
                        client.post(f"{server.url}/run", params={"tag": str(n), "hold": 0.02})
                    )
                )
                await asyncio.sleep(0.3)
            answers = await asyncio.gather(held, *waiting)
        assert [a.status_code for a in answers] == [200] * 5
        assert redis_server.client().lrange(key + ":order", 0, -1) == ["0", "1", "2", "3"]
    finally:
        servers.close()


async def test_a_quiet_flow_in_one_process_is_not_queued_behind_another_processs_flood(
    folder: Path, redis_server: RedisServer, key: str
):
    servers = Servers(
        folder, redis_server.url, key, 2, GYM_CONCURRENCY_ROUTES=route(2, flow="header:x-env")
    )
    try:
        flooded, quiet = servers.servers
        async with httpx.AsyncClient(timeout=30) as client:

            def post(
                server: Uvicorn, env: str, tag: str, hold: float = 0.1
            ) -> asyncio.Task[httpx.Response]:
                params = {"tag": tag, "hold": hold}
                return asyncio.create_task(
                    client.post(f"{server.url}/run", params=params, headers={"x-env": env})
                )

            flood = [post(flooded, "flood", f"flood{n}", hold=1.5 + n) for n in range(2)]
            deadline = time.monotonic() + 10
            while peak(redis_server, key) < 2:  # both slots held by the flood
                assert time.monotonic() < deadline, "the flood was never admitted"
                await asyncio.sleep(0.02)
            for n in range(2, 8):  # queued in that order
                flood.append(post(flooded, "flood", f"flood{n}"))
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.05)
            calm = post(quiet, "quiet", "quiet")  # the last to arrive, in another process
            answers = await asyncio.gather(*flood, calm)
        assert [a.status_code for a in answers] == [200] * 9
        order = redis_server.client().lrange(key + ":order", 0, -1)
        # The flood holds both slots; when one frees, the flood holds 1 and the quiet flow 0:
        # the quiet request goes next, ahead of the flood's backlog (one FIFO queue would
        # have put it last), and the flood keeps its own order.
        assert order.index("quiet") == 2, order
        flooded_order = [tag for tag in order if tag != "quiet"]
        assert set(flooded_order[:2]) == {"flood0", "flood1"}  # (sent together: either first)
        assert flooded_order[2:] == [f"flood{n}" for n in range(2, 8)]
    finally:
        servers.close()


@pytest.mark.parametrize("mode", ["refuse", "local"])
async def test_an_unreachable_redis_is_answered_by_redis_unavailable_then_recovers(
    folder: Path, own_redis: RedisServer, redis_server: RedisServer, key: str, mode: str
):
    # The limit lives in `own_redis`, paused here; the witness in the session's Redis.
    servers = Servers(
        folder,
        own_redis.url,
        key,
        1,
        witness_url=redis_server.url,
        GYM_CONCURRENCY_ROUTES=route(2, local_max_concurrent=1),
        GYM_CONCURRENCY_REDIS_UNAVAILABLE=mode,
    )
    try:
        (server,) = servers.servers
        assert (await post_all([server.url], 4))[0].status_code == 200
        own_redis.pause()
        try:
            answers = await post_all([server.url], 3)
        finally:
            own_redis.resume()
        if mode == "refuse":
            assert {r.status_code for r in answers} == {503}
            body = answers[0].json()
            assert body["type"] == "urn:gym-concurrency:limit-unavailable"
            assert answers[0].headers["retry-after"] == "20"
        else:
            assert {r.status_code for r in answers} == {200}
            assert peak(redis_server, key) <= 2
        # Back without restarting anything: the global limit admits again.
        deadline = time.monotonic() + 10
        while True:
            again = await post_all([server.url], 4)
            if {r.status_code for r in again} == {200}:
                break
            assert time.monotonic() < deadline, [r.status_code for r in again]
            await asyncio.sleep(0.2)
    finally:
        servers.close()


async def test_a_restarted_redis_leaves_no_slot_lost_or_phantom(
    folder: Path, own_redis: RedisServer, redis_server: RedisServer, key: str
):
    # Redis restarts empty while two processes hold slots: the held work is re-registered,
    # the limit admits again without restarting any server, and at the end no lease is left.
    servers = Servers(
        folder,
        own_redis.url,
        key,
        2,
        witness_url=redis_server.url,
        GYM_CONCURRENCY_ROUTES=route(2),
        GYM_CONCURRENCY_REDIS_LEASE_SECONDS="3",
    )
    # The limit's lease set in Redis (the key is the component's and the limit's name).
    leases = f"gym_concurrency:{{global_{key}/shared_runs}}:leases"
    try:
        urls = [s.url for s in servers.servers]
        async with httpx.AsyncClient(timeout=30) as client:
            held = [
                asyncio.create_task(client.post(f"{url}/run", params={"hold": 2})) for url in urls
            ]
            deadline = time.monotonic() + 10
            while own_redis.client().zcard(leases) < 2:
                assert time.monotonic() < deadline, "the two holders never held leases"
                await asyncio.sleep(0.05)
            own_redis.restart(down_seconds=0.5)
            answers = await asyncio.gather(*held)
        assert [a.status_code for a in answers] == [200, 200]
        deadline = time.monotonic() + 15
        while True:
            again = await post_all(urls, 20)
            if {r.status_code for r in again} == {200}:
                break
            assert time.monotonic() < deadline, [r.status_code for r in again]
            await asyncio.sleep(0.2)
        assert peak(redis_server, key) <= 2
        deadline = time.monotonic() + 10
        while own_redis.client().zcard(leases):
            assert time.monotonic() < deadline, "a lease was left behind"
            await asyncio.sleep(0.1)
    finally:
        servers.close()


async def test_sigterm_drains_and_another_process_gets_the_slots_at_once(
    folder: Path, redis_server: RedisServer, key: str
):
    servers = Servers(
        folder,
        redis_server.url,
        key,
        2,
        GYM_CONCURRENCY_ROUTES=route(2),
        GYM_CONCURRENCY_REDIS_LEASE_SECONDS="10",  # a lease's end cannot explain a fast hand-over
    )
    try:
        doomed, survivor = servers.servers
        async with httpx.AsyncClient(timeout=30) as client:

            async def timed(url: str, hold: float) -> tuple[httpx.Response, float]:
                response = await client.post(f"{url}/run", params={"hold": hold})
                return response, time.monotonic()

            held = [asyncio.create_task(timed(doomed.url, 0.6)) for _ in range(2)]
            deadline = time.monotonic() + 10
            while peak(redis_server, key) < 2:
                assert time.monotonic() < deadline, "the doomed process never held both slots"
                await asyncio.sleep(0.02)
            queued_there = [asyncio.create_task(timed(doomed.url, 0.05)) for _ in range(3)]
            waiting = asyncio.create_task(timed(survivor.url, 0.05))
            await asyncio.sleep(0.2)
            doomed.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            refused = await asyncio.gather(*queued_there)
            finished = await asyncio.gather(*held)
            answer, answered_at = await asyncio.wait_for(waiting, 15)
        assert doomed.exit_status() in (0, -signal.SIGTERM), doomed.log
    finally:
        servers.close()
    assert [r.status_code for r, _ in refused] == [503] * 3
    assert all("draining" in r.text and at - signalled < 1.0 for r, at in refused)
    assert [r.status_code for r, _ in finished] == [200, 200]  # admitted: let finish
    assert answer.status_code == 200
    # Admitted as the doomed process's slots came back (0.05 s of work, then the answer).
    took = answered_at - max(at for _, at in finished)
    assert took < 1.0, f"{took:.2f} s after the slots were given back (lease 10 s)"
