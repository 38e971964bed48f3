"""Fault 8: a model of 3 statistics shards on a Redis Cluster of 3 masters and 3 replicas;
the master of one shard's slot killed (``kill -9``) mid-stream, its replica promoted.

The model ``mail`` is stored with ``shards`` 3 (workers/replication/shards.py): shards ``mail|0.4``,
``mail|1.1`` and ``mail|2``, each its own hash tag in its own third of the slots, so on
a cluster made by ``redis-cli --cluster create`` each lives on a master of its own
(asserted). Two worker threads serve the model through a cluster client whose URL names
the master that is killed: shard 0's (the master of slot 0, so the clients' default
node) or shard 2's. A producer routes labelled and unlabelled messages (and garbage)
with :class:`Router`: a backlog first (replicated before the workers start, so the kill
loses no input), the rest once the replica is promoted.

The end checks are every fault test's (faults.harness.check_guarantees), per shard
(learnt exactly once, every entry of the shard's ``:in`` with one output in its
``:out`` or a dead letter, the stored shard and each worker's replica of it equal to one
offline fit of the shard's messages), and for the whole model: the sum of the shards
(:func:`load_model`, and each worker's :class:`ShardSum`) equals one offline fit of all
the messages.

While the master is down (from shortly after both workers met the failure until the
replica's promotion), the other two shards' logs are watched: a worker that keeps serving
the shards it can reach makes them grow. (Once the nodes mark the master failed, until
the promotion, the whole cluster answers CLUSTERDOWN: the growth is before that.)
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
import redis

from streamnb_workers.replication.shards import Router, load_model, shard_names, shard_of
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.wire.stream_ids import parse_id
from tests.faults.harness import (
    WorkerThreads,
    check_guarantees,
    drained,
    garbage_positions,
    last_log_id,
    produce_routed,
    stream_state,
    wait_for,
)
from tests.helpers.acl import WORKER_PASSWORD, WORKER_USER
from tests.helpers.cluster import REDIS_CLI, Cluster, slot_of
from tests.helpers.failover import repl_offset
from tests.helpers.redis_server import REDIS_SERVER
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    assert_same_stats,
    count_spec,
    offline_model,
    token_messages,
)

pytestmark = [pytest.mark.slow, pytest.mark.redis]

MODEL = "mail"
SHARDS = 3
#: How long a master may be unreachable before its replica takes over.
NODE_TIMEOUT_MS = 2000
#: Messages in the backlog produced before the workers start, and in all.
BACKLOG, TOTAL = 6000, 7000
#: Outputs (all shards) the workers have written when the master is killed.
KILL_AFTER = 300
#: Seconds after both workers met the failure when the watch of the other shards starts
#: (a batch read or claimed before may still be committed).
SETTLE_S = 0.3


@dataclass
class Outage:
    """What the test saw of the other shards while shard 0's master was down."""

    #: Seconds from the kill until the replica's promotion was seen.
    promoted_s: float = 0.0
    #: Last log id of each other shard once both workers had met the failure, and at the
    #: last look before the promotion was seen.
    log_at_failure: dict[str, str] = field(default_factory=dict)
    log_before_promotion: dict[str, str] = field(default_factory=dict)
    #: Whether each other shard had input left to process once the workers met the failure.
    backlog_at_failure: dict[str, bool] = field(default_factory=dict)
    #: Seconds between those two looks.
    watched_s: float = 0.0


