"""Strict checks of `RouteLimit.flow` and `RouteLimit.weight` (middleware/asks.py reads them):
a value that could never be read from a request fails the settings, naming what was wrong."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator
from starlette.routing import compile_path

from .numbers import number

__all__ = ["DeadlineHeader", "DeadlineSource", "FlowSource", "WeightSource", "check_ask"]

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110)
_DOTTED = re.compile(r"^[^.\s]+(\.[^.\s]+)*$")
_FLOW_KINDS = (
    "'header:<name>', 'query:<name>', 'path:<param>', 'json:<dotted.path>' or 'client', "
    "each optionally after 'hash:'"
)
_WEIGHTS = "an int >= 1, 'json:<dotted.path>' or 'openai_tokens'"


def _check_flow(value: str) -> str:
    source = value.removeprefix("hash:")  # kept as its keyed hash (docs/flows.md)
    if source == "client":
        return value
    kind, colon, name = source.partition(":")
    if not colon or kind not in ("header", "query", "path", "json") or not name:
        raise ValueError(f"must be {_FLOW_KINDS}, got {value!r}")
    if kind == "header" and not _TOKEN.match(name):
        raise ValueError(f"{name!r} is not an HTTP header name")
    if kind == "json" and not _DOTTED.match(name):
        raise ValueError(f"{name!r} is not a dotted path such as 'metadata.tenant'")
    if kind == "path" and not name.isidentifier():
        raise ValueError(f"{name!r} is not a path parameter name")
    return value


def _weight_from_text(value: Any) -> Any:
    # From the environment every weight is text: "8" is a number, the two sources are names.
    if isinstance(value, str):
        text = value.strip()
        if text == "openai_tokens" or text.startswith("json:"):
            return text
        try:
            return number(int, text, strings=False)
        except ValueError:
            raise ValueError(f"must be {_WEIGHTS}, got {value!r}") from None
    return value


def _check_weight(value: int | str) -> int | str:
    if isinstance(value, str):
        dotted = value.startswith("json:") and _DOTTED.match(value[5:])
        if value != "openai_tokens" and not dotted:
            raise ValueError(f"must be {_WEIGHTS}, got {value!r}")
    elif value < 1:
        raise ValueError(f"must be {_WEIGHTS}, got {value}")
    return value


def _check_deadline(value: str) -> str:
    kind, colon, name = value.partition(":")
    if kind != "header" or not colon or not _TOKEN.match(name):
        raise ValueError(f"must be 'header:<name>' (milliseconds remaining), got {value!r}")
    return value


def _check_header_name(value: str) -> str:
    if not _TOKEN.match(value):
        raise ValueError(f"{value!r} is not an HTTP header name")
    return value


FlowSource = Annotated[str, AfterValidator(_check_flow)]
# Where an outbound call sends what is left of its deadline (ClientLimit.deadline_header).
DeadlineHeader = Annotated[str, AfterValidator(_check_header_name)]
DeadlineSource = Annotated[str, AfterValidator(_check_deadline)]
WeightSource = Annotated[
    int | str, BeforeValidator(_weight_from_text), AfterValidator(_check_weight)
]


def check_ask(path: str, flow: str | None, weight: int | str, limit: int) -> None:
    """ValueError if the route's flow and weight do not fit its path and limit."""
    source = None if flow is None else flow.removeprefix("hash:")
    if source is not None and source.startswith("path:"):
        params = compile_path(path)[2]
        if source[5:] not in params:
            names = ", ".join(sorted(params)) or "none"
            raise ValueError(f"flow {flow!r}: {path!r} has no such parameter (it has: {names})")
    if isinstance(weight, int) and weight > limit:
        raise ValueError(f"weight {weight} is more than max_concurrent {limit}: never admitted")
