"""Pipelined commits (WorkerOptions.send_ahead) against a real redis-server.

While a full batch's commit script runs in Redis, the worker decodes and featurizes the
next batch (read before the commit, or behind the previous one); it reads the commit's
reply before predicting. These tests
check that this changes nothing a user sees: the same predictions and statistics as one
batch after the other, every message once after a warm stop, and exactly-once learning
when the connection drops with a commit on the wire.
"""

from __future__ import annotations

import threading
import time

import msgpack
import pytest
import redis

import streamnb_workers.worker.commit_wire as commit_wire
import streamnb_workers.worker.committing as committing
from streamnb_workers.replication.ordering import decode_announcement
from streamnb_workers.replication.replica import Replica
from streamnb_workers.store.commit import SentCommit
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.worker import intake
from streamnb_workers.worker.intake import ReadBatch
from streamnb_workers.worker.runtime import ModelRuntime
from tests.helpers.workers import (
    PARAMS,
    assert_same_stats,
    count_spec,
    fast_options,
    offline_model,
    produce,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis

BATCH = 25


def _messages() -> list[dict]:
    msgs = token_messages(400, seed=7, labelled_share=0.7)
    # a delayed label for an earlier message of another batch, and a malformed entry
    msgs[260] = {"ref": "m3", "label": "ham"}
    return msgs


def _produce(client, name: str, msgs: list[dict]) -> None:
    produce(client, name, msgs[:300])
    client.xadd(ModelKeys(name).input, {"data": b"\xc1 not msgpack"})
    produce(client, name, msgs[300:])


def _outputs(client, name: str) -> dict[str, dict]:
    return {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in
                                 client.xrange(ModelKeys(name).out))}


def _count_sends(monkeypatch) -> list[int]:
    sent: list[int] = []
    real = commit_wire.send_commit

    def counting(*args, **kw):
        sent.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(commit_wire, "send_commit", counting)
    return sent


def test_pipelined_worker_predicts_and_learns_what_one_batch_at_a_time_does(redis_server, monkeypatch):
    client = redis_server.client()
    msgs = _messages()
    _produce(client, "piped", msgs)
    _produce(client, "plain", msgs)
    sends = _count_sends(monkeypatch)
    piped = url_worker(redis_server.url, [count_spec("piped")], fast_options("p", batch=BATCH))
    piped.run_until_idle()
    assert len(sends) >= 10  # most of the 17 batches were committed pipelined
    n_sent = len(sends)
    plain = url_worker(redis_server.url, [count_spec("plain")],
                       fast_options("q", batch=BATCH, send_ahead=False))
    plain.run_until_idle()
    assert len(sends) == n_sent  # the other worker never sent one ahead

    a, b = _outputs(client, "piped"), _outputs(client, "plain")
    assert a.keys() == b.keys() and len(a) == 399
    for mid, out in a.items():
        other = b[mid]
        assert (out["label"], out.get("learned"), out.get("true_label")) == \
            (other["label"], other.get("learned"), other.get("true_label")), mid
        assert out["log_proba"] == pytest.approx(other["log_proba"], abs=1e-12), mid
    assert_same_stats(piped.models["piped"].replica.model, plain.models["plain"].replica.model)
    labelled = [m for m in msgs if "tokens" in m and "label" in m]
    relabelled = [dict(m, label="ham") if m.get("id") == "m3" else m for m in labelled]
    assert_same_stats(piped.models["piped"].replica.model,
                      offline_model("multinomial", PARAMS, {"bits": 10, "counts": "raw"}, relabelled))
    for name in ("piped", "plain"):
        k = ModelKeys(name)
        assert client.xlen(k.dead) == 1 and client.xpending(k.input, GROUP)["pending"] == 0
        assert client.hgetall(k.inflight) == {}  # every announcement withdrawn


