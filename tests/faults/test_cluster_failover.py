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

from streamnb_workers.wire.stream_ids import entry_time, parse_id
from tests.faults.harness import (
    K,
    last_log_id,
)
from tests.helpers.failover import MAX_LAG_S, NODE_TIMEOUT_MS, Failover, cut_replication

pytestmark = [pytest.mark.slow, pytest.mark.redis]


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
