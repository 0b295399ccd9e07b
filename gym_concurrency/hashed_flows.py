"""Flows from credentials, never kept raw: a credential (an `authorization` header, an API
key) becomes the flow `"h:"` + the first 16 hex digits of HMAC-SHA256(key, value), the same in
every process holding the same key, so a global limit still sees one flow per credential.

`FlowHasher(key, labels)` turns a value into its id, or into the operator's label for that id
(`{"h:3f...": "team-a"}`). `process_flow_key()` is a key made for this process when none is
configured (said once in the log: processes then hash apart). The id of a credential under a
key, the credential read from stdin (one a line) so it is in no argument list:

    printf '%s\\n' "Bearer $TOKEN" | python -m gym_concurrency.hashed_flows

with the key in GYM_CONCURRENCY_FLOW_KEY.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import sys
import threading
from collections.abc import Mapping
from typing import Final

__all__ = [
    "CREDENTIAL_HEADERS",
    "HASHED_PREFIX",
    "FlowHasher",
    "hashed_flow",
    "process_flow_key",
]

_log = logging.getLogger("gym_concurrency")

# Request headers that carry a credential: a flow read from one is always hashed.
CREDENTIAL_HEADERS: Final = frozenset(
    {"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"}
)
HASHED_PREFIX: Final = "h:"
_HEX_DIGITS: Final = 16  # 64 bits: no two of a deployment's credentials share an id
_KEY_VARIABLE: Final = "GYM_CONCURRENCY_FLOW_KEY"


def hashed_flow(value: str | bytes, key: bytes) -> str:
    """`"h:"` + the first 16 hex digits of HMAC-SHA256(`key`, `value`); text as UTF-8."""
    data = value.encode() if isinstance(value, str) else value
    return HASHED_PREFIX + hmac.new(key, data, hashlib.sha256).hexdigest()[:_HEX_DIGITS]


class FlowHasher:
    """A value's flow id under one key, or the label `labels` gives that id."""

    __slots__ = ("_key", "_labels")

    def __init__(self, key: bytes, labels: Mapping[str, str] | None = None) -> None:
        self._key = key
        self._labels = dict(labels or {})

    def __call__(self, value: str | bytes) -> str:
        flow = hashed_flow(value, self._key)
        return self._labels.get(flow, flow)

    def __repr__(self) -> str:  # never the key
        return f"FlowHasher(key=***, labels={len(self._labels)})"


_made_key: bytes | None = None
_making = threading.Lock()


def process_flow_key() -> bytes:
    """A random key for this process's life, made (and warned of, once) on the first call."""
    global _made_key
    with _making:
        if _made_key is None:
            _made_key = secrets.token_bytes(32)
            _log.warning(
                "gym_concurrency: flow_key is not set: flows from credentials are hashed "
                "with a key made for this process, so a global limit sees one flow per "
                "credential per process and ids change at restart; set %s (one secret "
                "every replica shares)",
                _KEY_VARIABLE,
            )
        return _made_key


def main() -> int:
    """Print the flow id of each line of stdin under the key in GYM_CONCURRENCY_FLOW_KEY."""
    key = os.environ.get(_KEY_VARIABLE)
    if not key:
        print(f"{_KEY_VARIABLE} is not set: the ids depend on the key", file=sys.stderr)
        return 2
    for line in sys.stdin.buffer:
        print(hashed_flow(line.rstrip(b"\r\n"), key.encode()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
