"""Settlement: one call's reservation of a rate budget, closed from its response body as the
body passes (usage.py reads it), exactly once.

`start(content_type)` when the response's headers come, `feed(piece)` for each piece of its
body, then one of: `end()` (the body ended in full: settled to the usage it reported, or
charged in full without one), `abort()` (no whole body: an error, a client gone, a stream cut
short; charged in full, as it may have cost it all) or `cancel()` (never sent: everything
back). Later calls do nothing. A streamed body (`text/event-stream`) is read piece by piece
(at most one event kept); any other is kept up to `MAX_EVENT_BYTES` to be parsed at its end
(a longer one is not read: charged in full). A body sent with `Content-Encoding` gzip or
deflate is read decompressed (a piece at most 1 MiB once inflated, the body at most
`MAX_INFLATION` times its compressed size and 1 MiB more); any other encoding is not read
(charged in full). Plain numbers and no await: a transport or the middleware calls it
inline.
"""

from __future__ import annotations

import zlib
from typing import Any

from .upstream_view import UpstreamBudget
from .usage import MAX_EVENT_BYTES, StreamedUsage, Usage, usage_from_json

__all__ = ["MAX_INFLATION", "Settlement"]

MAX_INFLATION = 200  # what a compressed body may inflate to, times its size (an SSE stream: ~45x)


class Settlement:
    """The reservation of one call on `budget`, settled from its response (see the module)."""

    __slots__ = (
        "_body",
        "_budget",
        "_inflate",
        "_inflated_room",
        "_over",
        "_reservation",
        "_stream",
    )

    def __init__(self, budget: UpstreamBudget, reservation: Any) -> None:
        """`reservation`: what `budget` handed the admission (a Reservation, or a shared
        limit's), open."""
        self._budget = budget
        self._reservation: Any = reservation
        self._stream: StreamedUsage | None = None
        self._body = bytearray()
        self._over = False  # the body is longer than a usage is read from (or unreadable)
        self._inflate: zlib._Decompress | None = None  # a compressed body's decompressor
        self._inflated_room = MAX_EVENT_BYTES  # more a compressed body may inflate to (below)

    @property
    def open(self) -> bool:
        """Not settled, charged in full nor cancelled yet."""
        return self._reservation is not None

    def start(self, content_type: str | None, content_encoding: str | None = None) -> None:
        """The response's headers came, saying its content type and encoding (None: none)."""
        if content_type is not None and "text/event-stream" in content_type.lower():
            self._stream = StreamedUsage()
        encoding = (content_encoding or "identity").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header
        elif encoding != "identity":
            self._over = True
            self._stream = None

    def feed(self, piece: bytes) -> None:
        """The next piece of the response body, as it passes."""
        if self._reservation is None or not piece or (self._over and self._stream is None):
            return
        if self._inflate is not None:
            piece = self._inflated(piece)
        if self._stream is not None:
            self._stream.feed(piece)
        elif not self._over:
            if len(self._body) + len(piece) > MAX_EVENT_BYTES:
                self._over = True
                self._body.clear()
            else:
                self._body += piece

    def end(self) -> Usage | None:
        """The body ended in full: settle to its usage (None: charged in full); the usage."""
        usage = self._usage()
        reservation = self._take()
        if reservation is not None:
            if usage is None:
                self._budget.charge_in_full(reservation)
            else:
                self._budget.settle(reservation, usage)
        return usage

    def abort(self) -> None:
        """The call ended without a whole body: charged in full."""
        reservation = self._take()
        if reservation is not None:
            self._budget.charge_in_full(reservation)

    def cancel(self) -> None:
        """The call was never sent: every estimate and its request come back."""
        reservation = self._take()
        if reservation is not None:
            self._budget.cancel(reservation)

    def _inflated(self, piece: bytes) -> bytes:
        """`piece` decompressed; past the bounds or broken, nothing more of the body is read.
        Bounds: a piece inflates to `MAX_EVENT_BYTES` at most, and the body to
        `MAX_INFLATION` times what came compressed, plus `MAX_EVENT_BYTES` (reading what it
        inflates to costs CPU by the byte: a bomb may not make that its wire size's thousands)."""
        assert self._inflate is not None
        self._inflated_room += MAX_INFLATION * len(piece)
        try:
            plain = self._inflate.decompress(piece, min(MAX_EVENT_BYTES, self._inflated_room))
            if not self._inflate.unconsumed_tail:
                self._inflated_room -= len(plain)
                return plain
        except zlib.error:
            pass
        self._over, self._stream = True, None
        return b""

    def _usage(self) -> Usage | None:
        if self._stream is not None:
            return self._stream.result()
        if self._over or not self._body:
            return None
        return usage_from_json(bytes(self._body))

    def _take(self) -> Any:
        reservation, self._reservation = self._reservation, None
        self._body = bytearray()
        if reservation is None or not reservation.open:  # closed elsewhere (e.g. a leave)
            return None
        return reservation
