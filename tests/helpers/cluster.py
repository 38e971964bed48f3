"""A private Redis Cluster of real redis-server processes, and its fixture."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

from streamnb_workers.replication.shards import load_model
from streamnb_workers.store.keys import GROUP, ModelKeys
from tests.helpers.acl import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    FEATURIZER,
    WORKER_PASSWORD,
    WORKER_USER,
    AclRedis,
    acl_refusals,
    write_acl,
)
from tests.helpers.redis_server import REDIS_SERVER
from tests.helpers.workers import (
    assert_same_stats,
    offline_model,
)

REDIS_CLI = shutil.which("redis-cli")


MODELS = ("spam", "ham")


CLUSTER_TIMEOUT_S = 30.0


def slot_of(key: str) -> int:
    """The Redis Cluster hash slot of ``key`` (CRC16/XMODEM of the hash tag, mod 16384)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    crc = 0
    for byte in key.encode():
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc % 16384


def _below_ephemeral() -> tuple[int, int]:
    """The ports a node may take so that it and its bus port (+10000) lie below the
    kernel's ephemeral range: a client socket of another test cannot take either."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return 10000, max(low - 10001, 11000)


def cluster_ports(n: int) -> list[int]:
    """``n`` ports whose cluster bus port (+10000) is free too, both outside the
    ephemeral range (a node's bus port taken between this check and its start
    aborts the node)."""
    first, last = _below_ephemeral()
    ports: list[int] = []
    while len(ports) < n:
        p = random.randint(first, last)
        try:
            for q in (p, p + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
        except OSError:
            continue
        if p not in ports:
            ports.append(p)
    return ports


class Cluster:
    """Three master redis-server processes joined into a cluster, the ACL on each, and
    optionally replicas of them.

    ``replicas``: replicas per master (``redis-cli --cluster create --cluster-replicas``);
    they replicate as the admin user (the ACL turns ``default`` off).
    ``node_timeout_ms``: how long a master may be unreachable before it is failed over.
    ``extra``: more options for every node."""

    def __init__(self, acl_dir: Path, replicas: int = 0, node_timeout_ms: int = 5000,
                 extra: list[str] = ()) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="streamnb-cluster-"))
        self.replicas = replicas
        acl = write_acl(acl_dir)
        self.nodes = [AclRedis(acl, port=p, extra=["--cluster-enabled", "yes",
                                                   "--cluster-config-file", str(self.dir / f"nodes-{p}.conf"),
                                                   "--cluster-node-timeout", str(node_timeout_ms),
                                                   "--masteruser", ADMIN_USER,
                                                   "--masterauth", ADMIN_PASSWORD, *extra])
                      for p in cluster_ports(3 * (1 + replicas))]

    def start(self) -> Cluster:
        for n in self.nodes:
            n.start()
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        proc = subprocess.run([REDIS_CLI, "--user", ADMIN_USER, "--pass", ADMIN_PASSWORD,
                               "--no-auth-warning", "--cluster", "create", *addrs,
                               "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        self.wait_ok("the cluster did not reach cluster_state:ok")
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while not self._replicated():
            assert time.monotonic() < deadline, "the replicas did not sync with their masters"
            time.sleep(0.1)
        return self

    def live(self) -> list[AclRedis]:
        """The nodes whose process runs."""
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ok(self, what: str, timeout: float = CLUSTER_TIMEOUT_S) -> None:
        """Wait until every live node says ``cluster_state:ok`` and knows a master for
        each slot range that is alive (a replica promoted after a failure included)."""
        deadline = time.monotonic() + timeout
        while not self._ok():
            assert time.monotonic() < deadline, what
            time.sleep(0.1)

    def _replicated(self) -> bool:
        """Every node lists ``replicas`` replicas per slot range and each replica's link
        to its master is up."""
        for n in self.nodes:
            c = n.client()
            if any(len(row) != 3 + self.replicas for row in c.execute_command("CLUSTER", "SLOTS")):
                return False
            info = c.info("replication")
            if info["role"] != "master" and info.get("master_link_status") != "up":
                return False
        return True

    def _ok(self) -> bool:
        live = {n.port for n in self.live()}
        try:
            for n in self.live():
                c = n.client()
                if c.cluster("info")["cluster_state"] != "ok":
                    return False
                masters = {int(row[2][1]) for row in c.execute_command("CLUSTER", "SLOTS")}
                if not masters <= live:
                    return False
        except redis.RedisError:
            return False
        return True

    def stop(self) -> None:
        for n in self.nodes:
            n.__exit__(None, None, None)
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, user: str = WORKER_USER, password: str = WORKER_PASSWORD) -> str:
        return self.nodes[0].url_for(user, password)

    def admin(self, node: int = 0) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.nodes[node].port, username=ADMIN_USER,
                            password=ADMIN_PASSWORD, socket_timeout=5)

    def owner(self, slot: int) -> int:
        """Port of the master serving ``slot``."""
        return self.serving(slot)[0]

    def serving(self, slot: int) -> list[int]:
        """Ports of the nodes serving ``slot``: its master, then its replicas."""
        for start, end, *nodes in self.live()[0].client().execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return [int(n[1]) for n in nodes]
        raise AssertionError(f"slot {slot} is not served")

    def node(self, port: int) -> AclRedis:
        return next(n for n in self.nodes if n.port == port)

    def refusals(self) -> list[dict]:
        return [e for n in self.live() for e in acl_refusals(n.client())]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("redis-server and redis-cli are needed for a cluster")
    c = Cluster(tmp_path_factory.mktemp("acl"))
    try:
        c.start()
    except Exception:
        c.stop()
        raise
    yield c
    c.stop()


def drained(admin: Any, name: str) -> bool:
    k = ModelKeys(name)
    if not admin.exists(k.input):
        return False
    groups = {g["name"].decode(): g for g in admin.xinfo_groups(k.input)}
    last = admin.xrevrange(k.input, count=1)
    return (GROUP in groups and bool(last) and groups[GROUP]["last-delivered-id"] == last[0][0]
            and int(admin.xpending(k.input, GROUP)["pending"]) == 0)


def check_model(admin: Any, name: str, msgs: list[dict], n_workers: int) -> None:
    k = ModelKeys(name)
    labelled = [m for m in msgs if "label" in m]
    model, _ = load_model(admin, name)
    assert_same_stats(model, offline_model("multinomial", {"n_features": 1024}, FEATURIZER, labelled))
    assert int(admin.get(k.learnt)) == len(labelled)
    outs = [msgpack.unpackb(f[b"data"]) for _, f in admin.xrange(k.out)]
    assert sorted(o["id"] for o in outs) == sorted(m["id"] for m in msgs)
    assert int(admin.xpending(k.input, GROUP)["pending"]) == 0
    assert admin.xlen(k.dead) == 0
    assert len({o["worker"] for o in outs}) == n_workers
