"""The redis-server of benchmarks/shared_cost.py: its own, on 127.0.0.1, pinned to one core,
with the figures read around a measured window (`INFO commandstats` and `INFO cpu` deltas),
and, for the analysis, `MONITOR` to split the commands scripts run by script.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["LocalRedis", "Snapshot", "script_names"]

SCRIPT_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Snapshot:
    """Redis's counters at one moment: calls per command, and its CPU seconds."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.cpu = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        self.calls = Counter(
            {
                key.removeprefix("cmdstat_"): int(value["calls"])
                for key, value in info.items()
                if key.startswith("cmdstat_")
            }
        )

    def since(self, before: Snapshot) -> dict[str, Any]:
        """Script calls, other commands (those scripts run included) by name, and Redis CPU
        seconds since `before`; the one INFO the earlier snapshot made is taken off."""
        calls = self.calls - before.calls
        calls["info"] -= 1
        scripts = sum(calls.pop(name, 0) for name in SCRIPT_COMMANDS)
        return {"script_calls": scripts, "commands": dict(+calls), "cpu_s": self.cpu - before.cpu}


class LocalRedis:
    """A redis-server of this benchmark's, without persistence, on CPU `cpu` if taskset is
    there (and the machine has 2 cores)."""

    def __init__(self, cpu: str | None) -> None:
        import redis

        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (apt-get install redis-server)")
        self.directory = tempfile.mkdtemp(prefix="shared-cost-redis-")
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        command = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", self.directory]
        self.pinned = cpu is not None and shutil.which("taskset") is not None
        if self.pinned:
            command = ["taskset", "-c", str(cpu), *command]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=self.directory
        )
        self.client = redis.Redis(port=self.port, decode_responses=True, socket_timeout=10)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.RedisError):
                if self.client.ping():
                    break
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.02)
        self.version = str(self.client.info("server")["redis_version"])

    def wait_older_than(self, seconds: float) -> None:
        """A limit's first state on a Redis younger than ~4 s starts a grace period (it could
        be a restart that lost leases): start measuring on an older one."""
        while int(self.client.info("server")["uptime_in_seconds"]) < seconds:
            time.sleep(0.2)

    def snapshot(self) -> Snapshot:
        info = self.client.info("everything")
        return Snapshot(info)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)

    @contextlib.contextmanager
    def monitor(self, names: dict[str, str]) -> Any:
        """While inside: every command Redis runs (slow: for the analysis only). Yields a
        dict filled at exit: script name -> {"calls": n, "commands": Counter of the commands
        it ran}, and "other" -> Counter of commands sent outside scripts."""
        import redis

        found: dict[str, Any] = {"other": Counter()}
        lines: list[str] = []
        client = redis.Redis(port=self.port, decode_responses=True)
        stop = threading.Event()

        def read() -> None:
            with client.monitor() as monitor:  # type: ignore[no-untyped-call]
                ready.set()
                for command in monitor.listen():
                    lines.append(f"{command['client_type']} {command['command']}")
                    if stop.is_set() and command["command"].startswith("ECHO monitor-end"):
                        return

        ready = threading.Event()
        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        ready.wait(5)
        time.sleep(0.1)
        try:
            yield found
        finally:
            stop.set()
            self.client.echo("monitor-end")
            thread.join(10)
        current: Counter[str] | None = None
        for line in lines:
            kind, _, command = line.partition(" ")
            verb, *args = command.split(" ")
            if kind == "lua" and current is not None:
                current[verb.upper()] += 1
            elif verb.upper() in ("EVALSHA", "EVAL") and args:
                # (EVAL's script is split on spaces here: named apart, not by its SHA1)
                name = names.get(args[0], args[0][:8]) if verb.upper() == "EVALSHA" else "EVAL"
                entry = found.setdefault(name, {"calls": 0, "commands": Counter()})
                entry["calls"] += 1
                current = entry["commands"]
            else:
                current = None
                if not command.startswith(("ECHO", "MONITOR", "INFO")):
                    found["other"][verb.upper()] += 1


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def script_names(library: Path) -> dict[str, str]:
    """SHA1 -> name of every Lua script in `library`'s scripts module (any str constant that
    calls Redis): what EVALSHA names in MONITOR's output."""
    path = library / "gym_concurrency" / "limits" / "shared" / "scripts.py"
    spec = importlib.util.spec_from_file_location("_shared_cost_scripts", path)
    if spec is None or spec.loader is None:
        return {}
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {
        _sha(value): name
        for name, value in vars(module).items()
        if isinstance(value, str) and "redis.call" in value and not name.startswith("_")
    }