def test_batches_after_the_first_two_are_read_behind_the_commits(redis_server, monkeypatch):
    """In a backlog, a full batch's commit carries the read of the batch after next
    (workers/store/scripts/read.lua): no read waits on the way, and each of those batches was announced
    in the step that read it."""
    client = redis_server.client()
    _produce(client, "deep", _messages())  # 401 entries (a delayed label, a malformed one)
    sync_reads: list[int] = []
    w = url_worker(redis_server.url, [count_spec("deep")], fast_options("d", batch=BATCH))
    w.start()
    real_read = w.reader.xreadgroup

    def counting(*args, **kw):
        sync_reads.append(1)
        return real_read(*args, **kw)

    monkeypatch.setattr(w.reader, "xreadgroup", counting)
    announced: list[tuple[str, tuple]] = []
    real_take = ModelRuntime.take_read_behind

    def watching(rt, reply):
        field, entries = intake.read_reply(reply)
        if entries:  # the announcement is there the moment the entries are read
            announced.append((field, decode_announcement(client.hget(rt.keys.inflight, field))))
        real_take(rt, reply)

    monkeypatch.setattr(ModelRuntime, "take_read_behind", watching)
    w.run_until_idle()
    # the first batch (blocking read), the second (read before the first commit), then
    # none until the partial batch at the end and the empty read that ends the run
    assert len(sync_reads) <= 4
    assert len(announced) >= 12
    for field, (first, n, _) in announced:
        assert field == f"d|{first}" and n in (BATCH, 1)
    k = ModelKeys("deep")
    assert len(_outputs(client, "deep")) == 399 and client.xpending(k.input, GROUP)["pending"] == 0
    assert client.hgetall(k.inflight) == {}


def test_a_worker_alone_applies_its_own_deltas_without_reading_them_back(redis_server, monkeypatch):
    """Its commit's reply says no log entry came between the model's version and its delta
    (workers/store/scripts/commit.lua), so the worker applies the delta from the bytes it sent: the log
    is not read on the way through a backlog, and the model is the one the log builds,
    bit for bit, at the same version."""
    client = redis_server.client()
    _produce(client, "own", _messages())
    w = url_worker(redis_server.url, [count_spec("own")], fast_options("o", batch=BATCH))
    w.start()
    rt = w.models["own"]
    tails: list[int] = []
    owns: list[bool] = []
    real_tail, real_own = rt.replica.catch_up, rt.replica.apply_own
    monkeypatch.setattr(rt.replica, "catch_up", lambda *a, **kw: tails.append(1) or real_tail(*a, **kw))
    monkeypatch.setattr(rt.replica, "apply_own",
                        lambda *a, **kw: owns.append(real_own(*a, **kw)) or owns[-1])
    w.run_until_idle()
    n_log = client.xlen(ModelKeys("own").log)
    assert n_log >= 15 and owns.count(True) >= n_log - 2  # all but the first one or two
    assert len(tails) <= 5  # the first batch, the end of the backlog and run_until_idle's own
    rebuilt = Replica(client, ModelKeys("own"), rt.config).load()
    assert rebuilt.version == rt.replica.version and rebuilt.learnt == rt.replica.learnt
    assert_same_stats(rt.replica.model, rebuilt.model)
    assert len(_outputs(client, "own")) == 399


def test_two_workers_apply_their_own_deltas_only_right_after_what_they_applied(redis_server,
                                                                                monkeypatch):
    """Two workers taking turns, and three times a commit of the other worker between
    the moment a worker caught up with the log and its own commit: that delta is not
    applied from memory (the entry before it is not applied yet) but read back with the
    other's; both models end as the log builds them, bit for bit."""
    client = redis_server.client()
    _produce(client, "two", _messages())
    a, b = [url_worker(redis_server.url, [count_spec("two")],  # (short waits: turns, not threads)
                       fast_options(name, batch=BATCH, order_wait_ms=20)) for name in ("a", "b")]
    owns: list[bool] = []
    for w in (a, b):
        w.start()
        replica = w.models["two"].replica
        real_own = replica.apply_own
        monkeypatch.setattr(replica, "apply_own",
                            lambda *args, _f=real_own, **kw: owns.append(_f(*args, **kw)) or owns[-1])
    cut_in: list[int] = []
    real_send = committing.send_ahead

    def b_commits_first(rt, batch, built):
        if rt is a.models["two"] and len(cut_in) < 3:  # b predicts and commits a batch,
            cut_in.append(b.step(block_ms=5))            # its commit lands, then a's
            committing.settle(b.models["two"])
        real_send(rt, batch, built)

    monkeypatch.setattr(committing, "send_ahead", b_commits_first)
    quiet = 0
    while quiet < 2:  # until a round where neither had anything left (read ahead included)
        quiet = quiet + 1 if sum(w.step(block_ms=5) for w in (a, b)) == 0 else 0
    for w in (a, b):
        w.run_until_idle()
    assert len(cut_in) == 3 and all(cut_in)
    assert owns.count(True) >= 5 and owns.count(False) >= 3  # (at least the 3 above)
    rebuilt = Replica(client, ModelKeys("two"), a.models["two"].config).load()
    for w in (a, b):
        replica = w.models["two"].replica
        assert (replica.version, replica.learnt) == (rebuilt.version, rebuilt.learnt)
        assert_same_stats(replica.model, rebuilt.model)
    assert len(_outputs(client, "two")) == 399


