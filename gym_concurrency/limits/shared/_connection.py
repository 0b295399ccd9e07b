"""Reaching one shared limit's Redis: the URL (checked, and shown without its password),
the clients made from it (a pool for admissions, one connection for the mailbox, a blocking
client for the heartbeat thread), and telling a misconfiguration from an outage.

`redis://`, `rediss://` (TLS) and `unix://` URLs name one server; `redis+sentinel://host:port
[,host:port...]/service[/db]` names the master of `service` as Redis Sentinel reports it
(the clients follow a failover).
"""

from __future__ import annotations

import ssl
from typing import Any, Final
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

__all__ = ["SCHEMES", "Connection", "misconfiguration", "safe_url", "sentinel_parts"]

SCHEMES: Final = ("redis://", "rediss://", "unix://", "redis+sentinel://")


def safe_url(url: str) -> str:
    """`url` with its password (if any) replaced by `***`: fit for a log or an error."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return SplitResult(parts.scheme, f"{user}:***@{host}", *parts[2:]).geturl()


def misconfiguration(error: BaseException) -> str | None:
    """What is misconfigured if `error` says so (a wrong or missing password, a user Redis's
    ACL does not allow, a TLS setting that cannot work, a command this Redis lacks); None
    for an outage (refused, reset, timed out) or anything else."""
    from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

    if isinstance(error, AuthenticationError):
        return f"authentication failed (a wrong or missing password?): {error}"
    if isinstance(error, NoPermissionError):
        return f"not authorized by Redis's ACL: {error}"
    if isinstance(error, ResponseError):
        text = str(error)
        if text.startswith(("NOAUTH", "WRONGPASS")):
            return f"authentication failed (a wrong or missing password?): {text}"
        if text.lower().startswith("unknown command"):
            return f"Redis lacks a command a shared limit needs (EVAL/EVALSHA?): {text}"
        return None
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return f"TLS failed (check the certificate and ssl_* options of redis_url): {cause}"
        cause = cause.__cause__ or cause.__context__
    return None


class Connection:
    """The clients of one limit to the Redis named by `url`. Every new connection sends
    `check` (a command) before its first command: it finds a limit's state that another
    Redis kept (a failover) whichever call reaches the new server first."""

    def __init__(
        self, url: str, *, redis_timeout: float, max_connections: int, check: list[Any]
    ) -> None:
        self.url = url
        self._timeout = redis_timeout
        self._max_connections = max_connections
        self._check = check

    async def _connected(self, connection: Any) -> None:
        await connection.on_connect()
        await connection.send_command(*self._check)
        await connection.read_response()

    def _connected_blocking(self, connection: Any) -> None:
        connection.on_connect()
        connection.send_command(*self._check)
        connection.read_response()

    def admissions(self) -> Any:
        """An asyncio client with a bounded pool, each call bounded by the Redis timeout."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        common: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": self._timeout,
            "retry": Retry(NoBackoff(), 1),
            "redis_connect_func": self._connected,
        }
        if self.url.startswith("redis+sentinel://"):
            return self._async_sentinel(self._timeout, common)
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url,
            max_connections=self._max_connections,
            socket_timeout=self._timeout,
            **common,
        )
        return aioredis.Redis(connection_pool=pool)

    def mailbox(self, wait: float) -> Any:
        """An asyncio client for blocking pops of up to `wait` seconds."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        common: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": self._timeout,
            "retry": Retry(NoBackoff(), 1),
            "redis_connect_func": self._connected,
        }
        if self.url.startswith("redis+sentinel://"):
            return self._async_sentinel(wait + self._timeout, common)
        return aioredis.Redis.from_url(self.url, socket_timeout=wait + self._timeout, **common)

    def blocking(self) -> Any:
        """A blocking client (one connection) for the heartbeat thread."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        common: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": self._timeout,
            "socket_timeout": self._timeout,
            "retry": Retry(NoBackoff(), 1),
            "redis_connect_func": self._connected_blocking,
        }
        if self.url.startswith("redis+sentinel://"):
            from redis.sentinel import Sentinel

            hosts, service, db, options = sentinel_parts(self.url)
            sentinel = Sentinel(  # type: ignore[no-untyped-call]
                hosts, sentinel_kwargs=_sentinel_kwargs(options, self._timeout)
            )
            return sentinel.master_for(  # type: ignore[no-untyped-call]
                service, db=db, **options, **common
            )
        return redis.Redis.from_url(self.url, **common)  # (one thread: one connection)

    def _async_sentinel(self, timeout: float, common: dict[str, Any]) -> Any:
        from redis.asyncio.sentinel import Sentinel

        hosts, service, db, options = sentinel_parts(self.url)
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            hosts, sentinel_kwargs=_sentinel_kwargs(options, self._timeout)
        )
        return sentinel.master_for(service, db=db, socket_timeout=timeout, **options, **common)


def sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, int, dict[str, Any]]:
    """(sentinel hosts, service name, db, client options) of a redis+sentinel:// URL:
    `redis+sentinel://[user:password@]host:port[,host:port...]/service[/db][?ssl=true]
    [&sentinel_password=...]`; ValueError if it names no service."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    hosts = []
    for item in netloc.split(","):
        host, _, port = item.rpartition(":")
        hosts.append((host or item, int(port) if port.isdigit() else 26379))
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError(
            "SharedLimit redis_url redis+sentinel://host:port/service[/db] needs the service "
            f"name, got {safe_url(url)}"
        )
    db = int(path[1]) if len(path) > 1 and path[1].isdigit() else 0
    options: dict[str, Any] = {}
    if parts.username:
        options["username"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
    query = parse_qs(parts.query)
    if query.get("ssl", ["false"])[0].lower() in ("1", "true", "yes"):
        options["ssl"] = True
    if "sentinel_password" in query:  # the sentinels' own (the URL's is the master's)
        options["sentinel_password"] = query["sentinel_password"][0]
    return hosts, path[0], db, options


def _sentinel_kwargs(options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """How to talk to the sentinels themselves: their password (`?sentinel_password=`),
    TLS as for the master, the Redis timeout."""
    kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if "sentinel_password" in options:
        kwargs["password"] = options.pop("sentinel_password")
    if "ssl" in options:
        kwargs["ssl"] = options["ssl"]
    return kwargs
