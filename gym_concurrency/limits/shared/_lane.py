"""The event loop's script calls of a shared limit without redis-py's per-command machinery:
on connections the lane keeps (no pool lock, health probe or metrics per call), with each
script's `EVALSHA <sha> <n> <keys...>` packed once.

About 17 µs of client CPU a call instead of 55-75 µs through `Script.__call__` (redis-py 8).
What it cannot do plainly goes the usual way, with the same outcome: a script Redis has not
loaded (after a restart or a failover: the usual call loads it), a connection that failed or
that the peer closed (the usual call, on a fresh connection: a script run twice is harmless,
see `enqueue`, and Redis applies a batch of settlements once, see lua/budget.lua), a Redis
Cluster client (no single pool).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ScriptLane"]


def _closed_by_peer(connection: Any) -> bool:
    """True if the peer closed `connection` while it was idle: its transport is closing, or
    its reader is at the end (a Redis stopped leaves the transport half open), so that a
    call on it could not tell whether Redis ran it."""
    writer, reader = getattr(connection, "_writer", None), getattr(connection, "_reader", None)
    if writer is None or reader is None:
        return False  # not connected yet
    return bool(writer.transport.is_closing() or reader.at_eof())


def _bulk(value: object) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


class ScriptLane:
    """Calls `scripts` (name -> redis-py Script of `client`) with `keys`."""

    def __init__(
        self,
        client: Any,
        scripts: dict[str, Any],
        keys: list[str],
    ) -> None:
        from redis import exceptions
        from redis.asyncio import Redis

        plain = isinstance(client, Redis)  # (a cluster client has a pool per node)
        self._pool = client.connection_pool if plain else None
        self._scripts = scripts
        self._keys = keys
        self._heads: dict[str, tuple[int, bytes]] = {}
        self._free: list[Any] = []  # connections kept, idle
        self._broken: list[Any] = []  # connections a call left mid-reply: given back first
        self._no_script, self._answered = exceptions.NoScriptError, exceptions.ResponseError

    async def call(self, name: str, args: list[Any], keys: list[str] | None = None) -> Any:
        """Run script `name` with `args` and `keys` (default the limit's; the same for every
        call of `name`); its raw reply."""
        if self._pool is None:
            return await self._usual(name, args, keys)
        if self._broken:
            await self._give_back_broken()
        connection = await self._connection()
        try:
            packed = self._packed(name, args, self._keys if keys is None else keys)
            await connection.send_packed_command(packed, check_health=False)
            reply = await connection.read_response()
        except self._no_script:
            self._free.append(connection)  # (a whole reply was read: it can be used again)
            return await self._usual(name, args, keys)
        except self._answered:
            self._free.append(connection)
            raise
        except Exception:  # lost, or its transport closed under it: a fresh connection's turn
            self._broken.append(connection)
            return await self._usual(name, args, keys)
        except BaseException:  # cancelled (a timeout) mid-call: its reply may still come
            self._broken.append(connection)
            raise
        self._free.append(connection)
        return reply

    async def _connection(self) -> Any:
        """An idle kept connection, else the pool's; connected (its check sent), else raises
        with nothing of a call written."""
        assert self._pool is not None
        connection = self._kept() or await self._pool.get_connection()
        if not connection.is_connected:
            try:
                await connection.connect()
            except BaseException:
                self._broken.append(connection)
                raise
        return connection

    def _kept(self) -> Any:
        """An idle kept connection the peer has not closed (one it closed meanwhile is given
        back to the pool, which reconnects it), or None."""
        while self._free:
            connection = self._free.pop()
            if not _closed_by_peer(connection):
                return connection  # (not connected yet: `_connection` connects it)
            self._broken.append(connection)
        return None

    async def _usual(self, name: str, args: list[Any], keys: list[str] | None) -> Any:
        return await self._scripts[name](keys=self._keys if keys is None else keys, args=args)

    def _packed(self, name: str, args: list[Any], keys: list[str]) -> bytes:
        head = self._heads.get(name)
        if head is None:
            words = ("EVALSHA", self._scripts[name].sha, len(keys), *keys)
            head = self._heads[name] = (len(words), b"".join(map(_bulk, words)))
        count, packed = head
        return b"*%d\r\n%s%s" % (count + len(args), packed, b"".join(map(_bulk, args)))

    async def _give_back_broken(self) -> None:
        """Connections a call left mid-reply, or the peer closed, go back to the pool closed
        (it reconnects them), one at a time: a call cancelled meanwhile leaves none out."""
        assert self._pool is not None
        while self._broken:
            connection = self._broken.pop()
            try:
                await connection.disconnect(nowait=True)
            finally:
                await self._pool.release(connection)