class ShardFailover:
    """Two worker threads on the 3-shard model of ``cluster``, their URL naming the master
    of shard ``victim``'s slot, which is killed; :data:`BACKLOG` messages produced (and
    replicated) first."""

    def __init__(self, cluster: Cluster, threads: WorkerThreads, victim: int, seed: int) -> None:
        self.cluster, self.threads, self.victim = cluster, threads, victim
        self.names = shard_names(MODEL, SHARDS)
        self.keys = [ModelKeys(n) for n in self.names]
        self.slots = [slot_of(k.input) for k in self.keys]
        self.owners = [cluster.owner(s) for s in self.slots]
        assert len(set(self.owners)) == SHARDS, f"shards {self.names} on masters {self.owners}"
        self.others = [k for j, k in enumerate(self.keys) if j != victim]
        self.master, self.replica = (cluster.node(p) for p in cluster.serving(self.slots[victim])[:2])
        self.admin = cluster.admin(node=next(i for i, n in enumerate(cluster.nodes)
                                             if n is not self.master))
        self.router = Router(MODEL, SHARDS)
        self.msgs = token_messages(TOTAL, seed=seed, labelled_share=0.8)
        self.placed = produce_routed(self.admin, self.router, self.msgs[:BACKLOG])
        # the input is not what this test loses: it reaches the replica first
        wait_for(lambda: repl_offset(self.replica) >= repl_offset(self.master), 10,
                 "the replica in sync")
        url = self.master.url_for(WORKER_USER, WORKER_PASSWORD)
        spec = count_spec(MODEL, shards=SHARDS)
        self.workers = [threads.spawn(url, c, cluster=True, spec=spec) for c in ("a", "b")]
        self.wait(lambda: self.outputs() >= KILL_AFTER, "some progress")

    def outputs(self) -> int:
        return sum(self.admin.xlen(k.out) for k in self.keys)

    def state(self) -> str:
        return " | ".join(f"{k.name}: {stream_state(self.admin, None, k)}" for k in self.keys) + \
            " | " + self.threads.describe()

    def wait(self, cond, what: str, timeout: float = 30) -> None:
        wait_for(cond, timeout, what, state=self.state)

    def errors(self) -> list[float]:
        return [self.threads.metric_sum(c, "redis_errors") for c in self.threads.workers]

    def other_logs(self) -> dict[str, str]:
        return {k.name: last_log_id(self.admin, k) for k in self.others}

    def kill_master(self) -> Outage:
        """``kill -9`` of the victim shard's master; watches the other shards' logs from
        :data:`SETTLE_S` after both workers met the failure until the replica's promotion
        is seen, then waits for the cluster to be whole and a commit on the victim shard."""
        errors = self.errors()
        self.master.stop(9)
        t_kill = time.monotonic()
        seen = Outage()
        wait_for(lambda: all(e > e0 for e, e0 in zip(self.errors(), errors, strict=True)), 10,
                 "both workers meeting the failure")
        time.sleep(SETTLE_S)
        seen.log_at_failure, t_failure = self.other_logs(), time.monotonic()
        seen.backlog_at_failure = {k.name: not drained(self.admin, self.shard_inputs(k), k)
                                   for k in self.others}
        t_last = t_failure
        while True:  # a look counts if the replica was not yet promoted after it
            try:
                logs, t_look = self.other_logs(), time.monotonic()
            except redis.RedisError:  # the admin client met the dead node: look again
                logs = None
            if self.promoted():
                break
            if logs is not None:
                seen.log_before_promotion, t_last = logs, t_look
            assert time.monotonic() - t_kill < 30, "the replica was not promoted"
            time.sleep(0.05)
        seen.promoted_s = time.monotonic() - t_kill
        seen.watched_s = t_last - t_failure
        self.cluster.wait_ok("the cluster not whole after the promotion")
        assert self.cluster.serving(self.slots[self.victim])[0] == self.replica.port
        return seen

    def promoted(self) -> bool:
        """The victim's replica has taken over (it knows first: the other nodes learn it
        from the cluster bus, and a worker may reach it before they do)."""
        return self.replica.client().info("replication")["role"] == "master"

    def shard_inputs(self, keys: ModelKeys) -> int:
        return sum(1 for key, _ in self.placed if key == keys.input)

    def finish(self) -> None:
        """A commit on the victim shard after the failover, the rest of the input, every
        entry processed, the workers stopped."""
        victim = self.keys[self.victim]
        # (the workers may have finished the victim's backlog already: the rest of the
        # input, sent now, is what shows the shard committing after the failover)
        learnt = int(self.admin.get(victim.learnt) or 0)
        self.placed += produce_routed(self.admin, self.router, self.msgs[BACKLOG:], BACKLOG)
        for k in self.keys:
            self.wait(lambda k=k: drained(self.admin, self.shard_inputs(k), k),
                      f"every entry of {k.name} processed after the failover", 30)
        assert int(self.admin.get(victim.learnt) or 0) > learnt, \
            f"no commit on {victim.name} after the failover"
        for name, k in zip(self.names, self.keys, strict=True):
            self.wait(lambda n=name, k=k: {w.models[n].replica.version for w in self.workers}
                      == {last_log_id(self.admin, k)}, f"both replicas of {name} at its last entry", 10)
        self.threads.stop_all()

    def shard_share(self, j: int) -> tuple[list[dict], list[str], set[int]]:
        """Shard j's messages in the order sent, their entry ids, and the positions among
        them where garbage went instead."""
        garbage = garbage_positions(len(self.msgs))
        at = [n for n, (key, _) in enumerate(self.placed) if key == self.keys[j].input]
        return ([self.msgs[n] for n in at], [self.placed[n][1] for n in at],
                {i for i, n in enumerate(at) if n in garbage})


