"""Instrument names, attribute keys, the allowed value sets and bucket boundaries.

These strings are public API: dashboards and clients depend on them. Each is named once here.
"""

from typing import Final

# Concurrency-limit state, observed at export from every named MeteredSemaphore.
CONCURRENCY_LIMIT_INSTRUMENT: Final = "gym.concurrency.limit"
CONCURRENCY_ACTIVE_INSTRUMENT: Final = "gym.concurrency.active"
CONCURRENCY_AVAILABLE_INSTRUMENT: Final = "gym.concurrency.available"
QUEUE_DEPTH_INSTRUMENT: Final = "gym.concurrency.queue_depth"
ADMISSION_TIMEOUTS_INSTRUMENT: Final = "gym.concurrency.admission_timeouts_total"
ADMISSION_CANCELLED_INSTRUMENT: Final = "gym.concurrency.admission_cancelled_total"
ADMISSION_SHED_INSTRUMENT: Final = "gym.concurrency.admission_shed_total"
# Global limits only: admissions that could not reach the shared limit's store (Redis).
ADMISSION_UNAVAILABLE_INSTRUMENT: Final = "gym.concurrency.admission_unavailable_total"
# Global limits only: leases a process could not renew within the lease (its store was away);
# their work ran on while the store may have granted their slots again.
ADMISSION_LEASE_LOST_INSTRUMENT: Final = "gym.concurrency.admission_lease_lost_total"
# The weight the waiters of a limit ask for (queue_depth counts the waiters).
QUEUED_WEIGHT_INSTRUMENT: Final = "gym.concurrency.queued_weight"
# Per flow of a limit, bounded: its flows under FLOW_ATTRIBUTE, from a bounded vocabulary of
# labels (see observer.set_flow_series_per_limit and set_flow_names_per_limit).
FLOW_HELD_INSTRUMENT: Final = "gym.concurrency.flow.held"
FLOW_QUEUE_DEPTH_INSTRUMENT: Final = "gym.concurrency.flow.queue_depth"
FLOW_QUEUED_WEIGHT_INSTRUMENT: Final = "gym.concurrency.flow.queued_weight"
# Recorded by the middleware for every admission attempt on a limited route.
QUEUE_WAIT_INSTRUMENT: Final = "gym.concurrency.queue_wait_duration_ms"

COMPONENT_ATTRIBUTE: Final = "nemo.gym.concurrency.component"
LIMIT_NAME_ATTRIBUTE: Final = "nemo.gym.concurrency.limit_name"
SERVER_ATTRIBUTE: Final = "nemo.gym.server.name"
# Only on limits shared across processes, with the value GLOBAL_SCOPE; process limits carry none.
SCOPE_ATTRIBUTE: Final = "nemo.gym.concurrency.scope"
GLOBAL_SCOPE: Final = "global"
ADMISSION_OUTCOME_ATTRIBUTE: Final = "nemo.gym.concurrency.admission_outcome"
# The flow instruments' own attribute, from a bounded vocabulary per limit (flow_series.py):
# DEFAULT_FLOW for the default flow (None), a flow's own label (its string, at most
# FLOW_LABEL_MAX_CHARS long) for the first DEFAULT_FLOW_NAMES_PER_LIMIT flows a limit reports,
# RANK_FLOW_PREFIX + "1".."N" for its busiest flows without a name, OTHER_FLOWS for the rest.
FLOW_ATTRIBUTE: Final = "nemo.gym.concurrency.flow"
DEFAULT_FLOW: Final = "default"
OTHER_FLOWS: Final = "other"
RANK_FLOW_PREFIX: Final = "top:"
FLOW_LABEL_MAX_CHARS: Final = 64
DEFAULT_FLOW_SERIES_PER_LIMIT: Final = 5
DEFAULT_FLOW_NAMES_PER_LIMIT: Final = 32
# Flow labels of all limits together, per flow instrument: well under the SDK's default
# cardinality limit (2000 attribute sets per instrument, kept for the life of the process).
FLOW_SERIES_PER_PROCESS: Final = 1000

# "deadline": refused for the request's own deadline (passed, or it cannot be met); "budget":
# the limit's rate budget could not hold it in time; "saturated": its engine did not admit it.
ADMISSION_OUTCOMES: Final = frozenset(
    {"admitted", "timeout", "deadline", "cancelled", "shed", "budget", "saturated"}
)

