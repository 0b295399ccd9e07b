"""What the benchmarks' fake upstreams (engine, provider, model) share as plain ASGI apps."""

from __future__ import annotations

from typing import Any

__all__ = ["read_body"]


async def read_body(receive: Any) -> bytes:
    """The request's whole body, however many messages it came in."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body
