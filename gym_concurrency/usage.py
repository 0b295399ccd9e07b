"""What a call used, read from its response, so that a rate budget's reservation is settled to
it (`RateBudget.settle`).

Read from a JSON body:
- OpenAI chat completions, completions, embeddings: `usage.prompt_tokens` and
  `usage.completion_tokens` (none, as for embeddings: `total_tokens - prompt_tokens`);
- OpenAI Responses: `usage.input_tokens` and `usage.output_tokens`;
- Anthropic Messages: `usage.input_tokens` plus `cache_creation_input_tokens` and
  `cache_read_input_tokens` (the whole prompt, as an estimate prices it) and
  `usage.output_tokens`.

And from a streamed body (`text/event-stream`), piece by piece (`StreamedUsage`): OpenAI's
final chunk's `usage` (sent with `stream_options: {"include_usage": true}`; the others carry
`"usage": null`), the Responses API's `response.completed` (or `.incomplete`, `.failed`)
event, Anthropic's `message_start` (input) and `message_delta` (cumulative counts: the last
one stands). A stream counts only once its final usage came: a stream cut short reads None.

Anything else (no usage, a count that is not a number >= 0, a body that is not JSON) reads as
None, and the caller charges the reservation in full. Nothing here raises on any body; numbers
are read as client-sent ones are (json_numbers.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .json_numbers import count, loads

__all__ = [
    "MAX_EVENT_BYTES",
    "StreamedUsage",
    "Usage",
    "usage_from_body",
    "usage_from_json",
    "usage_from_sse",
    "usage_of",
]

MAX_EVENT_BYTES = 1 << 20
"""The most of one streamed event kept to read its usage; a longer one is skipped unread."""

_JSON_ERRORS = (ValueError, UnicodeError, RecursionError)  # RecursionError: deep nesting
_ANTHROPIC_INPUT = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
_RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")
_LINE_END = re.compile(rb"\r\n|\r|\n")
_BLANK_LINES = re.compile(rb"(?:\r\n|\r|\n){3,}")


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a call used: its input (prompt) and its output (completion), ints >= 0 (else
    ValueError: a negative count would refund more than was reserved)."""

    input_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Usage.{name} must be an int >= 0, not {value!r}")

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


def usage_of(document: object) -> Usage | None:
    """The usage in a parsed response (OpenAI chat / completions / embeddings / Responses,
    Anthropic Messages), or None."""
    if not isinstance(document, Mapping):
        return None
    usage = document.get("usage")
    if not isinstance(usage, Mapping):
        return None
    if "prompt_tokens" in usage:  # OpenAI chat completions, completions, embeddings
        prompt = _tokens(usage["prompt_tokens"])
        if prompt is None:
            return None
        if "completion_tokens" in usage:
            completion = _tokens(usage["completion_tokens"])
        else:
            total = _tokens(usage.get("total_tokens"))
            completion = None if total is None or total < prompt else total - prompt
        return None if completion is None else Usage(prompt, completion)
    prompt = _input_tokens(usage)
    output = _tokens(usage.get("output_tokens"))
    return None if prompt is None or output is None else Usage(prompt, output)


def usage_from_json(body: bytes | str) -> Usage | None:
    """The usage in a JSON response body, or None."""
    try:
        return usage_of(loads(body))
    except _JSON_ERRORS:
        return None


def usage_from_sse(body: bytes) -> Usage | None:
    """The usage in a whole streamed (text/event-stream) body, or None."""
    reader = StreamedUsage()
    reader.feed(body)
    return reader.result()


def usage_from_body(body: bytes, content_type: str | None = None) -> Usage | None:
    """The usage in a response body: streamed if its content type says `text/event-stream`
    (or, with none given, if it starts as a stream does), else JSON."""
    if content_type is None:
        streamed = body.lstrip().startswith((b"data:", b"event:", b":"))
    else:
        streamed = "text/event-stream" in content_type.lower()
    return usage_from_sse(body) if streamed else usage_from_json(body)


