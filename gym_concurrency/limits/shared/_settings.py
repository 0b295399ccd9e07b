"""A shared limit's settings, read back: where it lives in Redis and how it behaves when
Redis is away (state is SharedLimit's own)."""

from __future__ import annotations

from . import scripts
from ._checks import RedisUnavailable
from ._store import RedisStore

__all__ = ["SettingsMixin"]


class SettingsMixin:
    """SharedLimit's read-only settings."""

    _key: str
    _store: RedisStore
    _lease_seconds: float
    _mode: RedisUnavailable
    _local_max: int | None

    @property
    def key(self) -> str:
        """The name every process sharing this limit uses (default: `component/server/
        limit_name`, those given)."""
        return self._key

    @property
    def redis_keys(self) -> dict[str, str]:
        """The Redis keys of this limit by role (mailboxes are `mailbox_prefix` + process)."""
        return dict(zip(scripts.KEY_NAMES, self._store.keys, strict=True))

    @property
    def mailbox_prefix(self) -> str:
        """The common prefix of this limit's per-process mailbox keys."""
        return self._store.mailbox_prefix

    @property
    def lease_seconds(self) -> float:
        """How long a lease outlives its process's last heartbeat."""
        return self._lease_seconds

    @property
    def redis_unavailable(self) -> RedisUnavailable:
        """What an admission does when Redis cannot be reached: "refuse" or "local"."""
        return self._mode

    @property
    def local_max_concurrent(self) -> int | None:
        """Slots of the process-local fallback ("local" mode), else None."""
        return self._local_max
