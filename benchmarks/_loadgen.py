"""A closed-loop HTTP/1.1 keep-alive load generator for benchmarks/overload.py.

Each of `--connections` raw TCP connections to 127.0.0.1 sends `POST /run` with a small JSON
body, waits for the whole response, and sends the next one at once (one request in flight
per connection). A response carrying `Connection: close`, or a connection the server closes,
makes that client reconnect and go on. After `--warmup` seconds it counts every response
that completes in the next `--seconds` seconds by status (and, for a 200, by whether its
body is an episode failure: `"failure":{...}` rather than `"failure":null`), with the
latency from sending the request to the end of its response. Then it stops by itself and
prints one JSON object: counts, rates, p50 / p99 per kind, errors, reconnects, and its own
CPU use (and the server's, with `--server-pid`, and every other process's, from /proc/stat)
over the measured window.

    taskset -c 1 python -m benchmarks._loadgen --port 8123 --connections 256 \
        [--warmup 1] [--seconds 4] [--server-pid PID]

Only 127.0.0.1 is ever contacted; the run is bounded by warmup + seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from typing import Any

HOST = "127.0.0.1"  # the only address this generator talks to
_CLK_TCK = os.sysconf("SC_CLK_TCK")
now = time.perf_counter


def build_request(episode_id: str) -> bytes:
    body = (
        b'{"episode_id":"' + episode_id.encode() + b'","task":{"task_id":"t1",'
        b'"prompt":"The answer is 42"}}'
    )
    head = (
        b"POST /run HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    return head + body


class Stats:
    """What the measured window saw."""

    def __init__(self, window_start: float, window_end: float) -> None:
        self.window_start = window_start
        self.window_end = window_end
        self.latencies: dict[str, list[float]] = {}
        self.reconnects = 0  # after a Connection: close response
        self.errors: dict[str, int] = {}

    def record(self, kind: str, sent: float, done: float) -> None:
        if self.window_start <= done < self.window_end:
            bucket = self.latencies.get(kind)
            if bucket is None:
                bucket = self.latencies[kind] = []
            bucket.append(done - sent)

    def error(self, kind: str) -> None:
        t = now()
        if self.window_start <= t < self.window_end:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def in_window(self) -> bool:
        return self.window_start <= now() < self.window_end


def classify(status: int, body: bytes) -> str:
    if status != 200:
        return str(status)
    if b'"failure":null' in body:
        return "200 ok"
    if b'"failure":{' in body:
        return "200 episode failure"
    return "200 other"


class Client(asyncio.Protocol):
    """One connection's closed loop: send, read the whole response, record, send again."""

    def __init__(self, generator: Generator, request: bytes) -> None:
        self.generator = generator
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.sent = 0.0
        self.in_flight = False
        self.closing = False  # we closed it (Connection: close, or the end of the run)
        self.header_end = -1
        self.need = -1
        self.status = 0
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.generator.open.add(self)
        self.send()

    def send(self) -> None:
        if not self.generator.running:
            self.shut()
            return
        self.in_flight = True
        self.sent = now()
        assert self.transport is not None
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if self.need < 0:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end]).lower()
            self.status = int(head[9:12])
            at = head.find(b"\r\ncontent-length:")
            if at < 0:  # every response here has a length; anything else is an error
                self.generator.stats.error("no content-length")
                self.shut()
                return
            stop = head.find(b"\r\n", at + 17)
            length = int(head[at + 17 : stop if stop >= 0 else len(head)])
            self.close_after = b"\r\nconnection: close" in head
            self.header_end = end + 4
            self.need = end + 4 + length
        if len(buffer) < self.need:
            return
        done = now()
        body = bytes(buffer[self.header_end : self.need])
        self.generator.stats.record(classify(self.status, body), self.sent, done)
        del buffer[: self.need]
        self.need = -1
        self.in_flight = False
        if self.close_after:
            if self.generator.stats.in_window():
                self.generator.stats.reconnects += 1
            self.shut()
            self.generator.reconnect(self.request)
            return
        self.send()

    def shut(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.generator.open.discard(self)
        if self.closing or not self.generator.running:
            return
        # The server closed the connection without saying so first.
        self.generator.stats.error(
            "closed with a request in flight" if self.in_flight else "closed while idle"
        )
        self.generator.reconnect(self.request)


class Generator:
    def __init__(self, port: int, stats: Stats) -> None:
        self.port = port
        self.stats = stats
        self.running = True
        self.open: set[Client] = set()
        self.pending: set[asyncio.Task[None]] = set()

    async def connect(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        while self.running:
            try:
                await loop.create_connection(lambda: Client(self, request), HOST, self.port)
                return
            except OSError as error:
                self.stats.error(f"connect: {error.strerror or error}")
                await asyncio.sleep(0.01)

    def reconnect(self, request: bytes) -> None:
        if not self.running:
            return
        task = asyncio.get_running_loop().create_task(self.connect(request))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def stop(self) -> None:
        self.running = False
        for client in list(self.open):
            client.shut()
        for task in list(self.pending):
            task.cancel()


def _proc_cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime


def machine_busy_seconds() -> float:
    """CPU seconds spent by every process on the machine so far (all cores, not idle)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / _CLK_TCK


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def run(
    port: int, connections: int, warmup: float, seconds: float, server_pid: int | None
) -> dict[str, Any]:
    start = now()
    stats = Stats(start + warmup, start + warmup + seconds)
    generator = Generator(port, stats)
    for index in range(connections):
        generator.reconnect(build_request(f"e{index}"))
    await asyncio.sleep(max(0.0, stats.window_start - now()))
    cpu0, wall0 = time.process_time(), now()
    server0 = _proc_cpu_seconds(server_pid) if server_pid else None
    machine0 = machine_busy_seconds()
    open_at_start = len(generator.open)
    await asyncio.sleep(max(0.0, stats.window_end - now()))
    cpu1, wall1 = time.process_time(), now()
    server1 = _proc_cpu_seconds(server_pid) if server_pid else None
    machine1 = machine_busy_seconds()
    open_at_end = len(generator.open)
    # Requests still unanswered when the window ends never reach the percentiles above: a
    # server that starves some clients looks fast. Their ages are reported as well.
    ages = sorted(wall1 - c.sent for c in generator.open if c.in_flight)
    generator.stop()
    await asyncio.sleep(0.05)  # let the transports close
    window = wall1 - wall0
    kinds = {}
    for kind, values in sorted(stats.latencies.items()):
        values.sort()
        kinds[kind] = {
            "count": len(values),
            "per_second": len(values) / window,
            "p50_ms": percentile(values, 0.50) * 1000,
            "p99_ms": percentile(values, 0.99) * 1000,
        }
    total = sum(k["count"] for k in kinds.values())
    result: dict[str, Any] = {
        "connections": connections,
        "warmup_s": warmup,
        "window_s": window,
        "responses": total,
        "responses_per_second": total / window,
        "goodput": kinds.get("200 ok", {}).get("per_second", 0.0),
        "kinds": kinds,
        "reconnects": stats.reconnects,
        "errors": stats.errors,
        "open_connections": [open_at_start, open_at_end],
        "unanswered_at_end": {
            "count": len(ages),
            "p50_age_ms": percentile(ages, 0.50) * 1000 if ages else 0.0,
            "max_age_ms": ages[-1] * 1000 if ages else 0.0,
        },
        "loadgen_cpu": (cpu1 - cpu0) / window,
        "machine_cpu": (machine1 - machine0) / window,  # cores busy, every process
    }
    if server0 is not None and server1 is not None:
        result["server_cpu"] = (server1 - server0) / window
        # What the rest of the machine used meanwhile: the measurement's noise.
        result["other_cpu"] = max(
            0.0, result["machine_cpu"] - result["server_cpu"] - result["loadgen_cpu"]
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--server-pid", type=int, default=None)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    if not 0 < args.seconds <= 60 or not 0 <= args.warmup <= 30:
        sys.exit("--seconds must be in (0, 60] and --warmup in [0, 30]")
    if not 1 <= args.connections <= 10_000:
        sys.exit("--connections must be in [1, 10000]")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    coroutine = run(args.port, args.connections, args.warmup, args.seconds, args.server_pid)
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(coroutine)
    else:
        result = asyncio.run(coroutine)
    result["loop"] = args.loop
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
