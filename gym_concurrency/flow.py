"""The flow of the request being handled, for the work it does: the middleware sets it (what
`RouteLimit.flow` read from the request) around the app call; outbound clients and operation
handles queue their work in it unless told otherwise (their `flow=` left at `ROUTE_FLOW`).

A context variable, as the deadline is (deadline.py): it follows the request's task and the
tasks it starts, and nothing else. Outside a request it is None, the default flow.

`process_flow()` names this process instead: replicas that share a global limit, each in a
flow of its own, take turns at it rather than one replica's burst holding every slot.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

__all__ = ["ROUTE_FLOW", "flow_or_route", "process_flow", "request_flow", "within_flow"]

_HOST_CHARACTERS: Final = 100  # host:pid within the 128 characters the middleware keeps

_FLOW: ContextVar[Hashable] = ContextVar("gym_concurrency.flow", default=None)


class _RouteFlow:
    """The type of ROUTE_FLOW: one instance, hashable, named in reprs."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ROUTE_FLOW"


ROUTE_FLOW: Final = _RouteFlow()
"""`flow=ROUTE_FLOW` (the default of clients and operation handles): the flow of the request
being handled when the work starts; None (the default flow) outside one."""


def request_flow() -> Hashable:
    """The flow of the request being handled; None: the default flow, or no request."""
    return _FLOW.get()


def process_flow() -> str:
    """This process's flow: `host:pid` (the host name cut to 100 characters), read anew in a
    forked child."""
    return _named(os.getpid())


@functools.lru_cache(maxsize=1)
def _named(pid: int) -> str:
    """The flow of process `pid` of this host (one kept: a forked child asks for its own)."""
    return f"{socket.gethostname()[:_HOST_CHARACTERS]}:{pid}"


def flow_or_route(flow: Hashable) -> Hashable:
    """`flow`, or the request's flow if it is ROUTE_FLOW."""
    return _FLOW.get() if flow is ROUTE_FLOW else flow


@contextmanager
def within_flow(flow: Hashable) -> Iterator[None]:
    """Run the block with `flow` (None: the default flow) as the request's flow."""
    if flow is ROUTE_FLOW:
        raise ValueError("within_flow(ROUTE_FLOW): a request's flow is a flow, not a marker")
    try:
        hash(flow)
    except TypeError:
        raise TypeError(f"within_flow: a flow is hashable, got {flow!r:.200}") from None
    if flow is None and _FLOW.get() is None:
        yield  # nothing to change: the common case costs no set
        return
    token = _FLOW.set(flow)
    try:
        yield
    finally:
        _FLOW.reset(token)
