"""Reaching one shared limit's Redis: the URL (checked, and shown without its passwords),
the clients made from it (a pool for admissions, one connection for the mailbox, a blocking
client for the heartbeat thread), and telling a misconfiguration from an outage.

`redis://`, `rediss://` (TLS) and `unix://` URLs name one server; `redis+sentinel://host:port
[,host:port...]/service[/db]` names the master of `service` as Redis Sentinel reports it
(the clients follow a failover); `redis+cluster://host:port[,host:port...]` names a Redis
Cluster by some of its nodes (a limit's keys share one hash slot, so one primary at a time
keeps them; the clients follow a failover).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from ...safe_urls import safe_url

__all__ = ["SCHEMES", "Connection", "misconfiguration", "sentinel_parts"]

SCHEMES: Final = ("redis://", "rediss://", "unix://", "redis+sentinel://", "redis+cluster://")
_SENTINEL: Final = "redis+sentinel://"
_STATE_MISSING: Final = 2  # what CHECK_SERVER answers for a limit with no state
_CLUSTER: Final = "redis+cluster://"


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
        if "can't run this command" in text or "ACL failure in script" in text:
            return (
                "not authorized by Redis's ACL to run a command the limit's scripts use "
                "(EVAL, EVALSHA, INFO, on a Redis Cluster CLUSTER MYID, and the keys' "
                f"commands): {text}"
            )
        if text.lower().startswith("unknown command") or "Unknown Redis command" in text:
            return (
                "Redis lacks a command a shared limit needs (EVAL, EVALSHA, INFO, "
                f"renamed or disabled?): {text}"
            )
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
        self,
        url: str,
        *,
        redis_timeout: float,
        max_connections: int,
        check: list[Any],
        on_state_missing: Callable[[], None],
    ) -> None:
        self.url = url
        self._on_state_missing = on_state_missing  # `check` found no state (a restart)
        self._timeout = redis_timeout
        self._max_connections = max_connections
        self._check = check

    async def _connected(self, connection: Any) -> None:
        await connection.on_connect()
        await connection.send_command(*self._check)
        try:
            self._checked(await connection.read_response())
        except Exception as error:
            if not _elsewhere(error):
                raise

    def _connected_blocking(self, connection: Any) -> None:
        connection.on_connect()
        self._check_blocking(connection)

    def _check_blocking(self, connection: Any) -> None:
        connection.send_command(*self._check)
        try:
            self._checked(connection.read_response())
        except Exception as error:
            if not _elsewhere(error):
                raise

    def _checked(self, reply: Any) -> None:
        if reply == _STATE_MISSING:
            self._on_state_missing()

    def _async_options(self) -> dict[str, Any]:
        """What every asyncio client of the limit shares: one try per call (the limit has
        its own retries), the connect timeout, and `check` on every new connection."""
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        return {
            "decode_responses": True,
            "socket_connect_timeout": self._timeout,
            "retry": Retry(NoBackoff(), 1),
            "redis_connect_func": self._connected,
        }

    def admissions(self) -> Any:
        """An asyncio client with a bounded pool, each call bounded by the Redis timeout."""
        import redis.asyncio as aioredis

        common = self._async_options()
        if self.url.startswith(_SENTINEL):
            return self._async_sentinel(self._timeout, common)
        if self.url.startswith(_CLUSTER):
            return self._async_cluster(self._timeout, common)
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

        common = self._async_options()
        if self.url.startswith(_SENTINEL):
            return self._async_sentinel(wait + self._timeout, common)
        if self.url.startswith(_CLUSTER):
            return self._async_cluster(wait + self._timeout, common)
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
        if self.url.startswith(_CLUSTER):
            from redis.cluster import ClusterNode, RedisCluster

            hosts, options = cluster_parts(self.url)
            common["redis_connect_func"] = self._check_blocking  # (after the cluster's own)
            del common["retry"]  # (the cluster retries by its own rules)
            node: Any = ClusterNode  # redis-py's sync ClusterNode is not annotated
            nodes = [node(host, port) for host, port in hosts]
            return RedisCluster(startup_nodes=nodes, **options, **common)
        if self.url.startswith(_SENTINEL):
            from redis.sentinel import Sentinel

            hosts, service, db, options = sentinel_parts(self.url)
            unannotated: Any = Sentinel  # redis-py's Sentinel is not annotated
            sentinel = unannotated(hosts, sentinel_kwargs=_sentinel_kwargs(options, self._timeout))
            return sentinel.master_for(service, db=db, **options, **common)
        return redis.Redis.from_url(self.url, **common)  # (one thread: one connection)

    def _async_cluster(self, timeout: float, common: dict[str, Any]) -> Any:
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        hosts, options = cluster_parts(self.url)
        nodes = [ClusterNode(host, port) for host, port in hosts]
        rest = {k: v for k, v in common.items() if k not in ("retry", "redis_connect_func")}
        client = RedisCluster(
            startup_nodes=nodes,
            max_connections=self._max_connections,
            socket_timeout=timeout,
            **options,
            **rest,
        )
        # The asyncio cluster takes no connect hook as an argument: every node it makes
        # (those it starts from, those it learns) is made from these connection arguments.
        client.connection_kwargs["redis_connect_func"] = self._connected
        for node in client.startup_nodes:
            node.connection_kwargs["redis_connect_func"] = self._connected
        return client

    def _async_sentinel(self, timeout: float, common: dict[str, Any]) -> Any:
        from redis.asyncio.sentinel import Sentinel

        hosts, service, db, options = sentinel_parts(self.url)
        unannotated: Any = Sentinel  # as above
        sentinel = unannotated(hosts, sentinel_kwargs=_sentinel_kwargs(options, self._timeout))
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


def cluster_parts(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """(some nodes, client options) of a redis+cluster:// URL:
    `redis+cluster://[user:password@]host:port[,host:port...][/][?ssl=true]`."""
    parts = urlsplit(url)
    hosts = []
    for item in parts.netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = item.rpartition(":")
        hosts.append((host or item, int(port) if port.isdigit() else 6379))
    options: dict[str, Any] = {}
    if parts.username:
        options["username"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
    if parse_qs(parts.query).get("ssl", ["false"])[0].lower() in ("1", "true", "yes"):
        options["ssl"] = True
    return hosts, options


def _elsewhere(error: BaseException) -> bool:
    """True for a Redis Cluster's answer that the limit's keys live on another node (a new
    connection made to learn the cluster's layout): nothing to check there."""
    from redis.exceptions import AskError, ClusterDownError, TryAgainError

    return isinstance(error, AskError | ClusterDownError | TryAgainError)


def _sentinel_kwargs(options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """How to talk to the sentinels themselves: their password (`?sentinel_password=`),
    TLS as for the master, the Redis timeout."""
    kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if "sentinel_password" in options:
        kwargs["password"] = options.pop("sentinel_password")
    if "ssl" in options:
        kwargs["ssl"] = options["ssl"]
    return kwargs
