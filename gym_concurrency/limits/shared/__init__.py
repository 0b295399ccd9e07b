"""Limits shared across processes and hosts through Redis or Valkey (the `[redis]` extra,
imported only when a limit first connects)."""

from .limit import RedisUnavailable, SharedLimit

__all__ = ["RedisUnavailable", "SharedLimit"]
