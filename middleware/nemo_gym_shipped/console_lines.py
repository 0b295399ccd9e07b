"""The seed PR's console line for each named limit of this process, written on stderr every
interval when the limit's state changed since its last line, and once more at exit.

    driver [rollout_driver, rollouts] limit=1 active=1 available=0 queue_depth=2
    policy_model [model_server, upstream_requests, policy_model] limit=1 active=1 available=0
        queue_depth=2 admission_timeouts_total=0    (one line)

It reads the limits' plain numbers (`registered_limits()`, as the observer does at export) on
one daemon thread, with no OpenTelemetry SDK: a forked child (NeMo Gym's math_with_judge forks
one per verification) inherits no thread and pays nothing. Limits with the same attributes are
summed into one line, as into one point; `admission_timeouts_total` is shown for limits that
can time out, as the instrument exists only for them.
"""

from __future__ import annotations

import atexit
import sys
import threading
from typing import IO

from gym_concurrency.limits import Limit, registered_limits

__all__ = ["ConsoleLines", "console_line"]

_FIELDS = ("limit", "active", "available", "queue_depth", "admission_timeouts_total")
Label = tuple[str, str, str | None]  # component, limit_name, server


def console_line(label: Label, values: dict[str, int]) -> str:
    """The seed's line: `<server or driver> [<component>, <limit_name>(, <server>)]` and the
    `name=value` fields in the seed's order (a field not in `values` is left out)."""
    component, limit_name, server = label
    names = ", ".join(name for name in (component, limit_name, server) if name is not None)
    fields = " ".join(f"{key}={values[key]}" for key in _FIELDS if key in values)
    return f"{server or 'driver'} [{names}] {fields}"


class ConsoleLines:
    """Writes each limit's changed line to `stream` every `interval` seconds, and at exit."""

    def __init__(self, interval: float, stream: IO[str] | None = None) -> None:
        self._interval = interval
        self._stream = stream
        self._last: dict[Label, str] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gym-concurrency-lines", daemon=True)

    def start(self) -> None:
        """Start the thread, and the last write at exit."""
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the thread, then write what changed since (the limits as the process left them)."""
        self._stopped.set()
        self.write()

    def write(self) -> None:
        """One pass: a line for each limit whose state changed since its last line."""
        with self._lock:
            stream = self._stream or sys.stderr
            for label, values in _states().items():
                line = console_line(label, values)
                if self._last.get(label) != line:
                    self._last[label] = line
                    stream.write(line + "\n")  # one write: a log prefixer sees one line
            stream.flush()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            self.write()


def _states() -> dict[Label, dict[str, int]]:
    """Each label's summed numbers, over the process's named limits."""
    states: dict[Label, dict[str, int]] = {}
    for limit in registered_limits():
        label = (limit.component or "", limit.limit_name or "", limit.server)
        values = states.setdefault(label, dict.fromkeys(_FIELDS[:4], 0))
        for key, value in _reading(limit).items():
            values[key] = values.get(key, 0) + value
    return states


def _reading(limit: Limit) -> dict[str, int]:
    stats = limit.statistics()
    reading = {
        "limit": stats.limit,
        "active": stats.active,
        "available": stats.available,
        "queue_depth": stats.queue_depth,
    }
    if limit.timeout is not None:
        reading["admission_timeouts_total"] = stats.admission_timeouts
    return reading
