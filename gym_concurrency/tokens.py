"""Pricing a call in tokens: the weight of an OpenAI-style request body, as
`RouteLimit.weight="openai_tokens"` and the outbound clients' `weight=openai_tokens` read it.

The prompt's characters / 4 (rounded up: about four characters a token in English text) plus
the output it may produce: `max_completion_tokens`, else `max_tokens`, else
`max_output_tokens` (the Responses API), else `default_output_tokens`. The prompt is every
string under `messages` (chat), `prompt` (completions) or `input` (responses), however deep.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_OUTPUT_TOKENS", "OUTPUT_TOKEN_FIELDS", "PROMPT_FIELDS", "openai_tokens"]

DEFAULT_OUTPUT_TOKENS = 1024
PROMPT_FIELDS = ("messages", "prompt", "input")
OUTPUT_TOKEN_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_CHARACTERS_PER_TOKEN = 4


def openai_tokens(body: object, *, default_output_tokens: int = DEFAULT_OUTPUT_TOKENS) -> int:
    """The tokens an OpenAI-style request `body` (its parsed JSON) may cost: its prompt's
    characters / 4, rounded up, plus its output bound; at least 1, and however large (the
    caller caps it at its limit). A body that is not an object, or a bound that is not a
    positive int, counts as missing."""
    if not isinstance(body, Mapping):
        return max(1, default_output_tokens)
    characters = sum(_characters(body.get(field)) for field in PROMPT_FIELDS)
    output = next((b for b in map(body.get, OUTPUT_TOKEN_FIELDS) if _is_count(b)), None)
    if output is None:
        output = default_output_tokens
    return max(1, math.ceil(characters / _CHARACTERS_PER_TOKEN) + output)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _characters(value: Any, depth: int = 0) -> int:
    """The characters of every string in `value` (lists and objects walked, 32 levels)."""
    if isinstance(value, str):
        return len(value)
    if depth >= 32:
        return 0
    if isinstance(value, Mapping):
        return sum(_characters(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return sum(_characters(v, depth + 1) for v in value)
    return 0
