"""A Redis Cluster on 127.0.0.1 for one test: three primaries with a replica each
(`redis-cli --cluster create`). A limit's keys share one hash slot, so the failovers act on
the primary of that slot: `failover(key)` promotes its replica (`CLUSTER FAILOVER`, nothing
lost); `hold_back_replica(key)` then `crash(key)` lose writes (the replica stopped, its link
closed, the primary killed, the replica elected by the others); `rejoin()` starts the old
primary again (empty), which the cluster makes the new primary's replica."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.shared.redis_server import RedisServer, free_port, settle_on


class ClusterDeployment:
    def __init__(self, folder: Path) -> None:
        self.nodes: list[RedisServer] = []
        for n in range(6):
            (folder / f"n{n}").mkdir()
            options = {
                "--cluster-enabled": "yes",
                "--cluster-config-file": "nodes.conf",
                "--cluster-node-timeout": "1000",
                "--cluster-port": str(free_port()),
                "--repl-diskless-sync-delay": "0",
            }
            self.nodes.append(
                RedisServer(folder / f"n{n}", *(x for o in options.items() for x in o))
            )
        cli = shutil.which("redis-cli")
        assert cli is not None, "redis-cli is not installed (scripts/install-system-deps)"
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self._wait(self._settled, "the cluster to settle")
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:3])

    def primary(self, key: str) -> RedisServer:
        """The node serving `key`'s hash slot now."""
        return self._role(key)[0]

    def failover(self, key: str) -> None:
        _, replica = self._role(key)
        replica.client().execute_command("CLUSTER", "FAILOVER")
        self._wait(lambda: self.primary(key) is replica, "the replica to take over")
        self._wait(self._settled, "the cluster to settle")

    def hold_back_replica(self, key: str) -> None:
        primary, replica = self._role(key)
        replica.pause()
        primary.client().client_kill_filter(_type="replica")
        self._held_back = (primary, replica)

    def crash(self, key: str) -> None:
        primary, replica = self._held_back  # (the replica is stopped: not asked anything)
        assert primary.process is not None
        os.kill(primary.process.pid, signal.SIGKILL)
        primary.process.wait(10)
        primary.process = None
        replica.resume()
        self._wait(lambda: self._serves(replica, key), "the replica to be elected")

    def rejoin(self) -> None:
        old = next(n for n in self.nodes if n.process is None)
        old.start()  # (its nodes.conf: it rejoins, a replica of the primary that took over)
        self._wait(lambda: self._link_up(old), "the old primary to follow the new one")
        self._wait(self._settled, "the cluster to settle")

    def _role(self, key: str) -> tuple[RedisServer, RedisServer]:
        """(primary, replica) of `key`'s slot."""
        live = [n for n in self.nodes if n.process is not None]
        primary = next(n for n in live if self._serves(n, key))
        node_id = primary.client().execute_command("CLUSTER", "MYID")
        replica = next(n for n in live if n is not primary and self._replica_of(n, node_id))
        return primary, replica

    def _replica_of(self, node: RedisServer, primary_id: str) -> bool:
        me = node.client().execute_command("CLUSTER", "MYID")
        for line in node.client().execute_command("CLUSTER", "NODES").splitlines():
            fields = line.split()
            if fields[0] == me:
                return fields[3] == primary_id
        return False

    def _serves(self, node: RedisServer, key: str) -> bool:
        client = node.client()
        slot = int(client.execute_command("CLUSTER", "KEYSLOT", f"{{{key}}}"))
        for start, end, owner, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(owner[1]) == node.port and self._is_primary(node)
        return False

    def _is_primary(self, node: RedisServer) -> bool:
        return node.client().info("replication").get("role") == "master"

    def _link_up(self, node: RedisServer) -> bool:
        info = node.client().info("replication")
        return info.get("role") == "slave" and info.get("master_link_status") == "up"

    def _settled(self) -> bool:
        live = [n for n in self.nodes if n.process is not None]
        return all(n.client().cluster("info")["cluster_state"] == "ok" for n in live) and all(
            self._is_primary(n) or self._link_up(n) for n in live
        )

    def _wait(self, condition: Callable[[], bool], what: str, within: float = 30.0) -> None:
        settle_on(condition, what, within, who="Cluster")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
