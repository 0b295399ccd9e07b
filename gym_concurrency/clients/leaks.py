"""A response dropped without being closed gives its slot back when it is garbage-collected,
on its event loop, and the first such leak in a process is logged with where the response was
made: a stream abandoned unread must not hold a slot of the limit forever."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import weakref
from collections.abc import Awaitable, Callable
from types import FrameType

from .calls import Slot

__all__ = ["guard_slot"]

_log = logging.getLogger("gym_concurrency.clients")
# Frames of these packages' modules are not "where the response was made": the caller's are.
_LIBRARIES = ("gym_concurrency", "httpx", "httpcore", "aiohttp", "openai", "asyncio", "anyio")
_said = False


Close = Callable[[], Awaitable[None]]
_closing: set[asyncio.Task[None]] = set()  # closes under way (the loop keeps tasks weakly)


def guard_slot(owner: object, slot: Slot, close: Close | None = None) -> None:
    """If `owner` is collected while `slot` is still held: give the slot back (unmeasured)
    and run `close()` (what frees the connection underneath), on the slot's event loop."""
    loop = asyncio.get_running_loop()
    weakref.finalize(owner, _collected, loop, slot, close, _made_at())


def _made_at() -> str:
    """The first frame outside this library and the HTTP clients: the caller's code."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and _in_library(frame):
        frame = frame.f_back
    if frame is None:
        return "an unknown place"
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"


def _in_library(frame: FrameType) -> bool:
    module = str(frame.f_globals.get("__name__", ""))
    return module.partition(".")[0] in _LIBRARIES


def _collected(
    loop: asyncio.AbstractEventLoop, slot: Slot, close: Close | None, where: str
) -> None:
    # May run in any thread (the cycle collector runs where it is triggered): the slot is
    # given back on its own loop.
    global _said
    if not slot.held:
        return
    if not _said:
        _said = True
        _log.warning(
            "gym_concurrency: a response made at %s was garbage-collected without being read "
            "in full or closed; its slot of the limit is given back now (close responses, "
            "e.g. `async with client.stream(...)`, so that it comes back at once; further "
            "leaks are not logged)",
            where,
        )
    with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits for the slot
        loop.call_soon_threadsafe(functools.partial(slot.release, measured=False))
        if close is not None:
            loop.call_soon_threadsafe(_start_closing, loop, close)


def _start_closing(loop: asyncio.AbstractEventLoop, close: Close) -> None:
    task = loop.create_task(_quietly(close))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _quietly(close: Close) -> None:
    with contextlib.suppress(Exception):  # a connection already broken: nothing to free
        await close()
