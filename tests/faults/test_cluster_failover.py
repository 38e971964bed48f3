"""Fault 7: the master of a model's slot killed (``kill -9``) mid-stream on a Redis Cluster
of 3 masters and 3 replicas; its replica is promoted and the workers go on.

Replication is asynchronous: a commit acknowledged by the master may never reach its
replica. The test makes that loss certain: it cuts the replica's link to the master (the
replica can no longer log in), lets the workers commit a few hundred more messages on the
master alone, then kills the master. The promoted replica lacks those commits (their log
entries, acknowledgements and outputs alike, one script each), so the messages come back
and are learnt again; the workers, whose replicas applied the lost log entries, must see
that the log went back and reload, or they would count those messages twice. The workers'
URL names the master that is killed, so they follow the cluster's new topology, not the
URL. The end checks are every fault test's (faults.harness.check_guarantees).
"""

from __future__ import annotations

import time

import pytest
from _redis_server import REDIS_SERVER
from _worker_helpers import token_messages
from test_acl_worker import ADMIN_PASSWORD, WORKER_PASSWORD, WORKER_USER
from test_cluster import REDIS_CLI, Cluster, slot_of

from faults.harness import (
    K,
    check_guarantees,
    drained,
    last_log_id,
    produce_mixed,
    stream_state,
    wait_for,
)
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import entry_time, parse_id

pytestmark = [pytest.mark.slow, pytest.mark.redis]

#: How long a master may be unreachable before its replica takes over (redis.conf's
#: default is 15 s; small here so the test runs in seconds).
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


def test_kill_9_of_the_master_loses_acknowledged_commits_relearnt_once(cluster, threads):
    run = Failover(cluster, threads, seed=23)
    cut_replication(run.replica)
    at_cut = parse_id(last_log_id(run.admin))  # >= the last log entry the replica holds
    out_at_cut = run.admin.xlen(K.out)
    run.wait(lambda: run.admin.xlen(K.out) >= out_at_cut + 300, "commits the replica lacks")
    # both replicas must have applied entries the replica lacks (on a loaded machine the
    # workers can lag the stream, which would make the scenario vacuous)
    run.wait(lambda: min(parse_id(r.version) for r in run.replicas) > at_cut,
             "both replicas ahead of the cut")
    rebuilt = [r.rewinds + r.reloads for r in run.replicas]
    ahead, promoted_s, resumed_s = run.kill_master()
    assert parse_id(ahead) > at_cut
    # the log entry the workers had applied last is not on the new master
    assert run.admin.xrange(K.log, min=ahead, max=ahead) == []
    run.finish()
    # each worker rebuilt its replica: it found the log gone back behind it, or (if
    # another worker had written a snapshot and trimmed the log on the new master first)
    # the log trimmed past its version
    assert all(r.rewinds + r.reloads > n for r, n in zip(run.replicas, rebuilt, strict=True)), \
        threads.describe()
    assert sum(r.rewinds for r in run.replicas) >= 1, threads.describe()
    # and each told its metrics (streamnb_log_rewinds_total)
    assert sum(threads.metric(c, "log_rewinds") for c in threads.workers) == \
        sum(r.rewinds for r in run.replicas)
    print(f"replica promoted {promoted_s:.1f}s after the kill, workers committing again after "
          f"{resumed_s:.1f}s (node timeout {NODE_TIMEOUT_MS} ms)")


#: ``min-replicas-max-lag`` of the second test, in seconds.
MAX_LAG_S = 1


def test_min_replicas_to_write_bounds_what_a_cut_off_replica_lacks(cluster, threads):
    """With ``min-replicas-to-write 1``, a master whose replica is cut off refuses writes
    (``NOREPLICAS``): at once here, since the replica's connection is closed (a silent link
    would take ``min-replicas-max-lag`` plus the second between acknowledgements, the bound
    checked). The workers back off meanwhile and go on after the failover."""
    run = Failover(cluster, threads, seed=24)
    master = run.master.client()
    master.config_set("min-replicas-max-lag", MAX_LAG_S)
    master.config_set("min-replicas-to-write", 1)
    cut_replication(run.replica)
    t_cut = time.time()
    refused = lambda: sum(threads.metric(c, "redis_errors", kind="other") for c in ("a", "b"))  # noqa: E731
    run.wait(lambda: refused() >= 2, "writes refused for want of a replica")
    time.sleep(1.0)  # refusals go on: nothing more is written
    last_written = entry_time(last_log_id(run.admin))
    assert last_written - t_cut <= MAX_LAG_S + 1.5, (last_written - t_cut)
    run.kill_master()
    run.finish()
    print(f"the master took writes for {last_written - t_cut:.1f}s after the cut "
          f"(min-replicas-max-lag {MAX_LAG_S})")
