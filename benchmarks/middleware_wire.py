"""Requests per second over the wire: uvicorn + wrk on 127.0.0.1, the same app with and
without the middleware (a limited route that never binds). Runs alternate between the two
servers; the figure is the median of per-pair ratios.

    .venv/bin/python benchmarks/middleware_wire.py [--pairs 5] [--seconds 5] [--connections 32]

Needs `wrk` (Debian package). Traffic goes to 127.0.0.1 only, bounded by --seconds per run.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.97
APP = """
import sys
sys.path.insert(0, {root!r})
from benchmarks.middleware_inprocess import make_app
app = make_app({limited})
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(limited: bool, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    module = workdir / f"wire_app_{int(limited)}.py"
    module.write_text(APP.format(root=str(ROOT), limited=limited))
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            f"{module.stem}:app",
            "--app-dir",
            str(workdir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, port
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("uvicorn did not start")


def wrk(port: int, seconds: int, connections: int) -> float:
    """Requests per second wrk measured for POST /run."""
    script = Path(__file__).with_name("middleware_wire_post.lua")
    output = subprocess.run(
        [
            "wrk",
            "-t",
            "2",
            "-c",
            str(connections),
            "-d",
            f"{seconds}s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}/run",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 30,
    ).stdout
    found = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if found is None or "Non-2xx" in output:
        raise RuntimeError(f"wrk run failed or got errors:\n{output}")
    return float(found.group(1))


def main(pairs: int, seconds: int, connections: int) -> None:
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    workdir = Path("/tmp/gym_concurrency_wire")
    workdir.mkdir(exist_ok=True)
    servers = {limited: start_server(limited, workdir) for limited in (False, True)}
    try:
        for limited in (False, True):  # warm up both
            wrk(servers[limited][1], 2, connections)
        bare, limited_rps, ratios = [], [], []
        for index in range(pairs):
            order = (False, True) if index % 2 == 0 else (True, False)
            rps = {which: wrk(servers[which][1], seconds, connections) for which in order}
            bare.append(rps[False])
            limited_rps.append(rps[True])
            ratios.append(rps[True] / rps[False])
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(10)
    print(f"pairs={pairs} seconds/run={seconds} connections={connections}")
    print(f"without middleware: median {statistics.median(bare):.0f} req/s")
    print(f"with middleware:    median {statistics.median(limited_rps):.0f} req/s")
    ratio = statistics.median(ratios)
    print(f"ratio (median of per-pair ratios): {ratio:.3f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    print(f"target >= {TARGET}x: {'met' if ratio >= TARGET else 'NOT met'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    main(args.pairs, args.seconds, args.connections)
