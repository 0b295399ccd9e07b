"""Reading a call's usage from its response: each provider's JSON and stream, what is not a
usage, and (hypothesis) no body whatever raises, nor does a stream read in any pieces read
differently from the whole."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_concurrency.usage import (
    StreamedUsage,
    Usage,
    usage_from_body,
    usage_from_json,
    usage_from_sse,
)
from tests.json_bodies import HUGE, json_bodies


def sse(*events: object, done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(e)}\n\n" for e in events]
    return ("".join(lines) + ("data: [DONE]\n\n" if done else "")).encode()


@pytest.mark.parametrize(
    ("body", "usage"),
    [
        ({"usage": {"prompt_tokens": 13, "completion_tokens": 5, "total_tokens": 18}}, (13, 5)),
        ({"usage": {"prompt_tokens": 8, "total_tokens": 8}}, (8, 0)),  # embeddings
        ({"usage": {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37}}, (30, 7)),
        (
            {
                "type": "message",
                "usage": {
                    "input_tokens": 1,
                    "cache_creation_input_tokens": 287,
                    "cache_read_input_tokens": 30433,
                    "output_tokens": 67,
                },
            },
            (30721, 67),  # Anthropic: the whole prompt, cached parts included
        ),
        (
            {"usage": {"input_tokens": 4, "cache_read_input_tokens": None, "output_tokens": 2}},
            (4, 2),
        ),
        ({"usage": {"prompt_tokens": 2.0, "completion_tokens": 0}}, (2, 0)),
    ],
)
def test_each_providers_json_usage_is_read(body: object, usage: tuple[int, int]) -> None:
    assert usage_from_json(json.dumps(body)) == Usage(*usage)
    assert usage_from_body(json.dumps(body).encode(), "application/json") == Usage(*usage)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"usage": null}',
        b'{"usage": {"prompt_tokens": 3}}',
        b'{"usage": {"prompt_tokens": -1, "completion_tokens": 2}}',
        b'{"usage": {"prompt_tokens": true, "completion_tokens": 2}}',
        b'{"usage": {"prompt_tokens": "3", "completion_tokens": 2}}',
        b'{"usage": {"prompt_tokens": 9, "total_tokens": 3}}',
        b'{"usage": {"input_tokens": 3}}',
        b'{"usage": {"input_tokens": 3, "output_tokens": NaN}}',
        b'{"usage": {"input_tokens": 1, "cache_read_input_tokens": "x", "output_tokens": 1}}',
        b"[" * 100_000 + b"]" * 100_000,  # nested past the recursion limit
        b"\xff\xfe",
    ],
)
def test_what_is_not_a_usage_reads_none(body: bytes) -> None:
    assert usage_from_json(body) is None


def test_a_count_past_every_limit_is_read_as_huge_not_refused() -> None:
    body = '{"usage": {"prompt_tokens": ' + HUGE + ', "completion_tokens": 1e400}}'
    usage = usage_from_json(body)
    assert usage is not None
    assert usage.input_tokens == 10**400
    assert usage.output_tokens > 10**300  # the budget caps a settlement at its minute


def test_openais_stream_reads_its_final_usage_chunk() -> None:
    chunk = {"object": "chat.completion.chunk", "usage": None}
    body = sse(
        {**chunk, "choices": [{"delta": {"content": "o"}}]},
        {**chunk, "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 4}},
    )
    assert usage_from_sse(body) == Usage(11, 4)
    assert usage_from_body(body, "text/event-stream; charset=utf-8") == Usage(11, 4)
    assert usage_from_body(body) == Usage(11, 4)  # no content type: it looks like a stream
    without = sse({**chunk, "choices": [{"delta": {"content": "o"}}]})
    assert usage_from_sse(without) is None  # no include_usage: charged in full


def test_the_responses_stream_reads_its_completed_event() -> None:
    completed = {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 5, "output_tokens": 9}},
    }
    body = sse({"type": "response.output_text.delta", "delta": "hi"}, completed, done=False)
    assert usage_from_sse(body) == Usage(5, 9)


def test_anthropics_stream_reads_message_start_and_the_last_message_delta() -> None:
    start = {
        "type": "message_start",
        "message": {
            "usage": {"input_tokens": 25, "cache_read_input_tokens": 5, "output_tokens": 1}
        },
    }
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": 15},
    }
    later = {"type": "message_delta", "usage": {"output_tokens": 40}}  # cumulative: the last
    body = sse(start, delta, later, {"type": "message_stop"}, done=False)
    assert usage_from_sse(body) == Usage(30, 40)
    # A gateway that sends the input only at the end (input_tokens 0 at the start).
    start_zero = {
        "type": "message_start",
        "message": {"usage": {"input_tokens": 0, "output_tokens": 1}},
    }
    late_input = {"type": "message_delta", "usage": {"input_tokens": 9, "output_tokens": 3}}
    assert usage_from_sse(sse(start_zero, late_input, done=False)) == Usage(9, 3)
    # Cut before its end: the output is not known yet.
    assert usage_from_sse(sse(start, done=False)) is None


def test_sse_framing_line_ends_comments_and_multi_line_data() -> None:
    usage = {"usage": {"prompt_tokens": 2, "completion_tokens": 3}}
    text = json.dumps(usage, indent=1)  # several lines: several data fields, one event
    data = "".join(f"data:{line}\r\n" for line in text.splitlines())
    body = f": keep-alive\r\nevent: x\r\n{data}\r\n".encode()
    assert usage_from_sse(body) == Usage(2, 3)
    assert usage_from_sse(body.replace(b"\r\n", b"\r")) == Usage(2, 3)
    assert usage_from_sse(f"data: {json.dumps(usage)}".encode()) == Usage(2, 3)  # no blank end
    byte_by_byte = StreamedUsage()  # a "\r\n" split across two pieces is one line end
    for index in range(len(body)):
        byte_by_byte.feed(body[index : index + 1])
    assert byte_by_byte.result() == Usage(2, 3)


def test_an_event_longer_than_the_bound_is_skipped_and_the_next_one_read() -> None:
    reader = StreamedUsage(max_event_bytes=1000)
    reader.feed(b"data: " + b"x" * 5000 + b"\n")
    reader.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\n')  # same event
    reader.feed(b'data: {"usage": {"prompt_tokens": 7, "completion_tokens": 8}}\n\n')
    assert reader.result() == Usage(7, 8)
    assert len(reader._line) == 0  # nothing of the long line was kept


_events = st.one_of(
    st.sampled_from(
        [
            b'data: {"usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n\n',
            b'data: {"type": "message_start", "message": {"usage": {"input_tokens": 2}}}\n\n',
            b'data: {"type": "message_delta", "usage": {"output_tokens": 6}}\n\n',
            b"data: [DONE]\n\n",
            b": comment\r\n",
            b"\r\n",
            b"event: ping\n",
        ]
    ),
    json_bodies("usage", "type", "message").map(lambda body: b"data: " + body + b"\n\n"),
    st.binary(max_size=40),
)


@settings(max_examples=300, deadline=None)
@given(body=json_bodies("usage", "prompt_tokens", "input_tokens", "type"))
def test_no_json_body_raises(body: bytes) -> None:
    result = usage_from_json(body)
    assert result is None or (result.input_tokens >= 0 and result.output_tokens >= 0)
    usage_from_body(body)


@settings(max_examples=300, deadline=None)
@given(events=st.lists(_events, max_size=8), data=st.data())
def test_no_stream_raises_and_pieces_read_as_the_whole(
    events: list[bytes], data: st.DataObject
) -> None:
    body = b"".join(events)
    whole = usage_from_sse(body)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=6)))
    reader = StreamedUsage()
    for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True):
        reader.feed(body[start:end])
    assert reader.result() == whole


def test_a_flood_of_blank_lines_is_one_event_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blank lines after a blank line dispatch nothing: a flood of them (any line ends, in any
    pieces) costs one dispatch, not a Python call a line, and the usage after it is read."""
    dispatched: list[int] = []
    dispatch = StreamedUsage._dispatch

    def counted(self: StreamedUsage) -> None:
        dispatched.append(1)
        dispatch(self)

    monkeypatch.setattr(StreamedUsage, "_dispatch", counted)
    reader = StreamedUsage()
    reader.feed(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n')
    for flood in (b"\n" * 100_000, b"\r\n" * 50_000, b"\r" * 100_000):
        reader.feed(flood)
    reader.feed(b'data: {"usage": {"prompt_tokens": 5, "completion_tokens": 6}}\n\n')
    assert reader.result() == Usage(5, 6)
    assert len(dispatched) <= 10


def test_a_usage_is_counts_and_a_fraction_of_a_token_is_one() -> None:
    """A negative or non-int count would refund more than was reserved: refused by name. A
    reported fraction of a token rounds up, as any count does."""
    for bad in (-1, 1.5, "3", True, None):
        with pytest.raises(ValueError, match=r"Usage\.input_tokens must be an int >= 0"):
            Usage(bad, 0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"Usage\.output_tokens must be an int >= 0"):
            Usage(0, bad)  # type: ignore[arg-type]
    body = {"usage": {"prompt_tokens": 0.5, "completion_tokens": 2.2}}
    assert usage_from_json(json.dumps(body)) == Usage(1, 3)
