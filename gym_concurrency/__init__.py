"""Visible, bounded and honest concurrency limits, reported through OpenTelemetry.

`MeteredSemaphore` (a process's own) and `SharedLimit` (one limit across processes, on Redis)
are the kinds of `Limit`; the observer exports every named limit at collection time, and
`resources_operation` times limited work by queue wait, run time and outcome. Only the
OpenTelemetry API is needed; an application sets up the SDK (redis only for a SharedLimit
that connects).
"""

from .limits import (
    Limit,
    LimitStatistics,
    LimitUnavailableError,
    MeteredSemaphore,
    QueueFullError,
    SharedLimit,
)
from .names import (
    ACTIVE_INSTRUMENT,
    ADMISSION_CANCELLED_INSTRUMENT,
    ADMISSION_OUTCOME_ATTRIBUTE,
    ADMISSION_OUTCOMES,
    ADMISSION_SHED_INSTRUMENT,
    ADMISSION_TIMEOUTS_INSTRUMENT,
    COMPONENT_ATTRIBUTE,
    CONCURRENCY_ACTIVE_INSTRUMENT,
    CONCURRENCY_AVAILABLE_INSTRUMENT,
    CONCURRENCY_LIMIT_INSTRUMENT,
    DURATION_INSTRUMENT,
    EXECUTOR_ATTRIBUTE,
    EXECUTORS,
    LIMIT_NAME_ATTRIBUTE,
    OPERATION_ATTRIBUTE,
    OPERATION_BOUNDARIES_MS,
    OPERATIONS,
    OUTCOME_ATTRIBUTE,
    OUTCOMES,
    QUEUE_DEPTH_INSTRUMENT,
    QUEUE_DURATION_INSTRUMENT,
    QUEUE_WAIT_INSTRUMENT,
    QUEUED_INSTRUMENT,
    SERVER_ATTRIBUTE,
)
from .observer import observe_concurrency
from .operations import ResourcesOperation, resources_operation

__all__ = [
    "ACTIVE_INSTRUMENT",
    "ADMISSION_CANCELLED_INSTRUMENT",
    "ADMISSION_OUTCOMES",
    "ADMISSION_OUTCOME_ATTRIBUTE",
    "ADMISSION_SHED_INSTRUMENT",
    "ADMISSION_TIMEOUTS_INSTRUMENT",
    "COMPONENT_ATTRIBUTE",
    "CONCURRENCY_ACTIVE_INSTRUMENT",
    "CONCURRENCY_AVAILABLE_INSTRUMENT",
    "CONCURRENCY_LIMIT_INSTRUMENT",
    "DURATION_INSTRUMENT",
    "EXECUTORS",
    "EXECUTOR_ATTRIBUTE",
    "LIMIT_NAME_ATTRIBUTE",
    "OPERATIONS",
    "OPERATION_ATTRIBUTE",
    "OPERATION_BOUNDARIES_MS",
    "OUTCOMES",
    "OUTCOME_ATTRIBUTE",
    "QUEUED_INSTRUMENT",
    "QUEUE_DEPTH_INSTRUMENT",
    "QUEUE_DURATION_INSTRUMENT",
    "QUEUE_WAIT_INSTRUMENT",
    "SERVER_ATTRIBUTE",
    "Limit",
    "LimitStatistics",
    "LimitUnavailableError",
    "MeteredSemaphore",
    "QueueFullError",
    "ResourcesOperation",
    "SharedLimit",
    "observe_concurrency",
    "resources_operation",
]
