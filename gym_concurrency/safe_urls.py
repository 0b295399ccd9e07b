"""URLs fit for a log line or an error: every password and token masked, in the userinfo
(`redis://user:***@host`) and in the query or fragment (`?sentinel_password=***`,
`&access_token=***`), the rest as it was written."""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote, urlsplit

__all__ = ["safe_url"]

MASK: Final = "***"
# A query parameter carries a secret when its name (case-insensitive) says so.
_SECRET_NAME = re.compile(
    r"pass|pwd|secret|token|auth|credential|signature|api[-_]?key|access[-_]?key|private",
    re.IGNORECASE,
)
_SECRET_EXACT = frozenset({"key", "sig", "code"})  # short names that are secrets too
_USERINFO = re.compile(r"^([^:/?#]*://[^:@/?#]*):[^@/?#]*@")  # for a URL urlsplit refuses


def safe_url(url: str) -> str:
    """`url` with the password of its userinfo and the value of every query (or fragment)
    parameter named for a secret replaced by `***`."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL (a bad port, a broken IPv6 address): mask what looks it
        return _masked_params(_USERINFO.sub(rf"\1:{MASK}@", url))
    if password is not None:  # (the netloc is the first text with its "@")
        userinfo, _, host = parts.netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        url = url.replace(parts.netloc, f"{user}:{MASK}@{host}", 1)
    return _masked_params(url)


def _masked_params(url: str) -> str:
    """`url` with the values of its secret query and fragment parameters masked."""
    start = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=-1)
    if start < 0:
        return url
    pieces = re.split(r"([?#&;])", url[start:])  # the separators kept, in place
    return url[:start] + "".join(_masked_param(piece) for piece in pieces)


def _masked_param(piece: str) -> str:
    name, equals, value = piece.partition("=")
    if not equals or not value or not _secret(unquote(name)):
        return piece
    return f"{name}={MASK}"


def _secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name)) or name.lower() in _SECRET_EXACT
