"""A real uvicorn server on 127.0.0.1 in a background thread, for tests that need the wire.

with UvicornServer(app) as server:
    httpx.get(server.url + "/run")
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

__all__ = ["UvicornServer", "eventually", "free_port", "terminate", "wait_until"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    condition: Any, timeout: float = 10.0, what: str = "condition", interval: float = 0.005
) -> None:
    """Poll `condition()` every `interval` s until it is true; AssertionError naming `what`
    after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


async def eventually(condition: Any, what: str, seconds: float = 4.0) -> None:
    """`wait_until` for a coroutine: polls without blocking the event loop."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        await asyncio.sleep(0.002)


class UvicornServer:
    """uvicorn serving `app` on a free 127.0.0.1 port in a thread; stopped on exit."""

    def __init__(self, app: Any, *, lifespan: str = "on", **config: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            lifespan=lifespan,
            log_config=None,
            log_level="warning",
            timeout_graceful_shutdown=2,
            **config,
        )
        self.server = uvicorn.Server(self.config)
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def __enter__(self) -> UvicornServer:
        self._thread.start()
        wait_until(
            lambda: self.server.started or not self._thread.is_alive(), what="uvicorn to start"
        )
        if not self.server.started:
            raise RuntimeError("uvicorn did not start (see the log)")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "uvicorn did not stop within 10 s"


def terminate(process: subprocess.Popen[Any]) -> None:
    """Stop `process` if it still runs: SIGTERM, then SIGKILL after 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
