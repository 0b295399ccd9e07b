"""A raw TCP server on 127.0.0.1 that answers each connection with bytes the test writes, for
the HTTP corners a real server never shows (chunked, no length, endless, hung, malformed);
it keeps each request it read and notes when the client closed its connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


@dataclass
class RawServer:
    url: str
    requests: list[bytes] = field(default_factory=list)
    client_closed: asyncio.Event = field(default_factory=asyncio.Event)
    connections: int = 0


@asynccontextmanager
async def raw_server(answer: Answer, path: str = "/metrics") -> AsyncIterator[RawServer]:
    """Serve `answer(writer)` to every connection (after reading its request head); the
    connection is closed after `answer` returns."""
    state: RawServer | None = None
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert state is not None
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        state.connections += 1
        try:
            state.requests.append(await reader.readuntil(b"\r\n\r\n"))
            await asyncio.gather(answer(writer), _watch_close(reader, state))
        except (ConnectionError, asyncio.IncompleteReadError):
            state.client_closed.set()
        finally:
            writer.close()
            handlers.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    state = RawServer(f"http://127.0.0.1:{port}{path}")
    try:
        yield state
    finally:
        server.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def _watch_close(reader: asyncio.StreamReader, state: RawServer) -> None:
    try:
        while await reader.read(1024):
            pass
    except ConnectionError:
        pass
    state.client_closed.set()


def sending(*pieces: bytes, then_hang: bool = False, delay: float = 0.0) -> Answer:
    """An answer that writes `pieces` (pausing `delay` between them), then closes, or with
    `then_hang` keeps the connection open."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            if delay:
                await asyncio.sleep(delay)
        if then_hang:
            await asyncio.sleep(3600)
        writer.close()

    return answer


def endless(chunk: bytes = b"x" * 65536) -> Answer:
    """An answer whose body never ends (no length: read to close)."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
        while True:
            writer.write(chunk)
            await writer.drain()

    return answer
