"""What the goal runs of issue 35 (rate_budget_goal.py, engine_goal.py) share: a fake upstream
in a process of its own, client processes released together, the check that a configuration's
wiring exists before anything is started, the --configs check, the rounds (the order
rotating a round) and the figures every cell reports of its clients.

The upstream (`benchmarks._fake_provider` or `benchmarks._fake_engine`; tokens.py's
`benchmarks._tokens_upstream` too) runs on CPU 0 (with the redis-server, when there is one),
the client processes on CPU 1 (`overload.pinned`). Once every client says it is ready, all
are given one start moment on `time.monotonic()`, the clock every process of the machine
shares (the fakes' `/stats` `t` too), so that figures from all of them line up (`release`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks._flows_inprocess import percentile
from benchmarks._processes import stop_process
from benchmarks._source import PROJECT_ROOT
from benchmarks.overload import free_port, pinned

__all__ = [
    "CLIENT_CPU",
    "SERVER_CPU",
    "STARTUP_S",
    "FakeUpstream",
    "by_config",
    "chosen_configs",
    "clients_figures",
    "get_json",
    "missing_wiring",
    "release",
    "rounds",
    "run_clients",
    "start_clients",
    "wiring_error",
]

SERVER_CPU, CLIENT_CPU = "0", "1"
STARTUP_S = 60.0  # at most, for the clients to import and connect
UPSTREAM_MODULE = "gym_concurrency.limits.upstream"


def get_json(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """GET `url` (127.0.0.1 only) and parse its JSON body."""
    assert url.startswith("http://127.0.0.1:"), url
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return dict(json.loads(response.read()))


class FakeUpstream:
    """`python -m <module> --port P <arguments>` pinned to CPU 0, up once `/stats` answers.
    `spawned` and `ready` (monotonic) bound when it started its clock."""

    def __init__(self, python: str, module: str, arguments: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [python, "-m", module, "--port", str(self.port), *arguments]
        self.spawned = time.monotonic()
        self.process = subprocess.Popen(pinned(SERVER_CPU, command), cwd=PROJECT_ROOT)
        deadline = self.spawned + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{module} exited with {self.process.returncode}")
            try:
                get_json(self.url + "/stats", timeout=2)
            except OSError:
                time.sleep(0.05)
                continue
            self.ready = time.monotonic()
            return
        self.stop()
        raise RuntimeError(f"{module} did not start within 60 s")

    def stats(self) -> dict[str, Any]:
        return get_json(self.url + "/stats")

    def stop(self) -> None:
        stop_process(self.process)


def start_clients(python: str, module: str, argv: list[list[str]]) -> list[subprocess.Popen[str]]:
    """One client process per argument list, pinned to CPU 1, its stdin and stdout piped
    (`release`)."""
    return [
        subprocess.Popen(
            pinned(CLIENT_CPU, [python, "-m", module, *arguments]),
            cwd=PROJECT_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for arguments in argv
    ]


def release(
    processes: list[subprocess.Popen[str]], timeout: float, lead_seconds: float = 0.5
) -> float:
    """Wait for every client's "ready" line (its limit built, its Redis connected; all killed
    past `timeout` s), then tell them all one start moment (time.monotonic()),
    `lead_seconds` from now; that moment."""

    def kill_all() -> None:
        for process in processes:
            process.kill()

    watchdog = threading.Timer(timeout, kill_all)
    watchdog.start()
    try:
        _wait_ready(processes)
    finally:
        watchdog.cancel()
    start = time.monotonic() + lead_seconds
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(f"{start!r}\n")
        process.stdin.flush()
    return start


def _wait_ready(processes: list[subprocess.Popen[str]]) -> None:
    """Each client's first line is "ready"; else all are killed, with what it said."""
    for index, process in enumerate(processes):
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if line != "ready":
            rest = process.communicate(timeout=30)
            for other in processes:
                other.kill()
            said = f"{line}{rest[0]}\n{rest[1][-3000:]}"
            raise RuntimeError(f"client {index} did not start: {said}")


def run_clients(processes: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    """Wait for every client (killing all past `timeout` s) and parse each one's JSON line."""
    deadline = time.monotonic() + timeout
    results: list[dict[str, Any]] = []
    failed: list[str] = []
    for index, process in enumerate(processes):
        try:
            out, err = process.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise RuntimeError(f"client {index} still running after {timeout:.0f} s") from None
        if process.returncode != 0:
            failed.append(f"client {index} exited with {process.returncode}:\n{err[-3000:]}")
            continue
        results.append(dict(json.loads(out.strip().splitlines()[-1])))
    if failed:
        raise RuntimeError("\n".join(failed))
    return results


def missing_wiring(fields: tuple[str, ...]) -> list[str]:
    """What of issue 35's wiring the tree measured (this one, or `use_source_tree`'s) lacks
    for a configuration whose ClientLimit sets `fields` (empty: all there). Never raises for
    an older tree."""
    from gym_concurrency.middleware import ClientLimit

    missing = [] if importlib.util.find_spec(UPSTREAM_MODULE) else [UPSTREAM_MODULE]
    return missing + [f"ClientLimit.{f}" for f in fields if f not in ClientLimit.model_fields]


def wiring_error(config: str, missing: list[str]) -> str:
    """The message a configuration that cannot run here exits with."""
    import gym_concurrency

    tree = Path(gym_concurrency.__file__).parent.parent
    return f"{config} needs issue 35's wiring: {', '.join(missing)} missing (the tree {tree})"


def chosen_configs(parser: argparse.ArgumentParser, text: str, known: tuple[str, ...]) -> list[str]:
    """--configs `text` as a list, each of `known`; else the parser's error naming the rest."""
    configs = text.split(",")
    unknown = [c for c in configs if c not in known]
    if unknown or not configs:
        parser.error(f"--configs: comma-separated, of {', '.join(known)} (not {unknown})")
    return configs


def rounds(configs: list[str], count: int) -> Iterator[tuple[int, str]]:
    """(round, configuration): `count` rounds of every configuration, the order rotating one
    place a round (so no configuration always runs first)."""
    for index in range(count):
        shift = index % len(configs)
        for name in configs[shift:] + configs[:shift]:
            yield index, name


def by_config(
    cells: list[dict[str, Any]], configs: tuple[str, ...]
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(configuration, its cells) for each of `configs` that has any, in that order."""
    for name in configs:
        mine = [c for c in cells if c["config"] == name]
        if mine:
            yield name, mine


def clients_figures(clients: list[dict[str, Any]]) -> dict[str, Any]:
    """What a cell says of its client processes' calls: the p50 and p95 latency of every
    completed call, the latest any process started, each one's limit at the end."""
    latencies = sorted(x for c in clients for x in c["latencies_s"])
    return {
        "p50_s": percentile(latencies, 0.50),
        "p95_s": percentile(latencies, 0.95),
        "late_s": max(c["late_s"] for c in clients),
        "limits": [c["limit"] for c in clients],
    }
