"""An event loop for state machines: its clock moves only when the test moves it."""

from __future__ import annotations

import asyncio


class ManualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose time only moves when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now
