"""What a caller asks of a limit, checked at the call: a weight, an estimate of tokens, and a
release of what it holds. Each error names the limit and what was wrong."""

from __future__ import annotations

from collections.abc import Callable, Hashable

__all__ = ["check_tokens", "check_weight", "not_held"]


def check_weight(
    owner: str, describe: Callable[[], str], weight: object, limit: int | None
) -> None:
    """`weight` as an ask of the limit `describe()` names: an int >= 1 (TypeError /
    ValueError), no more than `limit` (None: unchecked) unless 1, which waits on a limit of 0
    as ever: more could never be admitted (ValueError)."""
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise TypeError(f"{owner} weight must be an int, got {weight!r}")
    if weight < 1:
        raise ValueError(f"{owner} weight must be >= 1, got {weight}")
    if limit is not None and weight > limit and weight != 1:
        raise ValueError(
            f"{describe()}: weight {weight} is more than the limit {limit}; "
            "it could never be admitted"
        )


def check_tokens(owner: str, tokens: object) -> int:
    """`tokens` (an estimate of an upstream's tokens) as an int >= 0; TypeError / ValueError
    naming it otherwise."""
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise TypeError(f"{owner} tokens must be an int, got {tokens!r}")
    if tokens < 0:
        raise ValueError(f"{owner} tokens must be >= 0, got {tokens}")
    return tokens


def not_held(describe: str, weight: int, flow: Hashable, held: int) -> ValueError:
    """The error for a release of `weight` by `flow`, which holds `held`."""
    if flow is None and weight == 1 and held <= 0:
        return ValueError(f"{describe} released with no slot held")
    return ValueError(f"{describe} released weight {weight} for flow {flow!r}, which holds {held}")