def test_with_other_workers_about_no_batch_is_read_behind_a_commit(redis_server, monkeypatch):
    """Ordered predictions make other workers wait for this one's earlier batches: a
    batch read behind a commit is committed a batch later, so they would wait longer.
    Another worker's fresh heartbeat, or its batch in ``{M}:inflight``, turns it off."""
    from streamnb_workers.replication.ordering import InflightBoard

    client = redis_server.client()
    _produce(client, "peers", _messages())
    k = ModelKeys("peers")
    client.hset(k.workers, "other", msgpack.packb({"ts": time.time() + 60}))  # alive meanwhile
    w = url_worker(redis_server.url, [count_spec("peers")], fast_options("p", batch=BATCH))
    sent_after: list[int] = []
    real = commit_wire.send_commit

    def counting(*args, **kw):
        sent_after.append(len(kw.get("after") or (args[7] if len(args) > 7 else [])))
        return real(*args, **kw)

    monkeypatch.setattr(commit_wire, "send_commit", counting)
    w.run_until_idle()
    rt = w.models["peers"]
    assert rt.peers and not rt.alone() and len(sent_after) >= 10 and not any(sent_after)
    assert len(_outputs(client, "peers")) == 399

    rt.peers = False  # the heartbeat gone; now another worker's batch in flight
    assert rt.alone()
    InflightBoard(client, k, "other").announce("1-0", n_entries=5)
    assert rt.inflight.earlier("0-1") == [] and rt.inflight.saw_others() and not rt.alone()
    assert not rt.inflight.saw_others(now=time.time() + rt.inflight.horizon_s + 1)


def test_a_batch_read_behind_a_commit_with_one_already_in_hand_is_redone(redis_server):
    """(Not on the worker's path: a commit is settled only once the batch in hand is
    taken.) The one in hand stays; the other's announcement is withdrawn and its entries,
    pending for this consumer, are read again from the pending list."""
    client = redis_server.client()
    produce(client, "twice", token_messages(10, seed=4))
    w = url_worker(redis_server.url, [count_spec("twice")], fast_options("t", batch=BATCH))
    w.start()
    rt = w.models["twice"]
    rt.pending_phase, rt.read_ahead = False, ReadBatch([], None)
    reply = intake.read_now(client, rt.keys, "t", 5, True)
    field, entries = intake.read_reply(reply)
    assert len(entries) == 5 and client.hexists(rt.keys.inflight, field)
    rt.take_read_behind(reply)
    assert rt.read_ahead == ReadBatch([], None) and rt.pending_phase
    assert not client.hexists(rt.keys.inflight, field) and field not in rt.inflight.fields
    rt.read_ahead = None
    w.run_until_idle()
    assert len(_outputs(client, "twice")) == 10 and client.xpending(rt.keys.input, GROUP)["pending"] == 0


def test_a_batch_read_behind_a_commit_without_its_script_is_announced_by_the_worker(redis_server):
    """After a restart of Redis the announcing script is gone: inside the MULTI it fails
    alone, the read still returns the batch, and the worker announces it itself (the
    announcement ordering.py writes) and loads the script for the next read."""
    client = redis_server.client()
    produce(client, "noscript", token_messages(10, seed=6))
    w = url_worker(redis_server.url, [count_spec("noscript")], fast_options("t", batch=BATCH))
    w.start()
    rt = w.models["noscript"]
    rt.pending_phase = False
    client.script_flush()
    reply = intake.read_now(client, rt.keys, "t", 5, True)
    assert isinstance(reply[0], redis.exceptions.NoScriptError)
    rt.take_read_behind(reply)
    entries, field = rt.read_ahead.entries, rt.read_ahead.announced
    assert len(entries) == 5 and field == f"t|{entries[0][0].decode()}"
    assert field in rt.inflight.fields
    assert decode_announcement(client.hget(rt.keys.inflight, field))[0] == entries[0][0].decode()
    assert client.script_exists(intake.READ_SCRIPT.sha) == [True]
    rt.read_ahead = None
    rt.inflight.withdraw(field)
    w.run_until_idle()
    assert len(_outputs(client, "noscript")) == 10


