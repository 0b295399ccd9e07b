"""The fake engine (benchmarks/_fake_engine.py) in a process of its own on a free port, as
tests start it: its /metrics URL, its /stats, and ways to stop or freeze it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.servers import free_port, terminate

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class EngineProcess:
    process: subprocess.Popen[bytes]
    base: str

    @property
    def metrics_url(self) -> str:
        return self.base + "/metrics"

    def stats(self) -> dict[str, Any]:
        answer = httpx.get(self.base + "/stats", timeout=10)
        answer.raise_for_status()
        stats: dict[str, Any] = answer.json()
        return stats

    def freeze(self) -> None:
        """SIGSTOP: the engine accepts connections (the kernel does) and never answers."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.thaw()  # a stopped process would not act on SIGTERM
        terminate(self.process)


@contextmanager
def fake_engine(*args: str) -> Iterator[EngineProcess]:
    """`python -m benchmarks._fake_engine --port P *args`, serving once this yields."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks._fake_engine", "--port", str(port), *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    engine = EngineProcess(process, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the fake engine exited: {process.stderr.read()!r}")  # type: ignore[union-attr]
            try:
                engine.stats()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise AssertionError("the fake engine did not serve within 30 s") from None
                time.sleep(0.05)
        yield engine
    finally:
        engine.stop()
