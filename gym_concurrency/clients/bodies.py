"""The body of an outgoing request, read as the call leaves: `json_body(request)` parses it
within bounds, and `openai_tokens(request)` prices it in tokens (`weight=openai_tokens`).

Both take the request a weight or flow function sees, an `httpx.Request` or an
`aiohttp.ClientRequest`, and neither ever raises: a body that is not in memory (a generator or
a stream), not JSON, or larger than `max_bytes` is simply not parsed. Neither imports httpx or
aiohttp: a request's library is already imported when one of its requests is seen here.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from .. import json_numbers, tokens

__all__ = ["MAX_JSON_BODY_BYTES", "json_body", "openai_tokens"]

MAX_JSON_BODY_BYTES = 1024 * 1024
"""The largest body parsed (1 MiB, about 250k tokens of prompt)."""

_CHARACTERS_PER_TOKEN = 4  # as gym_concurrency.tokens counts a prompt
_NOT_PARSED = object()


def json_body(request: object, *, max_bytes: int = MAX_JSON_BODY_BYTES) -> Any | None:
    """The parsed JSON body of `request` (an httpx.Request or aiohttp.ClientRequest), or None
    if it has none in memory, is not JSON, or is larger than `max_bytes` (an integer longer
    than Python reads from text is read as its leading digits). Never raises: for
    weight and flow functions, e.g. `flow=lambda r: (json_body(r) or {}).get("user")`."""
    parsed = _parse(_body(request), max_bytes)
    return None if parsed is _NOT_PARSED else parsed


def openai_tokens(
    request: object,
    *,
    default_output_tokens: int = tokens.DEFAULT_OUTPUT_TOKENS,
    max_bytes: int = MAX_JSON_BODY_BYTES,
) -> int:
    """The tokens an OpenAI-style request may cost: gym_concurrency.tokens.openai_tokens of its
    JSON body (the prompt's characters / 4, plus `max_completion_tokens`, `max_tokens` or
    `max_output_tokens`, else `default_output_tokens`). A body that is not JSON (or not in
    memory) costs `default_output_tokens`; one larger than `max_bytes` is not parsed but
    priced by its length: bytes / 4 + `default_output_tokens`. Never raises."""
    body = _body(request)
    parsed = _parse(body, max_bytes)
    if parsed is _NOT_PARSED and body is not None and len(body) > max_bytes:
        return max(1, math.ceil(len(body) / _CHARACTERS_PER_TOKEN) + default_output_tokens)
    prompt = None if parsed is _NOT_PARSED else parsed
    return tokens.openai_tokens(prompt, default_output_tokens=default_output_tokens)


def _parse(body: bytes | str | None, max_bytes: int) -> Any:
    if not body or len(body) > max_bytes:
        return _NOT_PARSED
    try:
        return json_numbers.loads(body)  # an integer too long for Python: its leading digits
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the stack
        return _NOT_PARSED


def _body(request: object) -> bytes | str | None:
    """The body of `request` if it is held in memory whole (`json=`, `content=` / `data=`
    bytes or text), else None (a stream, a generator, a file, or no body)."""
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(request, httpx.Request):
        try:
            content: bytes = request.content
        except httpx.RequestNotRead:  # a streamed body: read only as it is sent
            return None
        return content
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(request, aiohttp.ClientRequest):
        body = request.body
        if isinstance(body, aiohttp.payload.BytesPayload):  # json=, data=bytes / str
            try:
                text: str = body.decode()
            except (UnicodeError, AttributeError):
                return None
            return text
    return None
