"""A hypothesis strategy of JSON bodies a client might send, as bytes: the numbers that break
naive readers (integers past the largest float and past Python's 4300-digit limit, floats
that overflow, the NaN and Infinity literals), strings, nesting, and bytes that are not JSON."""

from __future__ import annotations

import json

from hypothesis import strategies as st

__all__ = ["HUGE", "json_bodies"]

HUGE = "1" + "0" * 400  # 10^400: an int past the largest float (about 1.8e308)

# The keys the weight sources read, so that generated values land where they are read.
KEYS = ("n", "a", "max_tokens", "max_completion_tokens", "max_output_tokens", "messages", "x")

# Zeros after a leading digit: past the largest float (308), at and past Python's int limit.
_zeros = st.sampled_from([308, 309, 400, 4299, 4300, 6000]) | st.integers(1, 6000)
_huge = _zeros.map(lambda zeros: "1" + "0" * zeros)
_numbers = st.one_of(
    st.integers().map(str),
    _huge,
    _zeros.map(lambda zeros: "-9" + "0" * zeros),
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),  # NaN, Infinity too
    st.sampled_from(["1e400", "-1e400", "1E+999999999", "1e-999", HUGE + ".5", "-0", "0.0"]),
)
_leaves = st.one_of(
    st.sampled_from(["null", "true", "false"]),
    _numbers,
    st.text(max_size=20).map(json.dumps),
    _numbers.map(json.dumps),  # a number as a string
)


def _containers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    arrays = st.lists(children, max_size=4).map(lambda items: "[" + ",".join(items) + "]")
    members = st.lists(st.tuples(st.sampled_from(KEYS), children), max_size=4)
    return arrays | members.map(_object)


def json_bodies(*read: str) -> st.SearchStrategy[bytes]:
    """Bodies: mostly a JSON object whose first member is one of the keys in `read` (where a
    weight source reads a number) holding a number or any value, among other members; else
    any JSON document, or arbitrary bytes."""
    documents = st.recursive(_leaves, _containers, max_leaves=12)
    first = st.tuples(st.sampled_from(read), st.one_of(_huge, _numbers, documents))
    rest = st.lists(st.tuples(st.sampled_from(KEYS), documents), max_size=4)
    objects = st.builds(lambda kv, more: _object([kv, *more]), first, rest)
    text = st.one_of(objects, objects, objects, documents)
    return st.one_of(text.map(str.encode), text.map(str.encode), st.binary(max_size=64))


def _object(members: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f'"{key}":{value}' for key, value in members) + "}"
