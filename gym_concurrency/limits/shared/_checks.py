"""The arguments of a SharedLimit that no other kind of limit has, checked: each error names
the argument and what it got."""

from __future__ import annotations

from typing import Final, Literal, get_args

from ...safe_urls import safe_url
from .._base import check_count, check_seconds
from ..backfill import check_backfill_seconds
from ._connection import SCHEMES, sentinel_parts

__all__ = [
    "MAX_FLOW_LENGTH",
    "RedisUnavailable",
    "check_ask",
    "check_backfill",
    "check_key",
    "check_mode",
    "check_name",
    "check_timing",
    "check_url",
]

RedisUnavailable = Literal["refuse", "local"]


MAX_FLOW_LENGTH: Final = 256


def check_ask(describe: str, weight: int, flow: object, limit: int | None) -> str | None:
    """ValueError for a weight that is not an int >= 1 or (`limit` given) more than it, or
    for a flow that is neither None nor a string Redis can order (no NUL, at most
    MAX_FLOW_LENGTH characters): a flow is named the same in every process. Returns the
    flow."""
    name = flow if flow is None or isinstance(flow, str) else "\0"
    if name is not None and ("\0" in name or len(name) > MAX_FLOW_LENGTH):
        raise ValueError(
            f"{describe}: a global limit's flow is None or a string of at most "
            f"{MAX_FLOW_LENGTH} characters without NUL (the same name in every process); "
            f"got flow={flow!r:.300}"
        )
    check_count("SharedLimit", "weight", weight, minimum=1)
    if limit is not None and weight > limit and weight != 1:
        raise ValueError(
            f"{describe}: weight {weight} is more than the limit {limit}; it could never be "
            "admitted"
        )
    return name


def check_url(url: object) -> None:
    """A URL `_connection.Connection` can use; the error shows it without its password."""
    if not isinstance(url, str) or not url.startswith(SCHEMES):
        shown = safe_url(url) if isinstance(url, str) else repr(url)
        raise ValueError(
            "SharedLimit redis_url must be a redis://, rediss://, unix://, redis+sentinel:// "
            f"or redis+cluster:// URL, got {shown}"
        )
    if url.startswith("redis+sentinel://"):
        sentinel_parts(url)  # raises for a URL without a service name


def check_name(name: str, value: object) -> None:
    if not isinstance(value, str) or not value or any(c in value for c in "{}"):
        raise ValueError(
            f"SharedLimit {name} must be a non-empty string without braces, got {value!r}"
        )


def check_key(
    key: str | None, component: str | None, server: str | None, limit_name: str | None
) -> str:
    """The name every process shares: `key`, else `component/server/limit_name` (those
    given), so that two deployments never share a limit by accident; ValueError if neither."""
    if key is not None:
        check_name("key", key)
        return key
    if limit_name is None:
        raise ValueError("SharedLimit needs limit_name or key: the name every process shares")
    parts = {"component": component, "server": server, "limit_name": limit_name}
    for name, part in parts.items():
        if part is not None:
            check_name(name, part)
    return "/".join(part for part in parts.values() if part is not None)


def check_backfill(owner: str, backfill_seconds: object, budget: object) -> float:
    """`backfill_seconds` as seconds (TypeError / ValueError as a MeteredSemaphore's); more
    than 0 needs a `budget`: only the budgets' hold on the oldest waiter is ever passed."""
    seconds = check_backfill_seconds(owner, backfill_seconds)
    if seconds and budget is None:
        raise ValueError(
            f"{owner} backfill_seconds={seconds} needs a budget: a global limit's oldest "
            "waiter is passed only while the rate budgets alone hold it back"
        )
    return seconds


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


def check_timing(lease_seconds: float, redis_timeout: float) -> None:
    """Both numbers of seconds, and a Redis call's timeout shorter than a lease."""
    check_seconds("SharedLimit", "lease_seconds", lease_seconds)
    check_seconds("SharedLimit", "redis_timeout", redis_timeout)
    if redis_timeout >= lease_seconds:
        raise ValueError(
            f"SharedLimit redis_timeout must be less than lease_seconds, got "
            f"redis_timeout={redis_timeout} with lease_seconds={lease_seconds}"
        )


def check_engine(engine: object) -> None:
    """TypeError unless `engine` is None or an EngineSignal."""
    from ...engines.signal import EngineSignal

    if engine is not None and not isinstance(engine, EngineSignal):
        raise TypeError(f"SharedLimit engine must be an EngineSignal, got {engine!r}")
