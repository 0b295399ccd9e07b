"""The limits of a running app: its ConcurrencyLimitMiddleware, a settings reload, and its
configured client limits, found from the app itself (a Starlette / FastAPI app whose
middleware has started)."""

from __future__ import annotations

from typing import Any

from .admission import STATE_ATTRIBUTE, ConcurrencyLimitMiddleware
from .clients import LimitedClient
from .settings import ConcurrencySettings

__all__ = ["concurrency_middleware", "limited_client", "reload_settings"]


def concurrency_middleware(app: Any) -> ConcurrencyLimitMiddleware:
    """The ConcurrencyLimitMiddleware limiting `app` (a Starlette / FastAPI app), once it has
    started (lifespan startup, or the first request without lifespan)."""
    middleware = getattr(getattr(app, "state", None), STATE_ATTRIBUTE, None)
    if not isinstance(middleware, ConcurrencyLimitMiddleware):
        raise LookupError(
            "no running ConcurrencyLimitMiddleware on this app: add it with "
            "app.add_middleware(ConcurrencyLimitMiddleware, ...); it is found once the app "
            "has started (lifespan startup, or its first request)"
        )
    return middleware


def reload_settings(app: Any, settings: ConcurrencySettings) -> list[str]:
    """Apply `settings` to the ConcurrencyLimitMiddleware of `app` (see its `reload`)."""
    return concurrency_middleware(app).reload(settings)


def limited_client(app: Any, limit_name: str) -> LimitedClient:
    """The configured client limit `limit_name` of `app`'s ConcurrencyLimitMiddleware (once the
    app has started: in its lifespan, or in a route); KeyError naming the configured ones."""
    return concurrency_middleware(app).limits.client(limit_name)
