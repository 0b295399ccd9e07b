"""What is left of a call's deadline, forwarded upstream as a header (`deadline_header=`): whole
milliseconds, as `RouteLimit.deadline = "header:<name>"` reads them (Envoy's
`x-envoy-expected-rq-timeout-ms` is one such header), so a server called in turn, a
gym-concurrency one among them, waits and works no longer than this call will wait for it.

Set on each attempt as it is sent: a retry, after its backoff, says what is left then.
"""

from __future__ import annotations

import asyncio
import re

__all__ = ["check_deadline_header", "milliseconds_left"]

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110)


def check_deadline_header(owner: str, name: object) -> str | None:
    """`name` (None: no header) if it is an HTTP header name; TypeError / ValueError naming it
    otherwise."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"{owner} deadline_header must be a header name or None, got {name!r}")
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{owner} deadline_header {name!r} is not an HTTP header name")
    return name


def milliseconds_left(at: float) -> str:
    """The header's value: whole milliseconds from now until `at` (loop time), never negative
    (rounded down: the server called never believes it has more time than it has)."""
    left = at - asyncio.get_running_loop().time()
    return str(max(0, int(left * 1000)))