class StreamedUsage:
    """Reads a streamed body's usage as its pieces arrive: `feed(piece)` for each, then
    `result()` once at its end. Keeps the line and event being read (at most
    `max_event_bytes`; a longer event is skipped) and the counts seen, nothing else."""

    __slots__ = (
        "_after_cr",
        "_data",
        "_data_size",
        "_done",
        "_event_over",
        "_final",
        "_input",
        "_line",
        "_line_over",
        "_max",
        "_output",
        "_start_input",
    )

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._line = bytearray()
        self._after_cr = False  # the last piece ended in "\r": a "\n" next is the same line end
        self._line_over = False  # the line being read is too long: skip to its end
        self._event_over = False  # the event being read had one: skip it all
        self._data: list[bytes] = []
        self._data_size = 0
        self._input: int | None = None
        self._start_input: int | None = None
        self._output: int | None = None
        self._final = False  # the stream's final usage came
        self._done = False

    def feed(self, piece: bytes) -> None:
        """The next piece of the body, as received (split anywhere)."""
        if self._done:
            return
        if self._after_cr and piece.startswith(b"\n"):
            piece = piece[1:]
        # A blank line after a blank line dispatches nothing: a flood of them is cut here, in
        # C, to the one that ends an event (not a line each in Python).
        piece = _BLANK_LINES.sub(b"\n\n", piece)
        self._after_cr = piece.endswith(b"\r")
        start = 0
        for end in _LINE_END.finditer(piece):
            self._take(piece[start : end.start()])
            self._end_line()
            start = end.end()
        self._take(piece[start:])

    def result(self) -> Usage | None:
        """The usage the stream reported, or None; ends the reading (an event left without
        its closing blank line still counts)."""
        if not self._done:
            if self._line or self._line_over:
                self._end_line()
            if not self._event_over:
                self._dispatch()
            self._done = True
        if not self._final or self._input is None or self._output is None:
            return None
        return Usage(self._input, self._output)

    def _take(self, part: bytes) -> None:
        if self._line_over or not part:
            return
        if len(self._line) + len(part) + self._data_size > self._max:
            self._line_over = True
            self._line.clear()
            return
        self._line += part

    def _end_line(self) -> None:
        if self._line_over:  # a line too long is never the blank line that ends an event
            self._line_over, self._event_over = False, True
            return
        line = bytes(self._line)
        self._line.clear()
        if line:
            field, _, value = line.partition(b":")
            if field == b"data" and not self._event_over:
                value = value[1:] if value.startswith(b" ") else value
                self._data.append(value)
                self._data_size += len(value) + 1
        elif self._event_over:  # the end of an event skipped unread
            self._event_over = False
            self._data.clear()
            self._data_size = 0
        else:
            self._dispatch()

    def _dispatch(self) -> None:
        data = b"\n".join(self._data)
        self._data.clear()
        self._data_size = 0
        if not data or data.strip() == b"[DONE]":
            return
        try:
            self._observe(loads(data))
        except _JSON_ERRORS:
            return

    def _observe(self, event: object) -> None:
        if not isinstance(event, Mapping):
            return
        kind = event.get("type")
        if kind == "message_start":  # Anthropic: the input, and a first output count
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, Mapping) else None
            if isinstance(usage, Mapping):
                self._start_input = _input_tokens(usage)
                self._input = self._start_input
                self._output = _tokens(usage.get("output_tokens"))
        elif kind == "message_delta":  # Anthropic: cumulative counts at the stream's end
            usage = event.get("usage")
            output = _tokens(usage.get("output_tokens")) if isinstance(usage, Mapping) else None
            if isinstance(usage, Mapping) and output is not None:
                self._output, self._final = output, True
                again = _input_tokens(usage) if "input_tokens" in usage else None
                known = [n for n in (self._start_input, again) if n is not None]
                self._input = max(known) if known else None
        elif kind in _RESPONSE_ENDS:  # the Responses API's last event
            self._settle(usage_of(event.get("response")))
        else:  # OpenAI chat / completions chunks: the last one carries the usage
            self._settle(usage_of(event))

    def _settle(self, usage: Usage | None) -> None:
        if usage is not None:
            self._input, self._output, self._final = usage.input_tokens, usage.output_tokens, True


def _tokens(value: object) -> int | None:
    """A token count: a number >= 0 (rounded up), else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1:
        return math.ceil(value)  # 0, or a fraction of one token: one
    return count(value)


def _input_tokens(usage: Mapping[str, object]) -> int | None:
    """`input_tokens` plus Anthropic's cache counts where present (null or absent: 0)."""
    total = 0
    for field in _ANTHROPIC_INPUT:
        value = usage.get(field)
        if value is None and field != "input_tokens":
            continue
        tokens = _tokens(value)
        if tokens is None:
            return None
        total += tokens
    return total
