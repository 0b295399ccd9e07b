"""The one shape of a limit (`Limit`, read as `statistics()`) and its kinds: a process's own
`MeteredSemaphore` and the `SharedLimit` every process naming it shares through Redis."""

from .limit import (
    REFUSALS,
    Admission,
    GlobalStatistics,
    Limit,
    LimitScope,
    LimitStatistics,
    LimitUnavailableError,
    QueueFullError,
    Refusal,
    WaitOutcome,
    wait_in_queue,
)
from .local import MeteredSemaphore
from .registry import registered_limits
from .shared import RedisUnavailable, SharedLimit

__all__ = [
    "REFUSALS",
    "Admission",
    "GlobalStatistics",
    "Limit",
    "LimitScope",
    "LimitStatistics",
    "LimitUnavailableError",
    "MeteredSemaphore",
    "QueueFullError",
    "RedisUnavailable",
    "Refusal",
    "SharedLimit",
    "WaitOutcome",
    "registered_limits",
    "wait_in_queue",
]
