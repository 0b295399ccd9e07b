"""The app call of a request admitted with a reservation of its limit's rate budget: the
response body is read for its usage as it is sent (no copy kept beyond the one event or the
1 MiB body usage.py reads), and the reservation settled to it once the body was sent in full.
An app that raises, a client gone before the last byte, or a body without a usage: charged in
full (the call may have cost its whole estimate)."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_concurrency.settlement import Settlement

__all__ = ["run_settled"]


async def run_settled(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, settlement: Settlement
) -> None:
    """Run `app`, settling `settlement` from the response it sends."""

    async def settling_send(message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            settlement.start(*_content(message.get("headers") or ()))
        elif kind == "http.response.body":
            settlement.feed(message.get("body", b""))
            await send(message)
            if not message.get("more_body", False):  # sent in full: settled now
                settlement.end()
            return
        await send(message)

    try:
        await app(scope, receive, settling_send)
    finally:
        settlement.abort()  # nothing if it was settled; else the body never ended


def _content(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """The response's content type and content encoding (None: not sent)."""
    found: dict[bytes, str] = {}
    for name, value in headers:
        key = bytes(name).lower()
        if key in (b"content-type", b"content-encoding"):
            found[key] = bytes(value).decode("latin-1")
    return found.get(b"content-type"), found.get(b"content-encoding")
