"""The failure bodies documented in docs/failure-responses.md, for comparing with real ones."""

from __future__ import annotations

import json
import re
from typing import Any

from demo_processes import REPO

FAILURE_DOC = REPO / "docs" / "failure-responses.md"
# Values that come from the request or the route, not from the profile: any value matches.
_VARYING_KEYS = frozenset({"episode_id", "task_id", "detail", "message", "limit_name"})


def documented_bodies() -> list[dict[str, Any]]:
    """Every JSON object in a ```json block of the failure-responses doc."""
    assert FAILURE_DOC.is_file(), f"{FAILURE_DOC} is missing: it documents the failure bodies"
    text = FAILURE_DOC.read_text(encoding="utf-8")
    bodies = []
    for block in re.findall(r"```json\s*\n(.*?)```", text, flags=re.DOTALL):
        try:
            value = json.loads(block)
        except ValueError:
            continue
        if isinstance(value, dict):
            bodies.append(value)
    return bodies


def same_shape(documented: Any, actual: Any) -> bool:
    """Same keys at every level, and the same values except where they vary per request."""
    if isinstance(documented, dict):
        return (
            isinstance(actual, dict)
            and documented.keys() == actual.keys()
            and all(
                key in _VARYING_KEYS or same_shape(documented[key], actual[key])
                for key in documented
            )
        )
    return bool(documented == actual)


def matching_documented_body(actual: dict[str, Any]) -> dict[str, Any] | None:
    """The documented body `actual` matches, or None."""
    return next((doc for doc in documented_bodies() if same_shape(doc, actual)), None)
