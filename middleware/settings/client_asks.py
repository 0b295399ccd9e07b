"""Strict checks of `ClientLimit.flow` and `ClientLimit.weight` (middleware/client_asks.py
reads them): a value no call could be asked for fails the settings, naming what was wrong."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator

from gym_concurrency.hashed_flows import CREDENTIAL_HEADERS

from .asks import _TOKEN

__all__ = [
    "ClientFlowSource",
    "ClientWeightSource",
    "check_client_ask",
    "check_client_flow_headers",
]

_FLOWS = (
    "'route' (the flow of the request being handled), 'none', 'process' (this process's own) "
    "or 'header:<name>'"
)
_WEIGHTS = "an int >= 1 or 'openai_tokens'"


def _check_flow(value: str) -> str:
    if value in ("route", "none", "process"):
        return value
    kind, colon, name = value.partition(":")
    if kind != "header" or not colon or not name:
        raise ValueError(f"must be {_FLOWS}, got {value!r}")
    if not _TOKEN.match(name):
        raise ValueError(f"{name!r} is not an HTTP header name")
    # A flow is a metric label and a Redis key: never a credential's value.
    if name.lower() in CREDENTIAL_HEADERS:
        raise ValueError(
            f"{name!r} carries a credential: a flow is shown in metrics, the status page and "
            "Redis keys, so it is never read from one (send the flow in a header of its own)"
        )
    return value


def _check_weight(value: int | str) -> int | str:
    if isinstance(value, str) and value.strip() == "openai_tokens":
        return "openai_tokens"
    if isinstance(value, str) or value < 1:
        raise ValueError(f"must be {_WEIGHTS}, got {value!r}")
    return value


ClientFlowSource = Annotated[str, AfterValidator(_check_flow)]
ClientWeightSource = Annotated[int | str, AfterValidator(_check_weight)]


def check_client_ask(weight: int | str, limit: int) -> None:
    """ValueError if every call would ask for more than the whole limit."""
    if isinstance(weight, int) and weight > limit:
        raise ValueError(
            f"weight {weight} is more than max_concurrent {limit}: every call would be capped "
            "at the whole limit"
        )


def check_client_flow_headers(clients: Sequence[Any], credential_headers: Iterable[str]) -> None:
    """ValueError naming the client whose `flow` reads a header the settings list among
    `credential_headers`: a flow is never a credential's value."""
    listed = {name.lower() for name in credential_headers}
    for index, client in enumerate(clients):
        kind, _, name = str(client.flow).partition(":")
        if kind == "header" and name.lower() in listed:
            raise ValueError(
                f"clients.{index}.flow: {name!r} is listed in credential_headers: a flow is "
                "shown in metrics, the status page and Redis keys, so it is never read from one"
            )
