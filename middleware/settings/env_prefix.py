"""Environment variables that look like settings under a misspelt prefix (`GYM_CONCURENCY_ROUTES`):
read by nothing, so they are warned about where the settings are read from the environment.

A name is one when its start is one or two edits (a letter inserted, left out or replaced) from
the prefix, compared without regard to case as the settings reader compares it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

__all__ = ["misspelt_prefix", "warn_misspelt_prefixes"]

_log = logging.getLogger(__name__)
_MAX_EDITS = 2


def misspelt_prefix(name: str, prefix: str, settings: Iterable[str] = ()) -> str | None:
    """The name `name` was likely meant to be (`prefix` + the rest), if its start is 1 or 2
    edits from `prefix`; None for any other name (and for one that starts with `prefix`).
    `settings` (the names after the prefix) tells where the prefix ends when that is unclear."""
    upper, prefix = name.upper(), prefix.upper()
    if not prefix or upper.startswith(prefix) or len(upper) < len(prefix) - _MAX_EDITS:
        return None
    start = upper[: len(prefix) + _MAX_EDITS]
    # Two edits change at most two of three pieces of the prefix: one is in `start` as it is.
    step = -(-len(prefix) // (_MAX_EDITS + 1))
    if not any(prefix[i : i + step] in start for i in range(0, len(prefix), step)):
        return None
    known = tuple(setting.upper() for setting in settings)
    distances = _distances_to_starts(prefix, start)
    if distances is None:
        return None
    # Where the prefix ends: the fewest edits, then a known setting after it, then ending as
    # the prefix ends ("_"), then nearest the prefix's own length.
    candidates = [
        (
            edits,
            not upper[end:].startswith(known),
            upper[end - 1 : end] != prefix[-1:],
            abs(end - len(prefix)),
            end,
        )
        for end, edits in enumerate(distances)
        if 1 <= edits <= _MAX_EDITS and 0 < end < len(upper)  # a setting's name follows
    ]
    if not candidates:
        return None
    end = min(candidates)[-1]
    return prefix + upper[end:]


def warn_misspelt_prefixes(names: Iterable[str], prefix: str, settings: Iterable[str]) -> None:
    """Log a warning for each of `names` (environment variable names) that is `prefix`
    misspelt, naming the variable and the name it was likely meant to be."""
    settings = tuple(settings)
    for name in names:
        meant = misspelt_prefix(name, prefix, settings)
        if meant is not None:
            _log.warning(
                "gym_concurrency: the environment variable %s is not read: its prefix looks "
                "like a misspelling of %s (did you mean %s?)",
                name,
                prefix,
                meant,
            )


def _distances_to_starts(word: str, text: str) -> list[int] | None:
    """Levenshtein distance from `word` to each start of `text` (item j: to `text[:j]`), or
    None as soon as every one is more than _MAX_EDITS (most names: after a few letters)."""
    row = list(range(len(text) + 1))  # from "" to each start
    for i, letter in enumerate(word, 1):
        previous, row = row, [i]
        for j, other in enumerate(text, 1):
            row.append(min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (letter != other)))
        if min(row) > _MAX_EDITS:
            return None
    return row
