"""Real `python -m uvicorn` subprocesses for tests that need the server's own start-up
(lifespan modes, exit status, log): an app module written to a folder, the checkout under
test first on sys.path, no GYM_CONCURRENCY_* / OTEL_* variables but the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.servers import free_port, terminate

ROOT = Path(__file__).resolve().parent.parent
_FOREIGN = ("GYM_CONCURRENCY_", "OTEL_")


def clean_env(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(_FOREIGN)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(variables)
    return env


class Uvicorn:
    """One uvicorn process serving `module:app` from `folder` on a free port."""

    def __init__(self, folder: Path, target: str, env: dict[str, str], *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = folder / f"uvicorn-{self.port}.log"
        argv = [
            sys.executable,
            "-m",
            "uvicorn",
            target,
            "--app-dir",
            str(folder),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *args,
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def exit_status(self, timeout: float = 30.0) -> int:
        """Wait for the process to exit by itself; its status."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"uvicorn did not exit within {timeout} s:\n{self.log}") from None

    def wait_serving(self, path: str = "/", timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"uvicorn exited with {self.process.returncode}:\n{self.log}")
            try:
                httpx.get(self.url + path, timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError(f"uvicorn did not serve within {timeout} s:\n{self.log}")

    def stop(self) -> None:
        terminate(self.process)


@contextmanager
def uvicorn(folder: Path, target: str, env: dict[str, str], *args: str) -> Iterator[Uvicorn]:
    server = Uvicorn(folder, target, env, *args)
    try:
        yield server
    finally:
        server.stop()