# A limit's upstream (docs/rate-budgets.md, docs/engine-signals.md), observed at export: its
# budgets by BUDGET_ATTRIBUTE (one of BUDGETS), its engine signal's last reading.
BUDGET_LIMIT_INSTRUMENT: Final = "gym.concurrency.budget.limit"
BUDGET_REMAINING_INSTRUMENT: Final = "gym.concurrency.budget.remaining"
BUDGET_RESERVED_INSTRUMENT: Final = "gym.concurrency.budget.reserved"
BUDGET_REFUNDED_INSTRUMENT: Final = "gym.concurrency.budget.refunded_total"
UPSTREAM_REPORTED_REMAINING_INSTRUMENT: Final = "gym.concurrency.upstream.reported_remaining"
ENGINE_WAITING_INSTRUMENT: Final = "gym.concurrency.engine.waiting"
ENGINE_CACHE_USAGE_INSTRUMENT: Final = "gym.concurrency.engine.cache_usage"
ENGINE_SIGNAL_AGE_INSTRUMENT: Final = "gym.concurrency.engine.signal_age_seconds"
BUDGET_ATTRIBUTE: Final = "nemo.gym.concurrency.budget"
BUDGETS: Final = frozenset({"tokens", "requests", "input_tokens", "output_tokens"})

# Bounded work inside a resources server: verifiers, judges, tools.
QUEUE_DURATION_INSTRUMENT: Final = "gym.resources.operation.queue_duration_ms"
DURATION_INSTRUMENT: Final = "gym.resources.operation.duration_ms"
QUEUED_INSTRUMENT: Final = "gym.resources.operation.queued"
ACTIVE_INSTRUMENT: Final = "gym.resources.operation.active"

OPERATION_ATTRIBUTE: Final = "nemo.gym.resources.operation"
EXECUTOR_ATTRIBUTE: Final = "nemo.gym.resources.executor"
OUTCOME_ATTRIBUTE: Final = "nemo.gym.resources.operation.outcome"

OPERATIONS: Final = frozenset({"verify", "tool", "judge", "other"})
EXECUTORS: Final = frozenset({"inline", "thread", "process", "subprocess", "other"})
OUTCOMES: Final = frozenset({"ok", "error", "timeout", "cancelled", "crashed"})

# Milliseconds: from a fast tool call (1 ms) to a long episode (30 min).
OPERATION_BOUNDARIES_MS: Final[tuple[float, ...]] = (
    1,
    5,
    10,
    50,
    100,
    500,
    1000,
    5000,
    10000,
    30000,
    60000,
    300000,
    1800000,
)

# Outbound calls (gym_concurrency.clients), each with the attributes of the limit they go through.
CLIENT_RETRIES_INSTRUMENT: Final = "gym.concurrency.client.retries"
CLIENT_RETRIES_DENIED_INSTRUMENT: Final = "gym.concurrency.client.retries_denied"
CLIENT_BACKOFF_DURATION_INSTRUMENT: Final = "gym.concurrency.client.backoff_duration_ms"

RETRY_REASON_ATTRIBUTE: Final = "nemo.gym.concurrency.retry_reason"
RETRY_DENIED_REASON_ATTRIBUTE: Final = "nemo.gym.concurrency.retry_denied_reason"
BACKOFF_SOURCE_ATTRIBUTE: Final = "nemo.gym.concurrency.backoff_source"

RETRY_REASONS: Final = frozenset({"status", "connection", "timeout"})
RETRY_DENIED_REASONS: Final = frozenset({"attempts", "budget", "deadline", "retry_after_too_long"})
BACKOFF_SOURCES: Final = frozenset({"retry_after", "backoff"})

METER_NAME: Final = "gym_concurrency"

SLOT_UNIT: Final = "{slot}"  # one unit of weight (a request of weight 1 holds one slot)
WEIGHT_UNIT: Final = "{weight}"
REQUEST_UNIT: Final = "{request}"
OPERATION_UNIT: Final = "{operation}"
RETRY_UNIT: Final = "{retry}"
MILLISECONDS_UNIT: Final = "ms"
SECONDS_UNIT: Final = "s"
RATIO_UNIT: Final = "1"
# A budget counts tokens or requests, as its BUDGET_ATTRIBUTE says ("tokens", "requests", ...).
BUDGET_UNIT: Final = "{token_or_request}"


def check_member(kind: str, value: object, allowed: frozenset[str]) -> str:
    """Return `value` if it is one of `allowed`, else raise ValueError naming `kind` and the set."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"unknown {kind} {value!r}: expected one of {', '.join(sorted(allowed))}")
    return value
