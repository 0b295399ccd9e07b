"""A misconfigured global limit fails its start with a message that says what is wrong and
names `redis_url` (never its password), instead of reading as an outage (a warning, then
every admission refused, or with `local` each process silently on its own): a wrong or
missing Redis password, a TLS certificate the client does not trust, a Redis without the
commands the limit needs, and two processes configuring one limit with different sizes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.shared.faults.fleet import Fleet
from tests.shared.faults.runs import FAST
from tests.shared.redis_server import RedisServer, free_port
from tests.uvicorn_process import Uvicorn, clean_env

SECRET = "s3cret-Pa55"


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server that requires a password."""
    server = RedisServer(tmp_path, password=SECRET)
    yield server
    server.stop()


def failed_start(reply: dict[str, str], port: int, *words: str) -> str:
    """The error a failed start answered: a configuration error naming the Redis, without
    the password, and saying what is wrong (`words`, any of them)."""
    assert "error" in reply, f"the start did not fail: {reply}"
    error = reply["error"]
    assert error.startswith("LimitConfigurationError"), error
    assert f"127.0.0.1:{port}" in error, error
    assert SECRET not in error, error
    assert any(word in error.lower() for word in words), error
    return error


@pytest.mark.parametrize("password", ["wrong-password", None])
def test_a_wrong_or_missing_password_fails_the_start(
    fleet: Fleet, locked: RedisServer, password: str | None
) -> None:
    secret = f":{password}@" if password else ""
    url = f"redis://{secret}127.0.0.1:{locked.port}/0"
    agent = fleet.start("a", url, 2, connect=False, **FAST)
    error = failed_start(agent.ask("connect"), locked.port, "authentication", "password")
    if password:
        assert password not in error
    right = fleet.start("b", f"redis://:{SECRET}@127.0.0.1:{locked.port}/0", 2, **FAST)
    assert right.ask("hold", slots=2) == {"held": 2}  # the right password works
    right.ask("release")


def test_a_redis_without_the_limit_s_commands_fails_the_start(fleet: Fleet, tmp_path: Path) -> None:
    server = RedisServer(
        tmp_path, "--rename-command", "EVALSHA", "", "--rename-command", "EVAL", ""
    )
    try:
        agent = fleet.start("a", server.url, 2, connect=False, **FAST)
        failed_start(agent.ask("connect"), server.port, "unknown command")
    finally:
        server.stop()


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[tuple[RedisServer, int, Path]]:
    """A redis-server with a TLS port (a self-signed certificate for 127.0.0.1) beside its
    plain one: (server, TLS port, the certificate)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    server = RedisServer(
        tmp_path,
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
        "--tls-auth-clients",
        "no",
    )
    yield server, port, cert
    server.stop()


def test_an_untrusted_tls_certificate_fails_the_start(
    fleet: Fleet, tls: tuple[RedisServer, int, Path]
) -> None:
    _, port, cert = tls
    agent = fleet.start("a", f"rediss://127.0.0.1:{port}/0", 2, connect=False, **FAST)
    failed_start(agent.ask("connect"), port, "tls", "certificate", "ssl")
    # (A TLS handshake on a busy machine can outlast FAST's Redis timeout.)
    slow = {"lease_seconds": 3.0, "redis_timeout": 1.0}
    trusted = fleet.start("b", f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}", 2, **slow)
    assert trusted.ask("hold", slots=2) == {"held": 2}  # TLS set up right works
    trusted.ask("release")


def test_two_processes_configuring_one_limit_with_different_sizes_fail_the_second(
    fleet: Fleet, store: RedisServer
) -> None:
    first = fleet.start("first", store.url, 5, **FAST)
    second = fleet.start("second", store.url, 2, connect=False, **FAST)
    error = failed_start(second.ask("connect"), store.port, "size")
    assert "5" in error, error
    assert "2" in error, error
    assert first.ask("counts")["limit"] == 5  # the running process's limit is untouched
    first.ask("resize", size=2)  # a deliberate change goes through resize
    again = fleet.start("again", store.url, 2, connect=False, **FAST)
    assert again.ask("connect") == {"connected": True}
    assert again.ask("hold", slots=3, wait=2 * FAST["lease_seconds"]) == {"held": 2}
    again.ask("release")


APP = """
from fastapi import FastAPI
from gym_concurrency.middleware import ConcurrencyLimitMiddleware

app = FastAPI()


@app.get("/run")
async def run() -> dict[str, bool]:
    return {"ok": True}


app.add_middleware(ConcurrencyLimitMiddleware)
"""


def test_a_wrong_password_fails_the_server_s_start_naming_the_url(
    locked: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "locked_app.py").write_text(APP)
    routes = '[{"path": "/run", "limit_name": "runs", "max_concurrent": 2, "scope": "global"}]'
    env = clean_env(
        GYM_CONCURRENCY_REDIS_URL=f"redis://:wrong-password@127.0.0.1:{locked.port}/0",
        GYM_CONCURRENCY_ROUTES=routes,
    )
    server = Uvicorn(tmp_path, "locked_app:app", env, "--lifespan", "on")
    try:
        assert server.exit_status(15) != 0
    finally:
        server.stop()
    assert f"127.0.0.1:{locked.port}" in server.log
    assert "wrong-password" not in server.log
    assert "authentication" in server.log.lower()


def test_a_size_other_processes_disagree_with_is_said_once_in_the_server_s_log(
    store: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "sized_app.py").write_text(APP)

    def server(size: int) -> Uvicorn:
        routes = f'[{{"path": "/run", "limit_name": "runs", "max_concurrent": {size}, '
        routes += '"scope": "global"}]'
        env = clean_env(GYM_CONCURRENCY_REDIS_URL=store.url, GYM_CONCURRENCY_ROUTES=routes)
        return Uvicorn(tmp_path, "sized_app:app", env, "--lifespan", "on")

    first = server(4)
    try:
        first.wait_serving("/run")
        second = server(8)
        try:
            assert second.exit_status(15) != 0
        finally:
            second.stop()
    finally:
        first.stop()
    assert second.log.count("but processes that share the limit use size 4") == 1, second.log
    assert "Application startup failed" in second.log
