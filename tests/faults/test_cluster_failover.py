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

from faults.harness import K, check_guarantees, last_log_id, produce_mixed, stream_state, wait_for
from streamnb_workers.keys import GROUP
from streamnb_workers.replies import as_str
from streamnb_workers.stream_ids import parse_id

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


def test_kill_9_of_the_master_loses_acknowledged_commits_relearnt_once(cluster, threads):
    slot = slot_of(K.input)
    master, replica = (cluster.node(p) for p in cluster.serving(slot)[:2])
    survivor = next(i for i, n in enumerate(cluster.nodes) if n is not master)
    admin = cluster.admin(node=survivor)
    msgs = token_messages(4000, seed=23, labelled_share=0.9)
    produce_mixed(admin, msgs[:3000])
    # the input itself is not what this test loses: it reaches the replica first
    wait_for(lambda: repl_offset(replica) >= repl_offset(master), 10, "the replica in sync")
    url = master.url_for(WORKER_USER, WORKER_PASSWORD)
    a, b = (threads.spawn(url, c, cluster=True) for c in ("a", "b"))
    reps = [a.models, b.models]
    wait_for(lambda: admin.xlen(K.out) >= 600, 30, "some progress",
             state=lambda: stream_state(admin, threads))
    cut_replication(replica)
    at_cut = parse_id(last_log_id(admin))  # >= the last log entry the replica holds
    out_at_cut = admin.xlen(K.out)
    wait_for(lambda: admin.xlen(K.out) >= out_at_cut + 300, 30, "commits the replica lacks")
    # both replicas must have applied entries the replica lacks (on a loaded machine the
    # workers can lag the stream, which would make the scenario vacuous)
    wait_for(lambda: min(parse_id(m["mail"].replica.version) for m in reps if m) > at_cut, 30,
             "both replicas ahead of the cut", state=lambda: stream_state(admin, threads))
    master.stop(9)
    t_kill = time.monotonic()
    ahead = max((m["mail"].replica.version for m in reps), key=parse_id)
    assert parse_id(ahead) > at_cut
    cluster.wait_ok("the replica was not promoted", timeout=30)
    failover_s = time.monotonic() - t_kill
    assert cluster.serving(slot)[0] == replica.port
    # the log entry the workers had applied last is not on the new master
    assert admin.xrange(K.log, min=ahead, max=ahead) == []
    produce_mixed(admin, msgs[3000:], 3000)
    wait_for(lambda: done(admin, len(msgs)), 60, "every entry processed after the failover",
             state=lambda: stream_state(admin, threads))
    wait_for(lambda: {m["mail"].replica.version for m in reps} == {last_log_id(admin)}, 10,
             "both replicas at the last log entry", state=lambda: stream_state(admin, threads))
    threads.stop_all()
    for c in ("a", "b"):  # the connection errors were counted and survived
        assert threads.metric(c, "redis_errors", kind="connection") >= 1
    # each worker saw the log go back behind its replica, and rebuilt it
    assert min(m["mail"].replica.rewinds for m in reps) >= 1, threads.describe()
    entry_ids = [as_str(e) for e, _ in admin.xrange(K.input)]
    check_guarantees(admin, msgs, entry_ids, [m["mail"].replica for m in reps])
    assert cluster.refusals() == []
    print(f"failover took {failover_s:.1f}s after the kill (node timeout {NODE_TIMEOUT_MS} ms)")


def done(client, n: int) -> bool:
    """Every one of ``n`` inputs delivered and acknowledged. (A cluster pipeline returns
    XINFO GROUPS unparsed, so this reads one by one: the delivery mark first, then the
    pending count, so a batch read in between still shows as pending.)"""
    last = client.xrevrange(K.input, count=1)
    groups = {as_str(g["name"]): g for g in client.xinfo_groups(K.input)}
    if client.xlen(K.input) < n or not last or GROUP not in groups:
        return False
    delivered = parse_id(groups[GROUP]["last-delivered-id"]) >= parse_id(last[0][0])
    return delivered and int(client.xpending(K.input, GROUP)["pending"]) == 0
