"""A TCP proxy on 127.0.0.1 in front of one redis-server, to cut one process off from it.

Modes (`proxy.mode = ...`, applied at once):
- "pass":       bytes flow both ways.
- "blackhole":  nothing flows and nothing is answered (bytes wait, as in a network that
                drops packets and retransmits): back in "pass", what waited is delivered.
- "drop":       requests reach Redis (its scripts run) but every reply is thrown away;
                back in "pass", connections that lost replies are reset (they are out of
                step with the protocol, as their clients' timeouts also found).
- "reset":      every connection is reset (RST) and each new one is reset at once.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading

from tests.shared.redis_server import free_port

MODES = ("pass", "blackhole", "drop", "reset")


class _Pair:
    __slots__ = ("client", "lost_replies", "upstream")

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.lost_replies = False


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class Proxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`upstream_port`, in a thread of its own."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._mode = "pass"
        self._pairs: list[_Pair] = []
        self._listener = socket.create_server(("127.0.0.1", self.port), backlog=128)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proxy", daemon=True)
        self._thread.start()

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        assert mode in MODES, mode
        self._mode = mode

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(5)
        for pair in self._pairs:
            _reset(pair.client)
            _reset(pair.upstream)
        self._listener.close()

    def _run(self) -> None:
        while not self._stopped.is_set():
            mode = self._mode
            if mode == "reset":
                for pair in self._pairs:
                    _reset(pair.client)
                    _reset(pair.upstream)
                self._pairs = []
            elif mode == "pass":
                for pair in [p for p in self._pairs if p.lost_replies]:
                    self._drop(pair)
            readable: list[socket.socket] = []
            if mode != "blackhole":
                readable.append(self._listener)
            if mode in ("pass", "drop"):
                for pair in self._pairs:
                    readable += [pair.client, pair.upstream]
            try:
                ready, _, _ = select.select(readable, [], [], 0.01)
            except (OSError, ValueError):
                continue  # a socket closed under us: look again
            for sock in ready:
                if sock is self._listener:
                    self._accept(mode)
                else:
                    self._forward(sock, mode)

    def _accept(self, mode: str) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        if mode == "reset":
            _reset(client)
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=2)
        except OSError:
            _reset(client)
            return
        upstream.settimeout(None)
        self._pairs.append(_Pair(client, upstream))

    def _forward(self, sock: socket.socket, mode: str) -> None:
        pair = next((p for p in self._pairs if sock in (p.client, p.upstream)), None)
        if pair is None:
            return
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(pair)
            return
        if sock is pair.upstream and mode == "drop":
            pair.lost_replies = True
            return
        target = pair.upstream if sock is pair.client else pair.client
        try:
            target.sendall(data)
        except OSError:
            self._drop(pair)

    def _drop(self, pair: _Pair) -> None:
        _reset(pair.client)
        _reset(pair.upstream)
        with contextlib.suppress(ValueError):
            self._pairs.remove(pair)
