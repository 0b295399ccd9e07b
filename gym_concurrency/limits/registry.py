"""The process's named limits, held weakly: a collected limit drops out by itself.

Limits register here and know nothing of telemetry; the observer and the status view read
`registered_limits()`. A watcher (the observer) is told of the first registration, so that
instruments are made only once there is something to report.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .limit import Limit

__all__ = ["register", "registered_limits", "watch"]

# id(limit) -> weak reference. A plain dict, so that a snapshot taken on an exporter's thread
# (`list(values())`) is atomic while the event loop registers more.
_REGISTRY: dict[int, weakref.ref[Limit]] = {}
_watchers: list[Callable[[Limit], None]] = []


def register(limit: Limit) -> None:
    """Keep `limit` (it has a component and a limit_name) listed until it is collected."""
    ident = id(limit)

    def forget(ref: weakref.ref[Limit]) -> None:
        if _REGISTRY.get(ident) is ref:
            _REGISTRY.pop(ident, None)

    _REGISTRY[ident] = weakref.ref(limit, forget)
    for watcher in list(_watchers):
        watcher(limit)


def registered_limits() -> list[Limit]:
    """The named limits alive now (of every kind), in registration order."""
    return [limit for ref in list(_REGISTRY.values()) if (limit := ref()) is not None]


def watch(watcher: Callable[[Limit], None]) -> None:
    """Call `watcher(limit)` for every limit registered from now on."""
    _watchers.append(watcher)
