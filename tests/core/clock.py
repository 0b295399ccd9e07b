"""An event loop for state machines: its clock moves only when the test moves it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator


class ManualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose time only moves when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now


def started_at(now: float) -> Iterator[ManualClockLoop]:
    """A fixture's body: a ManualClockLoop reading `now`, its tasks cancelled and the loop
    closed when the test ends."""
    loop = ManualClockLoop()
    loop.now = now
    yield loop
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()


def spin(loop: ManualClockLoop) -> None:
    """Run what is ready, and what that makes ready, a few turns: the clock stays."""
    for _ in range(5):
        loop.run_until_complete(asyncio.sleep(0))
