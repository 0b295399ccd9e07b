"""The open-loop load generator of benchmarks/deadlines.py (raw HTTP/1.1 on uvloop, 127.0.0.1).

Poisson arrivals at `--rate` a second (seeded: the same arrivals in every configuration of a
round), each a `GET /work` carrying `x-deadline-ms: <--header-ms>` and, for the server's
records, its send time and its caller's deadline (`x-sent-at`, `x-caller-deadline`:
`time.monotonic()`, the send time + `--deadline-s`). Each goes out on an idle keep-alive
connection, or a new one (a refusal closes its connection); whoever sent it gives up
`--client-timeout` s after sending (the connection is closed). Arrivals run for `--warmup`
+ `--seconds` s, then it waits for the answers still due (at most the client timeout) and
prints one JSON object about the requests sent in the window (the last `--seconds`): counts
by outcome, how many 200s arrived within the caller's deadline, latencies of 200s and of
refusals (503), how late sends were against their arrival times, connections opened, and CPU
(its own, the server's with `--server-pid`, every other process's) over the window.

    taskset -c 1 python -m benchmarks._deadlines_load --port P --rate 640 [--warmup 4]
        [--seconds 10] [--header-ms 2000] [--deadline-s 2] [--client-timeout 2.2] [--seed 1]
        [--server-pid PID]

Only 127.0.0.1 is contacted; the number of requests is bounded by rate x time, at most
--max-connections connections are open at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import resource
import sys
import time
from typing import Any

from benchmarks._loadgen import _proc_cpu_seconds, machine_busy_seconds, percentile

HOST = "127.0.0.1"  # the only address this generator talks to
now = time.monotonic  # the server compares with its own time.monotonic(): one clock
Record = tuple[float, float, str]  # (sent, done, outcome)


class Connection(asyncio.Protocol):
    """One connection carrying one request at a time."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.sent = 0.0
        self.in_flight = False
        self.closing = False
        self.timer: asyncio.TimerHandle | None = None
        self.need = -1
        self.header_end = -1
        self.status = 0
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.generator.opened(self)
        self.send()

    def send(self) -> None:
        generator = self.generator
        self.in_flight = True
        self.sent = sent = now()
        generator.lags.append(sent - generator.scheduled.pop(self, sent))
        request = (
            b"GET /work HTTP/1.1\r\nHost: 127.0.0.1\r\nx-deadline-ms: %b\r\n"
            b"x-sent-at: %.6f\r\nx-caller-deadline: %.6f\r\n\r\n"
            % (generator.header_ms, sent, sent + generator.deadline_s)
        )
        assert self.transport is not None
        self.transport.write(request)
        self.timer = generator.loop.call_at(sent + generator.client_timeout, self.give_up)

    def give_up(self) -> None:
        """The caller's timeout: it stops waiting and closes the connection."""
        self.timer = None
        if self.in_flight:
            self.in_flight = False
            self.generator.record(self.sent, "client timeout")
            self.shut()

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
            if at < 0:
                self.generator.record(self.sent, "no content-length")
                self.in_flight = False
                self.shut()
                return
            stop = head.find(b"\r\n", at + 17)
            self.need = end + 4 + int(head[at + 17 : stop if stop >= 0 else len(head)])
            self.close_after = b"\r\nconnection: close" in head
            self.header_end = end + 4
        if len(buffer) < self.need:
            return
        del buffer[: self.need]
        self.need = -1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.in_flight:
            self.in_flight = False
            self.generator.record(self.sent, str(self.status))
        if self.close_after:
            self.shut()
        else:
            self.generator.idle.append(self)

    def shut(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.generator.closed(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.in_flight and not self.closing:
            self.in_flight = False
            self.generator.record(self.sent, "closed by the server")


class Generator:
    def __init__(
        self,
        port: int,
        header_ms: float,
        deadline_s: float,
        client_timeout: float,
        max_connections: int,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.port = port
        self.header_ms = (b"%d" if header_ms == int(header_ms) else b"%.3f") % header_ms
        self.deadline_s = deadline_s
        self.client_timeout = client_timeout
        self.max_connections = max_connections
        self.idle: list[Connection] = []
        self.open: set[Connection] = set()
        self.connecting = 0
        self.most_open = 0
        self.connections_opened = 0
        self.scheduled: dict[Connection, float] = {}
        self.records: list[Record] = []
        self.lags: list[float] = []
        self.dropped = 0  # arrivals with no connection to send on (at --max-connections)
        self.connect_errors = 0
        self.outstanding = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.idle_event = asyncio.Event()  # set when no request is outstanding

    def record(self, sent: float, outcome: str) -> None:
        self.records.append((sent, now(), outcome))
        self.outstanding -= 1
        if self.outstanding <= 0:
            self.idle_event.set()

    def opened(self, connection: Connection) -> None:
        self.connecting -= 1
        self.open.add(connection)
        self.connections_opened += 1
        self.most_open = max(self.most_open, len(self.open))

    def closed(self, connection: Connection) -> None:
        self.open.discard(connection)

    def arrive(self, at: float) -> None:
        """A request arrives (scheduled at `at`): send it on an idle connection or a new one."""
        while self.idle:
            connection = self.idle.pop()
            if not connection.closing and connection in self.open:
                self.outstanding += 1
                self.scheduled[connection] = at
                connection.send()
                return
        if len(self.open) + self.connecting >= self.max_connections:
            self.dropped += 1
            return
        connection = Connection(self)
        self.scheduled[connection] = at
        self.outstanding += 1
        self.connecting += 1
        task = self.loop.create_task(self._connect(connection))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _connect(self, connection: Connection) -> None:
        try:
            await self.loop.create_connection(lambda: connection, HOST, self.port)
        except OSError:
            self.connecting -= 1
            self.connect_errors += 1
            self.outstanding -= 1
            self.scheduled.pop(connection, None)
            if self.outstanding <= 0:
                self.idle_event.set()

    def stop(self) -> None:
        for connection in list(self.open):
            connection.shut()
        for task in list(self.tasks):
            task.cancel()


def summarize(
    records: list[Record], window_start: float, window_end: float, deadline_s: float
) -> dict[str, Any]:
    """The requests sent in [window_start, window_end): outcomes and latencies."""
    window = window_end - window_start
    mine = [r for r in records if window_start <= r[0] < window_end]
    outcomes: dict[str, int] = {}
    for _, _, outcome in mine:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    ok = sorted(done - sent for sent, done, outcome in mine if outcome == "200")
    refused = sorted(done - sent for sent, done, outcome in mine if outcome == "503")
    in_time = sum(1 for latency in ok if latency <= deadline_s)
    return {
        "sent": len(mine),
        "sent_per_second": len(mine) / window,
        "outcomes": outcomes,
        "ok_in_deadline": in_time,
        "ok_in_deadline_per_second": in_time / window,
        "ok_late": len(ok) - in_time,
        "ok_p50_ms": percentile(ok, 0.50) * 1000,
        "ok_p99_ms": percentile(ok, 0.99) * 1000,
        "refused": len(refused),
        "refused_per_second": len(refused) / window,
        "refused_p50_ms": percentile(refused, 0.50) * 1000,
        "refused_p99_ms": percentile(refused, 0.99) * 1000,
        "refused_max_ms": (refused[-1] if refused else float("nan")) * 1000,
        "refused_within_50ms": sum(1 for x in refused if x <= 0.050),
        "refused_after_1s": sum(1 for x in refused if x >= 1.0),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    generator = Generator(
        args.port, args.header_ms, args.deadline_s, args.client_timeout, args.max_connections
    )
    start = now()
    window_start, window_end = start + args.warmup, start + args.warmup + args.seconds
    cpu: dict[str, float] = {}

    def sample(edge: str) -> None:
        cpu["wall" + edge], cpu["self" + edge] = now(), time.process_time()
        cpu["machine" + edge] = machine_busy_seconds()
        if args.server_pid:
            cpu["server" + edge] = _proc_cpu_seconds(args.server_pid) or 0.0

    rng = random.Random(args.seed)
    next_at = start
    sampled = False
    while next_at < window_end:
        t = now()
        if next_at > t:
            await asyncio.sleep(next_at - t)
            t = now()
        if not sampled and t >= window_start:
            sample("0")
            sampled = True
        while next_at <= t and next_at < window_end:
            generator.arrive(next_at)
            next_at += rng.expovariate(args.rate)
    await asyncio.sleep(max(0.0, window_end - now()))
    if not sampled:
        sample("0")
    sample("1")
    # The answers still due: every request ends by its client timeout.
    if generator.outstanding > 0:
        generator.idle_event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(generator.idle_event.wait(), args.client_timeout + 0.3)
    unanswered = generator.outstanding
    generator.stop()
    await asyncio.sleep(0.05)
    window = cpu["wall1"] - cpu["wall0"]
    lags = sorted(generator.lags)
    result: dict[str, Any] = {
        "rate": args.rate,
        "header_ms": args.header_ms,
        "deadline_s": args.deadline_s,
        "client_timeout_s": args.client_timeout,
        "warmup_s": args.warmup,
        "window": [window_start, window_end],  # time.monotonic(), the server's clock too
        "window_s": window_end - window_start,
        **summarize(generator.records, window_start, window_end, args.deadline_s),
        "run": {  # every request, the warm-up included
            "arrivals": len(generator.lags) + generator.dropped + generator.connect_errors,
            "answered_or_given_up": len(generator.records),
            "unanswered_at_end": unanswered,
            "dropped_no_connection": generator.dropped,
            "connect_errors": generator.connect_errors,
            "connections_opened": generator.connections_opened,
            "most_open_connections": generator.most_open,
        },
        "send_lag_p50_ms": percentile(lags, 0.50) * 1000,
        "send_lag_p99_ms": percentile(lags, 0.99) * 1000,
        "send_lag_max_ms": (lags[-1] if lags else float("nan")) * 1000,
        "loadgen_cpu": (cpu["self1"] - cpu["self0"]) / window,
        "machine_cpu": (cpu["machine1"] - cpu["machine0"]) / window,
    }
    if args.server_pid:
        result["server_cpu"] = (cpu["server1"] - cpu["server0"]) / window
        result["other_cpu"] = max(
            0.0, result["machine_cpu"] - result["server_cpu"] - result["loadgen_cpu"]
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="arrivals a second")
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--header-ms", type=float, default=2000.0, help="x-deadline-ms sent")
    parser.add_argument("--deadline-s", type=float, default=2.0, help="the caller's deadline")
    parser.add_argument("--client-timeout", type=float, default=2.2)
    parser.add_argument("--max-connections", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--server-pid", type=int, default=None)
    args = parser.parse_args()
    if not 0 < args.seconds <= 60 or not 0 <= args.warmup <= 30:
        sys.exit("--seconds must be in (0, 60] and --warmup in [0, 30]")
    if not 0 < args.rate <= 5000 or not 0 < args.client_timeout <= 10:
        sys.exit("--rate must be in (0, 5000] and --client-timeout in (0, 10]")
    if not 1 <= args.max_connections <= 15_000:
        sys.exit("--max-connections must be in [1, 15000]")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:  # the `bench` extra; the smoke test runs without it
        import uvloop
    except ImportError:
        result = asyncio.run(run(args))
    else:
        result = uvloop.run(run(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
