"""Redis Cluster: a 3-master cluster of real redis-server processes, two models, two workers each.

The cluster is started by the test (free ports, ``cluster-enabled yes``, ``redis-cli --cluster
create``) with the shipped ACL on every node, and the workers log in as ``streamnb-worker``.
Every key of a model carries the hash tag ``{NAME}``, so one model lives in one slot and
its commit script runs on one node; the two models used here hash to slots owned by
different masters. Afterwards: the statistics of each model equal one offline fit, every
message has exactly one prediction, nothing is pending, and no node logged an ACL refusal.
"""

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
from _redis_server import REDIS_SERVER
from _worker_helpers import (
    assert_same_stats,
    count_spec,
    fast_options,
    offline_model,
    produce,
    run_in_threads,
    token_messages,
)
from test_acl_worker import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    FEATURIZER,
    WORKER_PASSWORD,
    WORKER_USER,
    AclRedis,
    acl_refusals,
    start_worker_cli,
    stop,
    wait_until,
    write_acl,
)

from streamnb.exceptions import SettingsError
from streamnb_workers.replication.shards import load_model
from streamnb_workers.store.connection import RedisSettings, UrlConnector, is_access_error
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.worker import Worker

pytestmark = pytest.mark.redis

REDIS_CLI = shutil.which("redis-cli")
#: Two model names whose hash tags fall in slots of different masters of a 3-master
#: cluster made by ``redis-cli --cluster create`` (0-5460, 5461-10922, 10923-16383).
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


def cluster_ports(n: int) -> list[int]:
    """``n`` ports whose cluster bus port (+10000) is free too."""
    ports: list[int] = []
    while len(ports) < n:
        p = random.randint(20000, 50000)
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


def test_slot_of_matches_redis(cluster):
    client = cluster.nodes[0].client()
    for name in (*MODELS, "mail", "a.b-c_9"):
        key = ModelKeys(name).input
        assert slot_of(key) == client.cluster("keyslot", key)
        assert {slot_of(k) for k in ModelKeys(name).all_fixed()} == {slot_of(key)}


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


@pytest.mark.slow
def test_two_models_two_cli_workers_each_exactly_once(cluster, tmp_path):
    slots = {name: slot_of(ModelKeys(name).input) for name in MODELS}
    assert len({cluster.owner(s) for s in slots.values()}) == 2, slots
    admin = cluster.admin()
    msgs = {name: token_messages(800, seed=i, labelled_share=0.8) for i, name in enumerate(MODELS)}
    logs, procs = [], []
    for name in MODELS:
        for i in range(2):
            logs.append(tmp_path / f"{name}-{i}.log")
            # error weight 1: the statistics are an offline partial_fit's
            procs.append(start_worker_cli(cluster.url(), name, f"{name}-{i}", logs[-1], "--cluster",
                                          "--error-weight", "1"))
    t0 = time.monotonic()
    try:
        for name in MODELS:
            wait_until(lambda n=name: admin.hlen(ModelKeys(n).workers) == 2, 40,
                       f"two workers of {name}", procs, logs)
            produce(admin, name, msgs[name])
        for name in MODELS:
            wait_until(lambda n=name: drained(admin, n), 40, f"model {name} drained", procs, logs)
    finally:
        codes = stop(procs)
    assert codes == [0] * 4, [log.read_text()[-2000:] for log in logs]
    assert time.monotonic() - t0 < 60
    for name in MODELS:
        check_model(admin, name, msgs[name], n_workers=2)
        # the model's data lives on the master that owns its slot, nowhere else
        owner = next(n for n in cluster.nodes if n.port == cluster.owner(slots[name]))
        assert owner.client().exists(ModelKeys(name).log) == 1
        assert sum(n.client().dbsize() > 0 for n in cluster.nodes) >= 2
    assert cluster.refusals() == []


def test_workers_serving_both_models_read_each_slot(cluster):
    names = ("spam-api", "ham-api")
    admin = cluster.admin()
    msgs = {name: token_messages(400, seed=7 + i, labelled_share=0.75) for i, name in enumerate(names)}
    for name in names:
        produce(admin, name, msgs[name])
    specs = [count_spec(name) for name in names]
    workers = [Worker(UrlConnector(RedisSettings(cluster.url(), cluster=True)), specs,
                      fast_options(f"both-{i}")) for i in range(2)]
    run_in_threads(workers, timeout=40)  # raises the first worker error
    for w in workers:
        w.shutdown()
    for name in names:
        check_model(admin, name, msgs[name], n_workers=len({
            msgpack.unpackb(f[b"data"])["worker"] for _, f in admin.xrange(ModelKeys(name).out)}))
        versions = {w.models[name].replica.version for w in workers}
        assert len(versions) == 1
    assert cluster.refusals() == []


