"""The arguments of a SharedLimit that no other kind of limit has, checked: each error names
the argument and what it got."""

from __future__ import annotations

from typing import Literal, get_args

from .._base import check_count

__all__ = ["RedisUnavailable", "check_key", "check_mode", "check_name", "check_url"]

RedisUnavailable = Literal["refuse", "local"]


def check_url(url: object) -> None:
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(
            f"SharedLimit redis_url must be a redis://, rediss:// or unix:// URL, got {url!r}"
        )


def check_name(name: str, value: object) -> None:
    if not isinstance(value, str) or not value or any(c in value for c in "{}"):
        raise ValueError(
            f"SharedLimit {name} must be a non-empty string without braces, got {value!r}"
        )


def check_key(key: str | None, limit_name: str | None) -> str:
    """The name every process shares: `key`, else `limit_name`; ValueError if neither."""
    shared_key = key if key is not None else limit_name
    if shared_key is None:
        raise ValueError("SharedLimit needs limit_name or key: the name every process shares")
    check_name("key" if key is not None else "limit_name", shared_key)
    return shared_key


def check_mode(mode: object, local_max_concurrent: object) -> None:
    if mode not in get_args(RedisUnavailable):
        raise ValueError(f"SharedLimit redis_unavailable must be 'refuse' or 'local', got {mode!r}")
    if mode == "local":
        if local_max_concurrent is None:
            raise ValueError(
                "SharedLimit local_max_concurrent is required with redis_unavailable='local'"
            )
        check_count("SharedLimit", "local_max_concurrent", local_max_concurrent)
    elif local_max_concurrent is not None:
        raise ValueError(
            "SharedLimit local_max_concurrent applies only with redis_unavailable='local'"
            f", got {local_max_concurrent!r} with redis_unavailable={mode!r}"
        )
