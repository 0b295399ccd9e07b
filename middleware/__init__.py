"""ASGI and FastAPI integration layer for gym_concurrency (installed as gym_concurrency.middleware).

Per-route admission with documented failure responses (`ConcurrencyLimitMiddleware`), its
settings (`ConcurrencySettings`, `RouteLimit`, `OperationLimit`), and dependency handles that
put verifier / judge / tool work under a metered limit (`operation_limit`), and a live
status view of every limit (`ConcurrencyStatusView`).
"""

from .admission import ConcurrencyLimitMiddleware, concurrency_middleware, reload_settings
from .dependencies import OperationHandle, operation_limit
from .settings import AdaptiveLimit, ConcurrencySettings, OperationLimit, RouteLimit
from .status import ConcurrencyStatusView, status_snapshot

__all__ = [
    "AdaptiveLimit",
    "ConcurrencyLimitMiddleware",
    "ConcurrencySettings",
    "ConcurrencyStatusView",
    "OperationHandle",
    "OperationLimit",
    "RouteLimit",
    "concurrency_middleware",
    "operation_limit",
    "reload_settings",
    "status_snapshot",
]
