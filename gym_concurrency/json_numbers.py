"""Numbers a client sent in JSON, read so that no value raises or is taken for another.

`loads(text)` is json.loads, except that an integer longer than Python reads from text
(`sys.get_int_max_str_digits()`, 4300 digits by default) is read as its leading digits, still
more than any limit, instead of the whole body failing to parse. `count(value)` reads a parsed
value as a weight: a number >= 1 rounded up, however large; `shown(number)` puts one in a log
line.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

__all__ = ["count", "loads", "shown"]

# What a number past the largest float (1e400, Infinity) counts as: more than any limit holds.
_PAST_EVERY_FLOAT = math.ceil(sys.float_info.max)
_SHOWN_DIGITS = 20


def loads(text: str | bytes) -> Any:
    """`text` parsed as JSON; raises what json.loads raises for text that is not JSON."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeError):
        raise
    except ValueError:  # an integer past Python's digit limit: read again, keeping its lead
        return json.loads(text, parse_int=_leading_digits)


def _leading_digits(digits: str) -> int:
    most = sys.get_int_max_str_digits()  # 0: no limit
    sign = digits.startswith("-")
    if most and len(digits) - sign > most:
        digits = digits[: most + sign]  # as large as Python can read, the same leading digits
    return int(digits)


def count(value: object) -> int | None:
    """`value` (parsed JSON) as a count: a number >= 1, rounded up, however large (one past
    the largest float, Infinity included, counts as more than any limit); None for anything
    else: not a number (a boolean is not one), NaN, or less than 1."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    if not value >= 1:  # NaN too
        return None
    return _PAST_EVERY_FLOAT if math.isinf(value) else math.ceil(value)


def shown(number: int) -> str:
    """`number` for a log line or a message: its digits, or for one of more than 20 digits
    (which Python may refuse to write out) its order of magnitude."""
    if abs(number) < 10**_SHOWN_DIGITS:
        return str(number)
    sign = "-" if number < 0 else ""
    return f"about {sign}10^{math.floor(math.log10(abs(number)))}"
