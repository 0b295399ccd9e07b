"""A Redis Sentinel deployment on 127.0.0.1 for one test: a master, a replica and one
sentinel (quorum 1) watching them as `mymaster`. `failover()` promotes the replica
(`SENTINEL FAILOVER`, nothing lost); `hold_back_replica()` then `crash()` lose writes: the
replica stops (SIGSTOP, its link closed), the master takes writes and is killed (SIGKILL), the
sentinel promotes the replica, which never saw them; `rejoin()` brings the old one back."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import redis

from tests.shared.redis_server import RedisServer, free_port, settle_on

SERVICE = "mymaster"


class SentinelDeployment:
    def __init__(self, folder: Path) -> None:
        (folder / "a").mkdir()
        (folder / "b").mkdir()
        fast = ("--repl-diskless-sync-delay", "0")  # a replica syncs at once
        self.nodes = [RedisServer(folder / "a", *fast)]
        self.nodes.append(
            RedisServer(folder / "b", *fast, "--replicaof", "127.0.0.1", str(self.nodes[0].port))
        )
        self._wait(lambda: self._link_up(self.nodes[1]), "the replica's link to the master")
        self.port = free_port()
        conf = folder / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.nodes[0].port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        log = open(folder / "sentinel.log", "wb")  # noqa: SIM115 - the sentinel keeps it
        self.process = subprocess.Popen(
            [self.nodes[0].binary, str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.client = redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)
        self._wait(self._sees_replica, "the sentinel to see the replica")
        self.url = f"redis+sentinel://127.0.0.1:{self.port}/{SERVICE}/0"

    def primary(self, key: str = "") -> RedisServer:
        """The master now (whatever the key)."""
        return next(n for n in self.nodes if n.port == self.master_port())

    def master_port(self) -> int:
        _, port = self.client.sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def failover(self, key: str = "", within: float = 30.0) -> None:
        """Promote the replica; return once the sentinel names it and it takes writes, and
        the old master follows it."""
        before = self.master_port()
        self.client.execute_command("SENTINEL", "FAILOVER", SERVICE)
        self._wait(lambda: self.master_port() != before, "the sentinel to name the new master")
        new = next(n for n in self.nodes if n.port == self.master_port())
        old = next(n for n in self.nodes if n.port == before)
        self._wait(lambda: new.client().info("replication")["role"] == "master", "promotion")
        self._wait(lambda: self._link_up(old), "the old master to follow the new one", within)
        self._wait(self._sees_replica, "the sentinel to see the new replica", within)

    def hold_back_replica(self, key: str = "") -> None:
        """The replica stops taking the master's writes (until `crash()`): it is stopped,
        and its link closed, so that nothing more reaches it even from a socket buffer."""
        self._replica().pause()
        master = next(n for n in self.nodes if n.port == self.master_port())
        master.client().client_kill_filter(_type="replica")

    def crash(self, key: str = "") -> None:
        """Kill the master (its writes since `hold_back_replica()` are lost) and let the
        sentinel promote the replica."""
        before = self.master_port()
        old = next(n for n in self.nodes if n.port == before)
        assert old.process is not None
        os.kill(old.process.pid, signal.SIGKILL)
        old.process.wait(10)
        old.process = None
        self._replica().resume()
        self._wait(lambda: self.master_port() != before, "the sentinel to name a new master")
        new = next(n for n in self.nodes if n.port == self.master_port())
        self._wait(lambda: new.client().info("replication")["role"] == "master", "promotion")

    def rejoin(self, within: float = 30.0) -> None:
        """After `crash()`: start the old master again (empty) as the new one's replica."""
        old = next(n for n in self.nodes if n.process is None)
        old.start()
        old.client().replicaof("127.0.0.1", self.master_port())  # (as the sentinel would)
        self._wait(lambda: self._link_up(old), "the old master to follow the new one", within)
        self._wait(self._sees_replica, "the sentinel to see the new replica", within)

    def _replica(self) -> RedisServer:
        return next(n for n in self.nodes if n.port != self.master_port())

    def _link_up(self, node: RedisServer) -> bool:
        info = node.client().info("replication")
        return info.get("role") == "slave" and info.get("master_link_status") == "up"

    def _sees_replica(self) -> bool:
        try:
            replicas = self.client.sentinel_slaves(SERVICE)
        except redis.RedisError:
            return False
        return any(r.get("flags") == "slave" for r in replicas)

    def _wait(self, condition: Callable[[], bool], what: str, within: float = 30.0) -> None:
        settle_on(condition, what, within, who="Sentinel")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        for node in self.nodes:
            node.stop()
