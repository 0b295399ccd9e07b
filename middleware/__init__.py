"""ASGI and FastAPI integration layer for gym_concurrency (installed as gym_concurrency.middleware).

Per-route admission with documented failure responses (`ConcurrencyLimitMiddleware`), its
settings (`ConcurrencySettings`, `RouteLimit`, `OperationLimit`, `ClientLimit`), dependency
handles that put verifier / judge / tool work under a metered limit (`operation_limit`), the
configured limits on the calls the server makes (`limited_client`), and a live status view of
every limit (`ConcurrencyStatusView`).
"""

from .admission import ConcurrencyLimitMiddleware
from .clients import LimitedClient
from .dependencies import OperationHandle, operation_limit
from .running import concurrency_middleware, limited_client, reload_settings
from .settings import (
    AdaptiveLimit,
    ClientLimit,
    ClientRetry,
    ConcurrencySettings,
    EngineSignalSettings,
    OperationLimit,
    RouteLimit,
)
from .status import ConcurrencyStatusView, status_snapshot

__all__ = [
    "AdaptiveLimit",
    "ClientLimit",
    "ClientRetry",
    "ConcurrencyLimitMiddleware",
    "ConcurrencySettings",
    "ConcurrencyStatusView",
    "EngineSignalSettings",
    "LimitedClient",
    "OperationHandle",
    "OperationLimit",
    "RouteLimit",
    "concurrency_middleware",
    "limited_client",
    "operation_limit",
    "reload_settings",
    "status_snapshot",
]
