"""A real redis-server for the shared-limit tests: on 127.0.0.1, a free port, a temp dir, no
persistence. It can be paused (SIGSTOP), resumed, and restarted on the same port (empty)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from tests.servers import free_port, wait_until

__all__ = ["RedisServer", "free_port", "settle_on"]


class RedisServer:
    """One redis-server process owned by a test (or a test session)."""

    def __init__(self, directory: Path, *args: str, password: str | None = None) -> None:
        """`args`: more redis-server options; `password`: its `requirepass`."""
        binary = shutil.which("redis-server")
        if binary is None:  # never a skip: scripts/install-system-deps installs it
            raise RuntimeError(
                "redis-server is not installed: run scripts/install-system-deps "
                "(apt-get install redis-server)"
            )
        self.binary = binary
        self.directory = directory
        self.args = [*args, *(("--requirepass", password) if password else ())]
        self.password = password
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - the server keeps it
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.directory,
        )
        log.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client().ping():
                    return
            except redis.exceptions.RedisError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"redis-server did not start: {(self.directory / 'redis.log').read_text()}"
                )
            time.sleep(0.02)

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            decode_responses=True,
            socket_timeout=5,
            password=self.password,
        )

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is None:
            return
        process = self.process
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        self.process = None

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stop (its state is lost: no persistence) and start again on the same port."""
        self.stop()
        time.sleep(down_seconds)
        self.start()


def settle_on(
    condition: Callable[[], bool], what: str, within: float = 30.0, *, who: str = "Redis"
) -> None:
    """`wait_until(condition)`, where an error from a node that is still coming up counts as
    not yet; AssertionError naming `who` and `what` after `within` seconds."""

    def holds() -> bool:
        try:
            return bool(condition())
        except (redis.RedisError, OSError, StopIteration):
            return False

    wait_until(holds, within, f"{who}: {what}", interval=0.05)
