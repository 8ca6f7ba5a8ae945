"""A real Redis Cluster on loopback: ``masters`` x (1 + ``replicas``) ``redis-server --cluster-enabled
yes`` child processes, joined with ``redis-cli --cluster create``: test support, used by the tests and by
``bench/run.py --cluster``.

Every node is an ``EmbeddedRedis`` (no persistence, its own temporary directory for ``nodes.conf``) on
a free loopback port whose cluster-bus port (port + 10000) is free too. ``stop`` stops each node by its
PID. Needs ``redis-cli`` (or ``valkey-cli``) for ``--cluster create``: ``find_cli`` says why not.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import redis

from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.process import pick_free_port, port_is_free

_HOST = "127.0.0.1"


def find_cli() -> str | None:
    """``redis-cli`` or ``valkey-cli`` on PATH, or None."""
    return shutil.which("redis-cli") or shutil.which("valkey-cli")


def _cluster_port() -> int:
    for _ in range(200):
        port = pick_free_port(_HOST)
        if port + 10000 < 65536 and port_is_free(_HOST, port + 10000):
            return port
    raise RuntimeError("no free loopback port with a free cluster-bus port (+10000)")


class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each; ``node_timeout_ms`` is the cluster's
    failure-detection time (small, so a failover in a test takes about two seconds)."""

    def __init__(self, masters: int = 3, replicas: int = 1, *, node_timeout_ms: int = 1000) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[EmbeddedRedis] = []

    @property
    def urls(self) -> list[str]:
        return [f"redis://{_HOST}:{node.port}" for node in self.nodes if node.running]

    @property
    def url(self) -> str:
        """A URL of the first running node (any node is a way in)."""
        return self.urls[0]

    def start(self, timeout: float = 60.0) -> None:
        cli = find_cli()
        if cli is None:
            raise RuntimeError("redis-cli is not installed (apt-get install redis-tools)")
        try:
            for _ in range(self.masters * (1 + self.replicas)):
                args = [
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                    "--cluster-replica-validity-factor", "0",
                    "--appendonly", "no",
                ]  # fmt: skip
                node = EmbeddedRedis(
                    port=_cluster_port(),
                    extra_args=args,
                )
                node.start()
                self.nodes.append(node)
            create = [cli, "--cluster", "create", *(f"{_HOST}:{n.port}" for n in self.nodes)]
            create += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
            done = subprocess.run(
                create, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
            )
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]}{done.stderr}")
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every running node reports ``cluster_state:ok`` and knows its replicas' roles."""
        deadline = time.monotonic() + timeout
        while True:
            if (
                all(self._state(node) == "ok" for node in self.nodes if node.running)
                and self._replicas_synced()
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the local cluster did not reach cluster_state:ok in time")
            time.sleep(0.1)

    def _replicas_synced(self) -> bool:
        want = self.masters * self.replicas
        synced = 0
        for node in self.nodes:
            if not node.running:
                continue
            info = self._info(node, "replication")
            if info.get("role") == "slave" and info.get("master_link_status") == "up":
                synced += 1
        return synced >= want or any(not n.running for n in self.nodes)

    def _client(self, node: EmbeddedRedis) -> redis.Redis:
        return redis.Redis(host=_HOST, port=node.port, decode_responses=True, socket_timeout=2)

    def _state(self, node: EmbeddedRedis) -> str:
        try:
            with self._client(node) as client:
                text = str(client.execute_command("CLUSTER", "INFO"))
        except redis.RedisError:
            return "unreachable"
        for line in text.splitlines():
            if line.startswith("cluster_state:"):
                return line.split(":", 1)[1].strip()
        return "unknown"

    def _info(self, node: EmbeddedRedis, section: str) -> dict[str, str]:
        try:
            with self._client(node) as client:
                return {str(k): str(v) for k, v in client.info(section).items()}
        except redis.RedisError:
            return {}

    def master_of(self, key: str) -> EmbeddedRedis:
        """The node that serves ``key``'s slot now."""
        for node in self.nodes:
            if not node.running:
                continue
            with contextlib.suppress(redis.RedisError), self._client(node) as client:
                slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
                for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                    if int(start) <= slot <= int(end):
                        port = int(master[1])
                        return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no running node knows who serves {key!r}")

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()
        self.nodes = []

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass(frozen=True)
class SlotMove:
    """Where a key's slot is and a master it can move to, as ``CLUSTER NODES`` says."""

    slot: int
    source_port: int
    source_id: str
    target_port: int
    target_id: str
    others: list[int]
    """The ports of the remaining masters."""


def slot_move(cluster: LocalCluster, key: str) -> SlotMove:
    """``key``'s slot, its master, and the first other master as the target of a move."""
    source = cluster.master_of(key)
    with redis.Redis(host="127.0.0.1", port=source.port, decode_responses=True) as client:
        slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
        source_id = str(client.execute_command("CLUSTER", "MYID"))
        masters = [
            line.split()
            for line in str(client.execute_command("CLUSTER", "NODES")).splitlines()
            if "master" in line.split()[2] and line.split()[0] != source_id
        ]
    ports = [int(m[1].split("@")[0].rsplit(":", 1)[1]) for m in masters]
    return SlotMove(slot, source.port, source_id, ports[0], masters[0][0], ports[1:])


def set_slot(port: int, slot: int, *args: str) -> None:
    """``CLUSTER SETSLOT slot *args`` on the master at ``port``."""
    with redis.Redis(host="127.0.0.1", port=port, decode_responses=True) as client:
        client.execute_command("CLUSTER", "SETSLOT", slot, *args)
