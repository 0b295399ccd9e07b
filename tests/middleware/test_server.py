"""ConcurrencyLimitMiddleware behind a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
from apps import make_app
from gym_concurrency.middleware import ConcurrencySettings, RouteLimit
from servers import UvicornServer, free_port, wait_until
from websockets.sync.client import connect

from tests.registry import limits_of

HERE = Path(__file__).parent


def settings_for(component: str, **route: Any) -> ConcurrencySettings:
    fields = {"path": "/run", "limit_name": "episodes", "max_concurrent": 1, **route}
    return ConcurrencySettings(component=component, routes=[RouteLimit(**fields)])


def post_in_thread(url: str, body: bytes = b"{}") -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(httpx.post(url, content=body)))
    thread.start()
    return thread, result


def test_problem_response_over_the_wire(component: str):
    app, gate = make_app(settings_for(component, queue_timeout_seconds=0.05))
    with UvicornServer(app) as server:
        holder, held = post_in_thread(server.url + "/run")
        wait_until(lambda: gate.inside == 1, what="the first request inside the app")
        refused = httpx.post(server.url + "/run", content=b"{}")
        gate.open = True
        holder.join(10)
    assert held[0].status_code == 200
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["type"] == "urn:gym-concurrency:admission-timeout"
    assert limits_of(component)["episodes"].admission_timeouts == 1


def test_client_closing_its_socket_while_queued_leaves_the_queue(metrics: Any, component: str):
    app, gate = make_app(settings_for(component), meter_provider=metrics.provider)
    with UvicornServer(app) as server:
        holder, _ = post_in_thread(server.url + "/run")
        wait_until(lambda: gate.inside == 1, what="the first request inside the app")
        semaphore = limits_of(component)["episodes"]
        with socket.create_connection(("127.0.0.1", server.port)) as client:
            client.sendall(b"POST /run HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}")
            wait_until(lambda: semaphore.queue_depth == 1, what="the request to queue")
        wait_until(lambda: semaphore.admission_cancelled == 1, what="the queued request to leave")
        assert (semaphore.queue_depth, semaphore.active) == (0, 1)
        gate.open = True
        holder.join(10)
        wait_until(lambda: semaphore.active == 0, what="the slot to be released")
    assert gate.calls == {"/run": 1}  # the app never saw the request that left
    waits = metrics.values("gym.concurrency.queue_wait_duration_ms")
    counts = {dict(k)["nemo.gym.concurrency.admission_outcome"]: p.count for k, p in waits.items()}
    assert counts == {"admitted": 1, "cancelled": 1}


def websocket_handshake(port: int) -> socket.socket:
    """A raw client socket that has sent a websocket upgrade request for /ws."""
    client = socket.create_connection(("127.0.0.1", port))
    client.sendall(
        b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    return client


def test_websocket_closing_while_queued_leaves_the_queue(component: str):
    settings = ConcurrencySettings(
        component=component,
        routes=[RouteLimit(path="/ws", limit_name="sockets", max_concurrent=1)],
    )
    app, gate = make_app(settings)
    with UvicornServer(app) as server:
        semaphore = limits_of(component)["sockets"]
        with websocket_handshake(server.port) as holder:
            assert b"101 Switching Protocols" in holder.recv(4096)
            with websocket_handshake(server.port):
                wait_until(lambda: semaphore.queue_depth == 1, what="the second socket to queue")
            wait_until(lambda: semaphore.admission_cancelled == 1, what="it to leave the queue")
            assert (semaphore.queue_depth, semaphore.active) == (0, 1)
        wait_until(lambda: semaphore.active == 0, what="the holder's slot to be released")
    assert gate.calls == {"/ws": 1}  # the app never saw the socket that left


def test_queued_websocket_once_admitted_gets_its_connect_then_live_messages(component: str):
    settings = ConcurrencySettings(
        component=component,
        routes=[
            RouteLimit(path="/ws", limit_name="sockets", max_concurrent=1, queue_timeout_seconds=10)
        ],
    )
    app, _ = make_app(settings)
    received: list[Any] = []

    def second_socket(url: str) -> None:
        try:  # the handshake completes only once the socket is admitted
            with connect(url, open_timeout=10) as second:
                received.append(second.recv(timeout=5))
                second.send("hello")  # sent after admission: read by the app, not the queue
                received.append(second.recv(timeout=5))
        except Exception as error:
            received.append(error)

    with UvicornServer(app) as server:
        url = f"ws://127.0.0.1:{server.port}/ws"
        queued = threading.Thread(target=second_socket, args=(url,))
        with connect(url) as first:
            assert first.recv(timeout=5) == "admitted"
            semaphore = limits_of(component)["sockets"]
            queued.start()
            wait_until(lambda: semaphore.queue_depth == 1, what="the second socket to queue")
            first.send("bye")
            assert first.recv(timeout=5) == "echo bye"
        queued.join(20)
    assert received == ["admitted", "echo hello"]
    assert (semaphore.active, semaphore.admission_timeouts) == (0, 0)


def test_stream_keeps_the_slot_until_its_last_byte(component: str):
    app, gate = make_app(settings_for(component, path="/stream", queue_timeout_seconds=0.05))
    with UvicornServer(app) as server, httpx.stream("GET", server.url + "/stream") as response:
        chunks = response.iter_bytes()
        assert next(chunks) == b"first\n"
        semaphore = limits_of(component)["episodes"]
        assert semaphore.active == 1
        assert httpx.get(server.url + "/stream").status_code == 503
        gate.open = True
        assert b"".join(chunks) == b"last\n"
        wait_until(lambda: semaphore.active == 0, what="the slot to be released")


def test_background_task_keeps_the_slot_after_the_response(component: str):
    app, gate = make_app(settings_for(component, path="/background"))
    with UvicornServer(app) as server:
        assert httpx.get(server.url + "/background").json() == {"sent": True}
        wait_until(lambda: gate.inside == 1, what="the background task to run")
        semaphore = limits_of(component)["episodes"]
        assert semaphore.active == 1
        gate.open = True
        wait_until(lambda: semaphore.active == 0, what="the slot to be released")


def test_lifespan_off_builds_on_the_first_request_and_limits(component: str):
    app, gate = make_app(settings_for(component, max_queue=0))
    with UvicornServer(app, lifespan="off") as server:
        holder, held = post_in_thread(server.url + "/run", b"hi")
        wait_until(lambda: gate.inside == 1, what="the first request inside the app")
        refused = httpx.post(server.url + "/run", content=b"{}")
        gate.open = True
        holder.join(10)
    assert held[0].json() == {"path": "/run", "body": "hi"}
    assert refused.status_code == 503
    assert refused.json()["type"] == "urn:gym-concurrency:queue-full"
    assert limits_of(component)["episodes"].admission_shed == 1


def test_bad_settings_stop_uvicorn_at_startup(tmp_path: Path):
    (tmp_path / "bad_app.py").write_text(
        "from apps import make_app\n"
        "from gym_concurrency.middleware import ConcurrencySettings, RouteLimit\n"
        "settings = ConcurrencySettings(routes=[RouteLimit(path='/runs', limit_name='e',"
        " max_concurrent=1)])\n"
        "app, _ = make_app(settings)\n"
    )
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bad_app:app",
            "--app-dir",
            str(tmp_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
        ],
        env={"PYTHONPATH": str(HERE), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 3  # uvicorn's startup failure
    assert "routes.0.path '/runs' matches no route of the app" in completed.stderr
    assert "POST /run" in completed.stderr
    assert "Application startup failed. Exiting." in completed.stderr