def test_delayed_labels_and_corrections_on_a_cluster(cluster):
    """The label cache on a cluster, as the worker's login: the commit writes the bucket
    hashes, and workers/store/scripts/cache_get.lua finds the entries in the buckets it names from the
    registry (keys of the model's one slot); labels and corrections are learnt exactly once."""
    name = "late-labels"
    admin = cluster.admin()
    msgs = token_messages(60, seed=11, labelled_share=0.5)
    produce(admin, name, msgs)
    workers = [Worker(UrlConnector(RedisSettings(cluster.url(), cluster=True)), [count_spec(name)],
                      fast_options(f"late-{i}", batch=16)) for i in range(2)]
    run_in_threads(workers, timeout=40)
    final = {m["id"]: m["label"] for m in msgs if "label" in m}
    late = [m["id"] for m in msgs if "label" not in m][:10]
    moved = [i for i in final][:5]
    labels = [{"ref": i, "label": "spam"} for i in late] + \
        [{"ref": i, "label": "news" if final[i] != "news" else "ham"} for i in moved]
    produce(admin, name, labels)
    run_in_threads(workers, timeout=40)
    for w in workers:
        w.shutdown()
    final |= {lab["ref"]: lab["label"] for lab in labels}
    expected = [dict({k: v for k, v in m.items() if k != "label"}, label=final[m["id"]])
                for m in msgs if m["id"] in final]
    model, _ = load_model(admin, name)
    assert_same_stats(model, offline_model("multinomial", {"n_features": 1024}, FEATURIZER, expected))
    assert int(admin.get(ModelKeys(name).learnt)) == len(final)
    assert admin.xlen(ModelKeys(name).dead) == 0
    assert cluster.refusals() == []


def test_the_ordering_wait_reads_the_log_in_one_pipeline_on_a_cluster(cluster):
    """``Replica.catch_up(block_ms=...)``: XREAD BLOCK with the checks behind it in one
    pipeline, sent to the node of the model's slot, as the worker's login (ACL)."""
    import numpy as np

    from streamnb.models import make_model
    from streamnb_workers.replication.replica import Replica, encode_delta
    from streamnb_workers.store.model_config import ModelSpec, ensure_config

    client = RedisSettings(cluster.url(), cluster=True).make_client()
    spec = ModelSpec("blocking", kind="multinomial", model_params={"n_features": 4},
                     featurizer_config={"input": "dense", "dim": 4})
    cfg = ensure_config(client, spec)
    keys = ModelKeys("blocking")
    rep = Replica(client, keys, cfg).load()
    assert rep.catch_up(block_ms=30) == 0 and rep.waited_s >= 0.02
    X, y = np.array([[1.0, 0, 2, 0], [0, 3, 0, 1]]), ["a", "b"]
    cluster.admin().xadd(keys.log, {"data": encode_delta(
        make_model("multinomial", n_features=4).batch_stats(X, y), None, 2, "w", "b1"),
        "inflight": "w|1-0"})
    batches: set[str] = set()
    assert rep.catch_up(batches=batches, block_ms=30) == 1 and batches == {"w|1-0"}
    ref = make_model("multinomial", n_features=4).partial_fit(X, y)
    np.testing.assert_array_equal(rep.model.predict_log_proba(X), ref.predict_log_proba(X))
    assert cluster.refusals() == []


def test_a_connector_reaches_the_cluster_through_the_nodes_it_knew(cluster):
    """After a failover the URL's node may be the master that died: a connector makes new
    clients from the nodes its last client knew as well (tests/faults/test_cluster_failover.py
    kills that node; here the URL names a port where nothing listens)."""
    live = UrlConnector(RedisSettings(cluster.url(), cluster=True))
    live.client()
    assert sorted(port for _, port in live.known_nodes) == sorted(n.port for n in cluster.nodes)
    dead_url = f"redis://{WORKER_USER}:{WORKER_PASSWORD}@127.0.0.1:{cluster_ports(1)[0]}/0"
    dead = UrlConnector(RedisSettings(dead_url, cluster=True))
    with pytest.raises(redis.ConnectionError, match="cannot be reached"):
        dead.client()
    dead.known_nodes = live.known_nodes
    client = dead.client()
    assert client.xlen(ModelKeys("known-nodes").input) == 0
    assert dead.reader(100).ping()


def test_wrong_password_on_a_cluster_fails_at_once(cluster):
    t0 = time.monotonic()
    with pytest.raises(redis.AuthenticationError, match="refused the credentials") as info:
        RedisSettings(cluster.url(password="wrong"), cluster=True).make_client()
    assert time.monotonic() - t0 < 1.0
    assert is_access_error(info.value) and "wrong" not in str(info.value)


def test_cluster_flag_against_a_plain_server_says_so(redis_server):
    with pytest.raises(SettingsError, match="not a Redis Cluster node"):
        RedisSettings(redis_server.url, cluster=True).make_client()
