"""Numbers out of a Prometheus text exposition (format 0.0.4, what vLLM, SGLang and
TensorRT-LLM serve at /metrics): the samples of a few named metrics, never an exception.

The format is line oriented: `# HELP` / `# TYPE` lines and other comments are skipped; a sample
is `name{label="value",...} value [timestamp]`, tokens apart by blanks or tabs, label values
escaped (`\\\\`, `\\"`, `\\n`), the value a Go float (`NaN`, `+Inf`, `-Inf` too). A body must
end with a line feed: a last line without one was cut short and is not read, so a truncated
`12.0` can never be read as `1`. A line that breaks the format is skipped alone. Only the
samples of the names asked for are kept, so what is held stays in proportion to them, and a
body over `max_bytes` is refused whole (read nothing).

OpenMetrics' quoted UTF-8 names (`{"my.metric",a="b"} 1`) are not read (their lines are
skipped); no engine this reads serves them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_MAX_BYTES", "Sample", "read_samples", "usable"]

DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024
"""A vLLM /metrics of one model is ~50-150 KB; per-engine and LoRA series multiply that."""

_NAME = re.compile(r"[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)")
# One label pair and the comma after it (none before "}"). A value is a run of anything
# but a quote, a backslash or a line feed, or a backslash and the character it escapes:
# unambiguous, so the match is linear in the line.
_LABEL = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(?:,|(?=\}))'
)
_CLOSE = re.compile(r"[ \t]*\}")
_OPEN = re.compile(r"[ \t]*\{")
_VALUE = re.compile(r"[ \t]+([^ \t\r]+)(?:[ \t]+-?[0-9]+)?[ \t]*\r?$")
# What Go's strconv.ParseFloat takes in an exposition, ASCII only: Python's float() would also
# take "1_000", non-ASCII digits and surrounding spaces.
_FLOAT = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan)",
    re.IGNORECASE,
)
_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of a metric: its labels (name -> unescaped value) and its value."""

    labels: dict[str, str]
    value: float

    def has(self, labels: Collection[tuple[str, str]]) -> bool:
        """True if every (name, value) of `labels` is among this sample's labels."""
        return all(self.labels.get(name) == value for name, value in labels)


def read_samples(
    body: bytes | str, names: Collection[str], max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, list[Sample]] | None:
    """The samples of each of `names` in `body`, in order (a name absent: no key); None if
    `body` is over `max_bytes` long. Never raises on what `body` holds."""
    if len(body) > max_bytes:
        return None
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    wanted = frozenset(names)
    found: dict[str, list[Sample]] = {}
    for line in _complete_lines(text):
        named = _NAME.match(line)
        if named is None or named[1] not in wanted:
            continue  # a comment, a blank line, another metric, or not a sample at all
        sample = _sample(line, named.end())
        if sample is not None:
            found.setdefault(named[1], []).append(sample)
    return found


def _complete_lines(text: str) -> Iterator[str]:
    """The lines of `text` that end with a line feed (a last line without one was cut)."""
    start = 0
    while (end := text.find("\n", start)) >= 0:
        yield text[start:end]
        start = end + 1


def _sample(line: str, at: int) -> Sample | None:
    """The labels and value of a sample line whose name ends at `at`; None if malformed."""
    labels: dict[str, str] = {}
    if (brace := _OPEN.match(line, at)) is not None:
        at = brace.end()
        while (close := _CLOSE.match(line, at)) is None:
            pair = _LABEL.match(line, at)
            if pair is None:
                return None
            labels[pair[1]] = _ESCAPE.sub(_unescape, pair[2])
            at = pair.end()
        at = close.end()
    value = _VALUE.match(line, at)
    if value is None or _FLOAT.fullmatch(value[1]) is None:
        return None
    return Sample(labels, float(value[1]))


def _unescape(match: re.Match[str]) -> str:
    return _ESCAPED.get(match[1], match[0])  # an unknown escape stays as written


def usable(value: float) -> bool:
    """A gauge of a count or a fraction: not NaN, not negative (+Inf is: it means full)."""
    return not math.isnan(value) and value >= 0
