"""A bounded chaos load generator for the soak server, on raw asyncio sockets (HTTP/1.1).

It only ever connects to 127.0.0.1, sends exactly `requests` requests from `concurrency`
keep-alive connections, and stops by itself: a request without an answer in
`REQUEST_TIMEOUT_SECONDS` is recorded as a violation, never waited on forever.

    python -m tests.reliability.load PORT [REQUESTS] [CONCURRENCY]

The mix (see KINDS) covers plain and streaming routes, a crashing route, admission timeouts,
shedding, episode failures, and clients that disconnect while queued or while running.
Every answer is checked against the failure-response contract; the tally counts what each
kind got, so a test can compare it with the server's own counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

HOST = "127.0.0.1"  # the only address this generator talks to
REQUEST_TIMEOUT_SECONDS = 15.0
STREAM_BODY = b"".join(f"chunk{i}\n".encode() for i in range(5))

# kind -> (weight, method, path). "*_abandon" kinds hang up before the answer is complete.
KINDS: dict[str, tuple[int, str, str]] = {
    "plain": (30, "GET", "/plain"),
    "stream": (10, "GET", "/stream"),
    "stream_abandon": (5, "GET", "/stream"),  # reads the first chunk, then hangs up: running
    "crash": (5, "POST", "/crash"),
    "slow": (15, "POST", "/slow"),
    "shed": (15, "POST", "/shed"),
    "episode": (12, "POST", "/episode"),
    "hold_abandon": (8, "POST", "/hold"),  # hangs up after 0-10 ms: mostly while queued
}
ABANDONING = frozenset({"stream_abandon", "hold_abandon"})

PROBLEM_TIMEOUT_TYPE = "urn:gym-concurrency:admission-timeout"
EPISODE_KEYS = {"episode_id", "task_id", "result", "failure"}
EPISODE_FAILURE_KEYS = {"failure_reason", "terminal", "stage"}


@dataclass
class Tally:
    """What the clients sent and got: `outcomes[(kind, outcome)]` and contract violations."""

    sent: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def violation(self, message: str) -> None:
        """Record a broken promise (the first 50 are kept verbatim)."""
        if len(self.violations) < 50:
            self.violations.append(message)
        self.outcomes[("*", "violation")] += 1

    def add(self, other: Tally) -> None:
        """Fold another tally into this one."""
        self.sent.update(other.sent)
        self.outcomes.update(other.outcomes)
        self.violations.extend(other.violations[: 50 - len(self.violations)])

    def count(self, kind: str, outcome: str) -> int:
        """How many `kind` requests ended in `outcome`."""
        return self.outcomes[(kind, outcome)]


@dataclass
class Response:
    """An HTTP response as read off the wire."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)


