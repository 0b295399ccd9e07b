"""What to limit, how hard, and how to fail: the settings models, read from keyword arguments,
`GYM_CONCURRENCY_*` environment variables or a YAML / JSON file (`ConcurrencySettings.from_file`);
keyword arguments win over the environment, the environment over the file."""

from .environment import EnvironmentSettingsError
from .models import (
    DEFAULT_MAX_QUEUED_BODY_BYTES,
    DEFAULT_MAX_QUEUED_BODY_BYTES_TOTAL,
    DEFAULT_REFUSAL_BODY_TIMEOUT_SECONDS,
    AdaptiveLimit,
    ConcurrencySettings,
    FailureProfile,
    OperationLimit,
    RouteLimit,
)

__all__ = [
    "DEFAULT_MAX_QUEUED_BODY_BYTES",
    "DEFAULT_MAX_QUEUED_BODY_BYTES_TOTAL",
    "DEFAULT_REFUSAL_BODY_TIMEOUT_SECONDS",
    "AdaptiveLimit",
    "ConcurrencySettings",
    "EnvironmentSettingsError",
    "FailureProfile",
    "OperationLimit",
    "RouteLimit",
]
