"""Real processes for the demo tests: the fake model, the demo and Prometheus, each started on
a free 127.0.0.1 port, waited for, and stopped (with its log shown if it failed)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() == "true"
# Variables of the developer's shell that would change what the demo does.
_FOREIGN_PREFIXES = ("OTEL_", "GYM_CONCURRENCY_", "DEMO_", "FAKE_MODEL_", "FASTAPI_OTEL_")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_binary(name: str) -> str:
    """The path of system binary `name`; missing, it fails the test in CI and skips it locally."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package; scripts/install-system-deps)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `condition()` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Process:
    """A subprocess in its own session, with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, url: str, timeout: float = 30.0) -> None:
        """Wait until GET `url` answers 200; fail with the log if the process exits first."""

        def ready() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited with {self.popen.returncode}:\n{self.log()[-4000:]}"
                )
            try:
                return httpx.get(url, timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout, f"{self.name} at {url}")

    def stop(self) -> None:
        """SIGTERM (a graceful stop: lifespan shutdown runs), then SIGKILL after 10 s."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=5)


def verifier_processes(parent: int) -> list[int]:
    """pids of verifier.py processes whose parent is `parent` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # stat is "pid (command) state ppid ..."; the command may hold spaces and parentheses.
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"verifier.py" in cmdline:
            found.append(int(entry.name))
    return found


def clean_env(**overrides: str) -> dict[str, str]:
    """This process's environment without the demo's knobs, plus `overrides`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
    env.update(overrides)
    return env


@contextlib.contextmanager
def running(
    name: str, argv: list[str], env: dict[str, str], log_dir: Path, ready_url: str | None = None
) -> Iterator[Process]:
    process = Process(name, argv, env, log_dir)
    try:
        if ready_url is not None:
            process.wait_ready(ready_url)
        yield process
    finally:
        process.stop()


def uvicorn_argv(target: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        target,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--timeout-graceful-shutdown",
        "5",
    ]


@contextlib.contextmanager
def fake_model(log_dir: Path, *, latency: float = 0.05, error_rate: float = 0.0) -> Iterator[str]:
    """The fake OpenAI-compatible model; yields its base URL (ending in /v1)."""
    port = free_port()
    env = clean_env(FAKE_MODEL_LATENCY_SECONDS=str(latency), FAKE_MODEL_ERROR_RATE=str(error_rate))
    with running(
        "fake-model",
        uvicorn_argv("examples.fastapi_app.fake_model:app", port),
        env,
        log_dir,
        f"http://127.0.0.1:{port}/health",
    ):
        yield f"http://127.0.0.1:{port}/v1"


@contextlib.contextmanager
def demo(
    log_dir: Path, upstream: str, *, settings: dict[str, Any] | None = None, **env: str
) -> Iterator[tuple[str, Process]]:
    """The demo resources server; yields its base URL and process. `settings` replaces the
    settings file; `env` adds variables (OTEL_*, DEMO_*, GYM_CONCURRENCY_*)."""
    port = free_port()
    variables = clean_env(DEMO_UPSTREAM_BASE_URL=upstream, **env)
    if settings is not None:
        path = log_dir / "settings.yaml"
        path.write_text(yaml.safe_dump(settings))
        variables["DEMO_SETTINGS_FILE"] = str(path)
    url = f"http://127.0.0.1:{port}"
    with running(
        "demo",
        uvicorn_argv("examples.fastapi_app.app:app", port),
        variables,
        log_dir,
        url + "/concurrency",
    ) as process:
        yield url, process


@contextlib.contextmanager
def prometheus(log_dir: Path, target: str, *, interval: str = "1s") -> Iterator[str]:
    """A real Prometheus scraping `target` (host:port) every `interval`; yields its URL."""
    binary = require_binary("prometheus")
    port = free_port()
    config = log_dir / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": interval, "evaluation_interval": interval},
                "scrape_configs": [{"job_name": "demo", "static_configs": [{"targets": [target]}]}],
            }
        )
    )
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={log_dir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with running("prometheus", argv, clean_env(), log_dir, f"http://127.0.0.1:{port}/-/ready"):
        yield f"http://127.0.0.1:{port}"


def example_settings(**route_changes: dict[str, Any]) -> dict[str, Any]:
    """The demo's settings.yaml as a mapping, with some limits changed by limit_name."""
    settings: dict[str, Any] = yaml.safe_load(
        (REPO / "examples" / "fastapi_app" / "settings.yaml").read_text()
    )
    for entry in [*settings["routes"], *settings.get("operations", [])]:
        entry.update(route_changes.get(entry["limit_name"], {}))
    return settings