class Connection:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1:`port`, reopened when closed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, method: str, path: str, body: bytes = b"") -> asyncio.StreamReader:
        """Write one request (opening the connection if needed); the reader for its answer."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(HOST, self.port)
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        assert self.reader is not None
        return self.reader

    async def request(self, method: str, path: str, body: bytes = b"") -> Response:
        """Send a request and read the whole answer."""
        reader = await self.send(method, path, body)
        status, headers = await read_head(reader)
        response = Response(status, headers, await read_body(reader, headers))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return response

    async def close(self) -> None:
        """Hang up (the server sees the client disconnect)."""
        writer, self.reader, self.writer = self.writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The status code and (lower-cased) headers of the next response."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    """One chunk of a chunked body (b"" for the last one)."""
    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
    data = await reader.readexactly(size + 2)  # the chunk and its CRLF
    return data[:-2]


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    """The response body, by Content-Length or chunked transfer encoding."""
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while chunk := await read_chunk(reader):
            parts.append(chunk)
        return b"".join(parts)
    return await reader.read()


class Client:
    """One simulated client: a connection, a random source and the tally it writes to."""

    def __init__(self, port: int, rng: random.Random, tally: Tally) -> None:
        self.connection = Connection(port)
        self.rng = rng
        self.tally = tally

    async def one(self, kind: str, index: int) -> None:
        """Send one request of `kind` and record what came back."""
        self.tally.sent[kind] += 1
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                outcome = await getattr(self, kind)(index)
        except TimeoutError:
            await self.connection.close()
            outcome = "hung"
        except (OSError, asyncio.IncompleteReadError) as error:
            await self.connection.close()
            outcome = f"connection error {type(error).__name__}"
        self.tally.outcomes[(kind, outcome)] += 1
        if outcome not in EXPECTED[kind]:
            self.tally.violation(f"{kind} #{index}: {outcome}")

    async def plain(self, index: int) -> str:
        response = await self.connection.request("GET", "/plain")
        return "ok" if (response.status, response.body) == (200, b'{"ok":true}') else _odd(response)

    async def stream(self, index: int) -> str:
        response = await self.connection.request("GET", "/stream")
        return "ok" if (response.status, response.body) == (200, STREAM_BODY) else _odd(response)

    async def stream_abandon(self, index: int) -> str:
        reader = await self.connection.send("GET", "/stream")
        status, headers = await read_head(reader)
        if status == 200 and headers.get("transfer-encoding") == "chunked":
            await read_chunk(reader)
        await self.connection.close()
        return "abandoned"

    async def crash(self, index: int) -> str:
        response = await self.connection.request("POST", "/crash")
        # uvicorn closes a connection whose app raised, even after a complete response.
        await self.connection.close()
        return "error 500" if response.status == 500 else _odd(response)

    async def slow(self, index: int) -> str:
        response = await self.connection.request("POST", "/slow")
        if response.status == 200:
            return "ok"
        body = _json_or_none(response)
        timed_out = isinstance(body, dict) and body.get("type") == PROBLEM_TIMEOUT_TYPE
        if response.status == 503 and timed_out and response.headers.get("retry-after"):
            return "timeout"
        return _odd(response)

    async def shed(self, index: int) -> str:
        response = await self.connection.request("POST", "/shed")
        if response.status == 200:
            return "ok"
        body = _json_or_none(response)
        full = isinstance(body, dict) and body.get("error", {}).get("code") == "queue_full"
        if response.status == 503 and full and response.headers.get("retry-after"):
            return "shed"
        return _odd(response)

    async def episode(self, index: int) -> str:
        episode_id, task_id = f"episode-{index}", index
        request = {"episode_id": episode_id, "task": {"task_id": task_id}, "input": "x" * 64}
        response = await self.connection.request("POST", "/episode", json.dumps(request).encode())
        body = _json_or_none(response)
        if response.status != 200 or not isinstance(body, dict) or set(body) != EPISODE_KEYS:
            return _odd(response)
        if (body["episode_id"], body["task_id"]) != (episode_id, task_id):
            return f"wrong ids {body['episode_id']!r} {body['task_id']!r}"
        failure = body["failure"]
        if failure is None:
            return "ok" if body["result"] == {"reward": 1.0} else _odd(response)
        if body["result"] is not None or set(failure) != EPISODE_FAILURE_KEYS:
            return _odd(response)
        if failure["terminal"] is not False or failure["stage"] != "admission":
            return _odd(response)
        return {
            "Episode admission timed out": "timeout",
            "Episode admission queue full": "shed",
        }.get(failure["failure_reason"], _odd(response))

    async def hold_abandon(self, index: int) -> str:
        await self.connection.send("POST", "/hold")
        await asyncio.sleep(self.rng.uniform(0, 0.01))
        await self.connection.close()
        return "abandoned"


EXPECTED: dict[str, frozenset[str]] = {
    "plain": frozenset({"ok"}),
    "stream": frozenset({"ok"}),
    "stream_abandon": frozenset({"abandoned"}),
    "crash": frozenset({"error 500"}),
    "slow": frozenset({"ok", "timeout"}),
    "shed": frozenset({"ok", "shed"}),
    "episode": frozenset({"ok", "timeout", "shed"}),
    "hold_abandon": frozenset({"abandoned"}),
}


def _json_or_none(response: Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _odd(response: Response) -> str:
    return f"unexpected {response.status} {response.body[:200]!r}"


async def run_load(
    port: int, requests: int, *, concurrency: int = 48, seed: int = 0, first_index: int = 0
) -> Tally:
    """Send `requests` requests of the KINDS mix to 127.0.0.1:`port` from `concurrency`
    clients; returns once every one is answered, hung up on, or timed out."""
    rng = random.Random(seed)
    names = list(KINDS)
    weights = [KINDS[name][0] for name in names]
    plan = rng.choices(names, weights, k=requests)
    tally = Tally()
    next_index = iter(range(requests))

    async def worker(client: Client) -> None:
        try:
            for index in next_index:
                await client.one(plan[index], first_index + index)
        finally:
            await client.connection.close()

    clients = [Client(port, random.Random(rng.random()), tally) for _ in range(concurrency)]
    async with asyncio.TaskGroup() as group:
        for client in clients:
            group.create_task(worker(client))
    return tally


def main() -> None:
    """Command line: drive a soak server already listening on 127.0.0.1:PORT."""
    port = int(sys.argv[1])
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    concurrency = int(sys.argv[3]) if len(sys.argv) > 3 else 48
    tally = asyncio.run(run_load(port, requests, concurrency=concurrency))
    for (kind, outcome), count in sorted(tally.outcomes.items()):
        print(f"{kind:16} {outcome:30} {count}")
    for violation in tally.violations:
        print("VIOLATION", violation)
    sys.exit(1 if tally.violations else 0)


if __name__ == "__main__":
    main()
