"""Hypothesis over a queued request's reads: whatever the order in which its body's chunks, a
disconnect and a free slot arrive, read through a receive that checkpoints (as an outer
BaseHTTPMiddleware's does) or not, and with the app cancelling its first receive or not, the app
gets the body's bytes once each and in order, a client that left before its admission never
reaches the app and is counted once, and nothing is left behind: no slot, no queue entry, no
task reading the client."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from asgi_connection import Connection, http_scope
from fastapi import FastAPI
from gym_concurrency.middleware import (
    ConcurrencyLimitMiddleware,
    ConcurrencySettings,
    RouteLimit,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.registry import limits_of

PASSES = 10  # loop passes the client's schedule spans


@dataclass
class Schedule:
    """When (in loop passes) each of the client's events happens."""

    chunks: list[tuple[int, bytes]]  # (pass, bytes), the last one ends the body
    disconnect_at: int | None
    admit_at: int | None  # the held slot is released; None: at the end
    checkpoint: bool
    cancel_first_receive: bool

    @property
    def body(self) -> bytes:
        return b"".join(chunk for _, chunk in self.chunks)


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    body = draw(st.binary(max_size=24))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(body) - 1)), max_size=3)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    at = sorted(draw(st.lists(st.integers(0, PASSES), min_size=len(pieces), max_size=len(pieces))))
    # A receive cancelled at its checkpoint loses its message: an app that cancels its own
    # receive of the server would lose it too, so the app cancels only plain receives.
    checkpoint = draw(st.booleans())
    return Schedule(
        chunks=list(zip(at, pieces, strict=True)),
        disconnect_at=draw(st.none() | st.integers(0, PASSES)),
        admit_at=draw(st.none() | st.integers(0, PASSES)),
        checkpoint=checkpoint,
        cancel_first_receive=not checkpoint and draw(st.booleans()),
    )


@dataclass
class App:
    """Reads the whole body (up to a disconnect), keeping every message, then answers."""

    cancel_first_receive: bool
    messages: list[dict[str, Any]] = field(default_factory=list)
    ran: bool = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] != "/run":  # the request that has the middleware compile its routes
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        self.ran = True
        if self.cancel_first_receive:  # a receive cancelled before it returns keeps its read
            first = asyncio.ensure_future(receive())
            await asyncio.sleep(0)
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                self.messages.append(await first)
        while not self.messages or _more(self.messages[-1]):
            self.messages.append(await receive())
        if self.messages[-1]["type"] == "http.request":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.request")


class Client(Connection):
    """The client's connection, keeping what a cancelled receive took and lost."""

    def __init__(self, scope: dict[str, Any], *, checkpoint: bool) -> None:
        super().__init__(scope, checkpoint=checkpoint)
        self.lost_messages: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        message = await self.inbox.get()
        if self._checkpoint:
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                self.lost_messages.append(message)
                raise
        return message


def _more(message: dict[str, Any]) -> bool:
    return message["type"] == "http.request" and bool(message.get("more_body", False))


def routes_app() -> FastAPI:
    """The app whose routes the middleware compiles (the request itself goes to `App`)."""
    routes = FastAPI()

    @routes.post("/run")
    async def run() -> None:  # never called
        raise AssertionError

    return routes


ROUTES = routes_app()


async def play(schedule: Schedule) -> None:
    component = "queued_reads_" + uuid.uuid4().hex[:8]
    route = RouteLimit(path="/run", limit_name="episodes", max_concurrent=1)
    app = App(schedule.cancel_first_receive)
    middleware = ConcurrencyLimitMiddleware(
        app, settings=ConcurrencySettings(component=component, routes=[route])
    )
    warm = Connection({**http_scope("/health", "GET"), "app": ROUTES})  # compiles the routes
    await middleware(warm.scope, warm.receive, warm.send)
    semaphore = limits_of(component)["episodes"]
    assert semaphore.try_acquire()  # the slot is held: the request queues
    client = Client({**http_scope(), "app": ROUTES}, checkpoint=schedule.checkpoint)
    served = asyncio.create_task(middleware(client.scope, client.receive, client.send))
    released = False
    disconnected = False
    for step in range(PASSES + 1):
        for index, (at, chunk) in enumerate(schedule.chunks):
            if at == step:
                more = index < len(schedule.chunks) - 1
                client.put({"type": "http.request", "body": chunk, "more_body": more})
        if schedule.disconnect_at == step:
            client.put({"type": "http.disconnect"})
            disconnected = True
        if schedule.admit_at == step:
            semaphore.release()
            released = True
        await asyncio.sleep(0)
    if not released:
        semaphore.release()
    if not disconnected:
        client.put({"type": "http.disconnect"})  # the server's word once the response is out
    await asyncio.wait_for(served, 5)
    for _ in range(5):  # a reader left parked is ended in the next passes
        await asyncio.sleep(0)
    check(schedule, app, client, semaphore)


def check(schedule: Schedule, app: App, client: Client, semaphore: Any) -> None:
    stats = semaphore.statistics()
    assert (stats.active, stats.queue_depth) == (0, 0)
    # Only a read nobody could want any more is cancelled: one the app would have taken
    # keeps its message (the app would wait for it forever otherwise).
    assert all(m["type"] == "http.disconnect" for m in client.lost_messages)
    assert asyncio.all_tasks() == {asyncio.current_task()}, "a read of the client was left"
    got = app.body()
    assert schedule.body.startswith(got), "bytes out of order, doubled or invented"
    if not app.ran:  # only a client that left is never served, and it is counted once
        assert schedule.disconnect_at is not None
        assert stats.admission_cancelled == 1
        assert client.sent == []
        return
    assert stats.admission_cancelled == 0
    ended = app.messages[-1]
    if ended["type"] == "http.request":  # the app read the whole body
        assert got == schedule.body


@settings(max_examples=500, deadline=None)
@given(schedule=schedules())
@example(  # the app's receive cancelled in the very pass its read ends: the message is kept
    Schedule(
        chunks=[(2, b"\x00"), (2, b"\x01")],
        disconnect_at=None,
        admit_at=1,
        checkpoint=False,
        cancel_first_receive=True,
    )
)
def test_a_queued_request_gets_its_bytes_once_in_order_and_leaves_nothing(
    schedule: Schedule,
) -> None:
    asyncio.run(play(schedule))
