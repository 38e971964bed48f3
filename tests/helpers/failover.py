"""A Redis Cluster failover: replication offsets, cut replication."""

from __future__ import annotations

import time

import pytest

from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import parse_id
from tests.faults.harness import (
    K,
    check_guarantees,
    drained,
    last_log_id,
    produce_mixed,
    stream_state,
    wait_for,
)
from tests.helpers.acl import ADMIN_PASSWORD, WORKER_PASSWORD, WORKER_USER
from tests.helpers.cluster import REDIS_CLI, Cluster, slot_of
from tests.helpers.redis_server import REDIS_SERVER
from tests.helpers.workers import token_messages

NODE_TIMEOUT_MS = 1000


@pytest.fixture
def cluster(tmp_path):
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("redis-server and redis-cli are needed for a cluster")
    # validity factor 0: a replica fails over however long its link has been down (the
    # test cuts it on purpose; a real replica may lag for other reasons)
    c = Cluster(tmp_path, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS,
                extra=["--cluster-replica-validity-factor", "0"])
    try:
        yield c.start()
    finally:
        c.stop()


def repl_offset(node) -> int:
    info = node.client().info("replication")
    return int(info["master_repl_offset"] if info["role"] == "master" else info["slave_repl_offset"])


def cut_replication(replica) -> None:
    """The replica loses its master's stream and cannot get it back (it can no longer log in)."""
    c = replica.client()
    c.config_set("masterauth", "not-" + ADMIN_PASSWORD)
    c.execute_command("CLIENT", "KILL", "TYPE", "master")
    wait_for(lambda: c.info("replication")["master_link_status"] == "down", 10, "the link down")


class Failover:
    """Two worker threads on model ``mail`` of ``cluster``, their URL naming the master of
    the model's slot; ``msgs[:3000]`` produced first (and replicated), the rest after the
    failover."""

    def __init__(self, cluster: Cluster, threads, seed: int) -> None:
        self.cluster, self.threads = cluster, threads
        self.slot = slot_of(K.input)
        self.master, self.replica = (cluster.node(p) for p in cluster.serving(self.slot)[:2])
        self.admin = cluster.admin(node=next(i for i, n in enumerate(cluster.nodes)
                                             if n is not self.master))
        self.msgs = token_messages(4000, seed=seed, labelled_share=0.9)
        produce_mixed(self.admin, self.msgs[:3000])
        # the input itself is not what these tests lose: it reaches the replica first
        wait_for(lambda: repl_offset(self.replica) >= repl_offset(self.master), 10,
                 "the replica in sync")
        url = self.master.url_for(WORKER_USER, WORKER_PASSWORD)
        self.workers = [threads.spawn(url, c, cluster=True) for c in ("a", "b")]
        self.wait(lambda: self.admin.xlen(K.out) >= 600, "some progress")

    def wait(self, cond, what: str, timeout: float = 30) -> None:
        wait_for(cond, timeout, what, state=lambda: stream_state(self.admin, self.threads))

    @property
    def replicas(self) -> list:
        return [w.models["mail"].replica for w in self.workers]

    def kill_master(self) -> tuple[str, float, float]:
        """``kill -9`` of the master; returns the most advanced worker's version at the
        kill, the seconds until the replica is promoted, and until a worker commits again."""
        self.master.stop(9)
        t_kill = time.monotonic()
        ahead = max((r.version for r in self.replicas), key=parse_id)
        self.cluster.wait_ok("the replica was not promoted", timeout=30)
        promoted = time.monotonic() - t_kill
        assert self.cluster.serving(self.slot)[0] == self.replica.port
        learnt = int(self.admin.get(K.learnt) or 0)
        self.wait(lambda: int(self.admin.get(K.learnt) or 0) > learnt, "a commit after the failover")
        return ahead, promoted, time.monotonic() - t_kill

    def finish(self) -> None:
        """The rest of the input, then every fault test's end checks."""
        admin = self.admin
        produce_mixed(admin, self.msgs[3000:], 3000)
        self.wait(lambda: drained(admin, len(self.msgs)), "every entry processed after the failover", 60)
        self.wait(lambda: {r.version for r in self.replicas} == {last_log_id(admin)},
                  "both replicas at the last log entry", 10)
        self.threads.stop_all()
        for c in ("a", "b"):  # the connection errors were counted and survived
            assert self.threads.metric(c, "redis_errors", kind="connection") >= 1
        entry_ids = [as_str(e) for e, _ in admin.xrange(K.input)]
        check_guarantees(admin, self.msgs, entry_ids, self.replicas)
        assert self.cluster.refusals() == []


MAX_LAG_S = 1
