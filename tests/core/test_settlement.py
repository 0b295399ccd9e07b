"""Settlement: a reservation closed from its response body as the body passes, whatever pieces
it comes in, exactly once: settled to the usage a whole body reports (JSON, streamed, gzip or
deflate), charged in full for a body cut short, without usage, too long to read, or in an
encoding it does not read; given back whole for a call never sent."""

from __future__ import annotations

import gzip
import itertools
import json
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_concurrency.limits.rate_budget import RateBudget, Reservation
from gym_concurrency.settlement import MAX_INFLATION, Settlement
from gym_concurrency.usage import MAX_EVENT_BYTES, StreamedUsage

JSON = json.dumps({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 20}})
STREAM = (
    b'data: {"choices": [{"delta": {"content": "hi"}}], "usage": null}\n\n'
    b'data: {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 30}}\n\n'
    b"data: [DONE]\n\n"
)


def reserved(estimate: int = 600) -> tuple[RateBudget, Reservation]:
    budget = RateBudget(tokens_per_minute=1000, clock=lambda: 0.0)
    reservation = budget.reserve(estimate)
    assert isinstance(reservation, Reservation)
    return budget, reservation


def remaining(budget: RateBudget) -> int:
    tokens = budget.statistics().tokens
    assert tokens is not None
    assert tokens.reserved == 0  # closed
    return tokens.remaining


def pieces(body: bytes, cuts: list[int]) -> list[bytes]:
    at = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
    return [body[a:b] for a, b in itertools.pairwise(at)]


@given(
    cuts=st.lists(st.integers(0, len(STREAM)), max_size=12),
    encoding=st.sampled_from([None, "gzip", "deflate"]),
)
def test_a_stream_in_any_pieces_settles_to_its_final_usage(
    cuts: list[int], encoding: str | None
) -> None:
    body = {None: STREAM, "gzip": gzip.compress(STREAM), "deflate": zlib.compress(STREAM)}[encoding]
    budget, reservation = reserved()
    settlement = Settlement(budget, reservation)
    settlement.start("text/event-stream; charset=utf-8", encoding)
    for piece in pieces(body, cuts):
        settlement.feed(piece)
    assert settlement.end() is not None
    assert remaining(budget) == 1000 - 130


@given(cuts=st.lists(st.integers(0, len(JSON)), max_size=8))
def test_a_json_body_in_any_pieces_settles_to_its_usage(cuts: list[int]) -> None:
    budget, reservation = reserved()
    settlement = Settlement(budget, reservation)
    settlement.start("application/json")
    for piece in pieces(JSON.encode(), cuts):
        settlement.feed(piece)
    settlement.end()
    assert remaining(budget) == 1000 - 120


def test_what_cannot_be_read_is_charged_in_full() -> None:
    for content_type, encoding, body in [
        ("application/json", None, b'{"choices": []}'),  # no usage
        ("application/json", "br", JSON.encode()),  # an encoding it does not read
        ("application/json", None, b" " * MAX_EVENT_BYTES + JSON.encode()),  # too long
        ("text/event-stream", None, STREAM[:80]),  # cut before the usage came
        ("text/event-stream", "gzip", b"not gzip at all"),
    ]:
        budget, reservation = reserved()
        settlement = Settlement(budget, reservation)
        settlement.start(content_type, encoding)
        settlement.feed(body)
        settlement.end()
        assert remaining(budget) == 400, (content_type, encoding)


def test_it_closes_once_whichever_way_comes_first() -> None:
    budget, reservation = reserved()
    settlement = Settlement(budget, reservation)
    settlement.start("application/json")
    settlement.feed(JSON.encode())
    settlement.end()
    settlement.abort()  # the slot's release after the body was read: nothing more
    settlement.cancel()
    assert not settlement.open
    assert remaining(budget) == 880

    budget, reservation = reserved()
    settlement = Settlement(budget, reservation)
    settlement.abort()  # a broken read: charged in full, and the end that follows is nothing
    settlement.feed(JSON.encode())
    settlement.end()
    assert remaining(budget) == 400

    budget, reservation = reserved()
    Settlement(budget, reservation).cancel()  # never sent: all back, its request too
    assert remaining(budget) == 1000


def inflated_into_the_stream(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of what a Settlement hands its stream reader, piece by piece."""
    fed: list[int] = []
    feed = StreamedUsage.feed

    def counted(self: StreamedUsage, piece: bytes) -> None:
        fed.append(len(piece))
        feed(self, piece)

    monkeypatch.setattr(StreamedUsage, "feed", counted)
    return fed


def test_a_compressed_bomb_is_read_at_most_max_inflation_times_its_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each 1 KiB piece inflates to about 1 MB: reading stops once the body passes
    MAX_INFLATION times what came compressed (and 1 MiB), and the call is charged in full."""
    fed = inflated_into_the_stream(monkeypatch)
    compress = zlib.compressobj(9, zlib.DEFLATED, 31)
    flood = b"\n" * 1_000_000
    bomb = [compress.compress(flood) + compress.flush(zlib.Z_SYNC_FLUSH) for _ in range(20)]
    assert zlib.decompressobj(31).decompress(b"".join(bomb)) == flood * 20  # one valid stream
    budget, reservation = reserved()
    settlement = Settlement(budget, reservation)
    settlement.start("text/event-stream", "gzip")
    for piece in bomb:
        settlement.feed(piece)
    assert settlement.end() is None
    assert remaining(budget) == 1000 - 600  # charged in full
    wire = sum(map(len, bomb))
    assert sum(fed) <= MAX_INFLATION * wire + MAX_EVENT_BYTES
    assert len(fed) < len(bomb)  # it stopped reading


def test_a_long_stream_compressed_as_well_as_json_compresses_settles() -> None:
    """A chat stream of 3,000 chunks, one flush a chunk or one compressed whole (about 43x):
    well within MAX_INFLATION, read to its usage."""
    words = [f"w{n * 7919 % 1000}" for n in range(3000)]
    chunks = [
        b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                                "choices": [{"index": 0, "delta": {"content": word}}]}).encode()
        + b"\n\n"
        for word in words
    ] + [STREAM]  # fmt: skip
    whole = gzip.compress(b"".join(chunks), 9)
    assert len(b"".join(chunks)) / len(whole) > 20  # as compressible as such streams are
    compress = zlib.compressobj(9, zlib.DEFLATED, 31)
    flushed = [compress.compress(c) + compress.flush(zlib.Z_SYNC_FLUSH) for c in chunks]
    for body in ([whole[i : i + 4096] for i in range(0, len(whole), 4096)], flushed):
        budget, reservation = reserved()
        settlement = Settlement(budget, reservation)
        settlement.start("text/event-stream", "gzip")
        for piece in body:
            settlement.feed(piece)
        assert settlement.end() is not None
        assert remaining(budget) == 1000 - 130
