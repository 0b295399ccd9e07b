"""Limits shared across processes and hosts through Redis or Valkey (the `[redis]` extra,
imported only when a limit first connects)."""

from ._checks import RedisUnavailable
from .limit import LeaseLostHook, SharedLimit

__all__ = ["LeaseLostHook", "RedisUnavailable", "SharedLimit"]