def check_shard(run: ShardFailover, j: int) -> None:
    """Every fault test's guarantees for shard j, and: each of its entries has exactly one
    output or dead letter, and every message it predicted was routed to it."""
    name, keys = run.names[j], run.keys[j]
    msgs, entry_ids, garbage = run.shard_share(j)
    check_guarantees(run.admin, msgs, entry_ids, [w.models[name].replica for w in run.workers],
                     name=name, garbage=garbage)
    outs = [decode_output(f[b"data"]) for _, f in run.admin.xrange(keys.out)]
    dead = [decode_output(f[b"data"]) for _, f in run.admin.xrange(keys.dead)]
    per_entry = Counter(o["entry"] for o in outs + dead)
    assert set(per_entry) == set(entry_ids), name
    assert set(per_entry.values()) == {1}, f"{name}: entries with more than one output"
    assert {shard_of(o["id"], SHARDS) for o in outs} == {j}


def check_sum(run: ShardFailover) -> None:
    """The model as a whole: learnt counts add up to the labelled messages, and the sum of
    the shards (stored, and each worker's) equals one offline fit of all the messages."""
    garbage = garbage_positions(len(run.msgs))
    good = [m for i, m in enumerate(run.msgs) if i not in garbage]
    reference = offline_model("multinomial", PARAMS, FCFG, good)
    learnt = sum(int(run.admin.get(k.learnt) or 0) for k in run.keys)
    assert learnt == sum(1 for m in good if m.get("label") is not None)
    model, version = load_model(run.admin, MODEL)
    assert version == ",".join(last_log_id(run.admin, k) for k in run.keys)
    assert_same_stats(model, reference)
    for w in run.workers:
        sums = {id(w.models[n].summed) for n in run.names}
        assert len(sums) == 1, "the shards of one worker share one sum"
        assert_same_stats(w.models[run.names[0]].summed.model, reference)


@pytest.fixture(scope="module", params=[0, 2], ids=["shard0-default-node", "shard2"])
def failover(request, tmp_path_factory):
    """A cluster of 3 masters and 3 replicas and the run on it up to the promotion of the
    replica of shard ``request.param``'s master (the tests below finish it or look at what
    was seen of the outage)."""
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("redis-server and redis-cli are needed for a cluster")
    # validity factor 0: the replica fails over however long ago it last heard its master
    cluster = Cluster(tmp_path_factory.mktemp("acl"), replicas=1, node_timeout_ms=NODE_TIMEOUT_MS,
                      extra=["--cluster-replica-validity-factor", "0"])
    threads = WorkerThreads()
    try:
        cluster.start()
        run = ShardFailover(cluster, threads, victim=request.param, seed=31 + request.param)
        yield run, run.kill_master()
    finally:
        threads.cleanup()
        cluster.stop()


def test_kill_9_of_a_shards_master_each_shard_and_the_sum_learnt_once(failover):
    run, outage = failover
    # what the outage test below needs: time to watch, and work left on the other shards
    assert outage.watched_s >= 0.3, f"the outage was watched for {outage.watched_s:.2f}s only"
    assert all(outage.backlog_at_failure.values()), outage.backlog_at_failure
    run.finish()
    victim = run.names[run.victim]
    for c in run.threads.workers:  # the connection errors were counted and survived
        assert run.threads.metric(c, "redis_errors", model=victim, kind="connection") >= 1
    for j in range(SHARDS):
        check_shard(run, j)
    check_sum(run)
    assert run.cluster.refusals() == []
    print(f"{victim}'s replica promoted {outage.promoted_s:.1f}s after the kill; the other "
          f"shards' logs went from {outage.log_at_failure} to {outage.log_before_promotion} "
          f"in {outage.watched_s:.1f}s of the outage")


def test_the_other_shards_go_on_while_one_master_is_down(failover):
    run, outage = failover
    grown = {n: parse_id(outage.log_before_promotion[n]) > parse_id(outage.log_at_failure[n])
             for n in outage.log_at_failure}
    assert all(grown.values()), (f"logs {outage.log_at_failure} {SETTLE_S}s after the workers "
                                 f"met the failure, {outage.log_before_promotion} "
                                 f"{outage.watched_s:.1f}s later, before the promotion")