def test_a_warm_stop_commits_the_batch_read_ahead(redis_server, monkeypatch):
    client = redis_server.client()
    msgs = token_messages(300, seed=3)
    produce(client, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w", batch=BATCH))
    real = committing.send_ahead

    def stop_after_read_ahead(rt, batch, built):  # SIGTERM arrives while a commit is on the wire
        real(rt, batch, built)
        assert rt.read_ahead is not None
        w.request_stop()

    monkeypatch.setattr(committing, "send_ahead", stop_after_read_ahead)
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    t.join(30)
    assert not t.is_alive()
    k = ModelKeys("mail")
    outs = _outputs(client, "mail")
    # the batch committed, the one read ahead and the one read behind its commit (the batch
    # read ahead was full), nothing more: what was read is committed, nothing stays pending
    assert len(outs) == 3 * BATCH
    assert client.xpending(k.input, GROUP)["pending"] == 0
    assert int(client.get(k.learnt)) == 3 * BATCH and client.hgetall(k.inflight) == {}


def test_a_connection_lost_with_a_commit_on_the_wire_learns_every_message_once(redis_server,
                                                                                 monkeypatch):
    client = redis_server.client()
    msgs = token_messages(600, seed=5, labelled_share=0.8)
    produce(client, "mail", msgs)
    real_result = SentCommit.result
    broken: list[int] = []

    def drop_connection_once(self):
        if not broken and self.conn is not None:
            broken.append(1)
            self.conn.disconnect()  # the reply is lost; the script may have run
        return real_result(self)

    monkeypatch.setattr(SentCommit, "result", drop_connection_once)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w", batch=BATCH))
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    k = ModelKeys("mail")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if client.xlen(k.out) >= len(msgs) and client.xpending(k.input, GROUP)["pending"] == 0:
            break
        time.sleep(0.05)
    w.request_stop()
    t.join(30)
    assert broken and not t.is_alive()
    labelled = [m for m in msgs if "label" in m]
    assert int(client.get(k.learnt)) == len(labelled)  # once each, not twice, not never
    assert sorted(_outputs(client, "mail")) == sorted(m["id"] for m in msgs)
    w.models["mail"].replica.catch_up()
    assert_same_stats(w.models["mail"].replica.model,
                      offline_model("multinomial", PARAMS, {"bits": 10, "counts": "raw"}, labelled))
    assert [msgpack.unpackb(f[b"data"])["t"] for _, f in client.xrange(k.log)].count("delta") \
        == client.xlen(k.log)


def test_every_stage_of_a_pipelined_batch_is_timed(redis_server, monkeypatch):
    """The stage histogram accounts for the whole batch: send is timed once per pipelined
    commit, score once per commit, observe once per batch with predictions."""
    from prometheus_client import CollectorRegistry

    from streamnb_workers.observe.metrics import Metrics

    client = redis_server.client()
    _produce(client, "timed", _messages())
    sends = _count_sends(monkeypatch)
    registry = CollectorRegistry()
    w = url_worker(redis_server.url, [count_spec("timed")], fast_options("t", batch=BATCH),
                   Metrics(registry))
    w.run_until_idle()

    def count(stage: str) -> float:
        return registry.get_sample_value("streamnb_stage_duration_seconds_count",
                                         {"model": "timed", "worker": "t", "stage": stage}) or 0.0

    commits = registry.get_sample_value("streamnb_commits_total", {"model": "timed", "worker": "t"})
    assert commits >= 16
    assert count("send") == len(sends) >= 10
    assert count("score") == commits
    assert commits - 1 <= count("observe") <= commits  # the first batch has no class to predict
    for stage in ("read", "decode", "featurize", "predict", "learn", "commit", "apply"):
        assert count(stage) > 0, stage
