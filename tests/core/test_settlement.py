"""Settlement: a reservation closed from its response body as the body passes, whatever pieces
it comes in, exactly once: settled to the usage a whole body reports (JSON, streamed, gzip or
deflate), charged in full for a body cut short, without usage, too long to read, or in an
encoding it does not read; given back whole for a call never sent."""

from __future__ import annotations

import gzip
import itertools
import json
import zlib

from hypothesis import given
from hypothesis import strategies as st

from gym_concurrency.limits.rate_budget import RateBudget, Reservation
from gym_concurrency.settlement import Settlement
from gym_concurrency.usage import MAX_EVENT_BYTES

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
