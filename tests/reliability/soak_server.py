"""The soak server as a real subprocess (uvicorn on 127.0.0.1), its scrape, RSS and log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


class Scrape:
    """One Prometheus exposition, parsed with prometheus_client's own parser."""

    def __init__(self, text: str) -> None:
        self.samples = [
            sample for family in text_string_to_metric_families(text) for sample in family.samples
        ]

    def value(self, name: str, **labels: str) -> float | None:
        """The sum of the samples called `name` whose labels include `labels`; None if none."""
        found = [
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        return sum(found) if found else None


class SoakServer:
    """`python -m tests.reliability.soak_app PORT` in a subprocess; terminated on exit."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SoakServer:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.reliability.soak_app", str(self.port)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.url + "/metrics", timeout=1).raise_for_status()
                return self
            except httpx.HTTPError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__(None, None, None)
                    raise RuntimeError(f"soak server did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)

    async def scrape(self) -> Scrape:
        """GET /metrics, parsed."""
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(self.url + "/metrics")
        response.raise_for_status()
        return Scrape(response.text)

    def rss_kib(self) -> int:
        """The server's resident set size now, in KiB (Linux /proc)."""
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1])

    def log(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")
