"""Replicas (snapshot + log, in log order) and the snapshot lease, on fakeredis and real Redis."""

from __future__ import annotations

import numpy as np

from streamnb.models import make_model
from streamnb_workers.replication.replica import Replica, encode_decay, encode_delta
from streamnb_workers.replication.snapshotter import Snapshotter
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config
from tests.helpers.workers import assert_same_stats

K = ModelKeys("rep")
SPEC = ModelSpec("rep", kind="multinomial", model_params={"n_features": 6},
                 featurizer_config={"input": "dense", "dim": 6})


def _batches(seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(20):
        X = rng.integers(0, 4, size=(5, 6)).astype(float)
        y = list(rng.choice(["a", "b"], size=5))
        yield X, y


def _write_log(r, cfg):
    """Deltas of 20 batches, a correction and a decay; returns the offline equivalent."""
    scratch = make_model("multinomial", n_features=6)
    ref = make_model("multinomial", n_features=6)
    for X, y in _batches():
        r.xadd(K.log, {"data": encode_delta(scratch.batch_stats(X, y), None, 5, "w", "b")})
        ref.partial_fit(X, y)
    X = np.array([[1.0, 0, 0, 2, 0, 0]])
    r.xadd(K.log, {"data": encode_delta(scratch.batch_stats(X, ["b"]), scratch.batch_stats(X, ["a"]),
                                        0, "w", "c")})
    ref.partial_fit(X, ["b"]).unlearn(X, ["a"])
    r.xadd(K.log, {"data": encode_decay(0.5)})
    ref.decay(0.5)
    return ref


def test_replica_applies_the_log_in_order(r):
    cfg = ensure_config(r, SPEC)
    ref = _write_log(r, cfg)
    rep = Replica(r, K, cfg).load()
    assert_same_stats(rep.model, ref)
    assert rep.version == r.xrevrange(K.log, count=1)[0][0].decode()
    assert rep.learnt == 100


def test_snapshot_trim_and_late_joiner(r):
    cfg = ensure_config(r, SPEC)
    ref = _write_log(r, cfg)
    early = Replica(r, K, cfg).load()
    snap = Snapshotter(r, K, "w1", margin_ms=0)
    assert snap.hold_lease() and snap.write(early)
    assert r.xlen(K.log) == 1  # only the entry at the snapshot id itself remains
    late = Replica(r, K, cfg).load()
    assert late.version == early.version and late.reloads == 1
    assert_same_stats(late.model, ref)
    # more log after the snapshot: both converge to the same statistics
    scratch = make_model("multinomial", n_features=6)
    X = np.eye(6)
    r.xadd(K.log, {"data": encode_delta(scratch.batch_stats(X, ["a"] * 6), None, 6, "w", "x")})
    ref.partial_fit(X, ["a"] * 6)
    for rep in (early, late):
        rep.catch_up()
        assert_same_stats(rep.model, ref)
    assert early.version == late.version


def test_a_replica_behind_the_trim_point_reloads_the_snapshot(r):
    cfg = ensure_config(r, SPEC)
    behind = Replica(r, K, cfg).load()  # version 0-0, then the log grows and gets trimmed
    ref = _write_log(r, cfg)
    ahead = Replica(r, K, cfg).load()
    snap = Snapshotter(r, K, "w1", margin_ms=0)
    snap.hold_lease()
    assert snap.write(ahead)
    behind.catch_up()
    assert behind.reloads == 1 and behind.version == ahead.version
    assert_same_stats(behind.model, ref)


def test_a_blocking_catch_up_waits_for_the_log_and_applies_what_the_wait_read(r):
    """``catch_up(block_ms=...)``: the wait and the read are one XREAD BLOCK; it applies
    what came as the XRANGE tail does, and names the announcements of the commits."""
    cfg = ensure_config(r, SPEC)
    rep = Replica(r, K, cfg).load()
    assert rep.catch_up(block_ms=20) == 0 and rep.version == "0-0"  # nothing came
    assert rep.waited_s >= 0.015
    ref = _write_log(r, cfg)
    X, y = next(_batches(seed=3))
    scratch = make_model("multinomial", n_features=6)
    r.xadd(K.log, {"data": encode_delta(scratch.batch_stats(X, y), None, 5, "w", "n"),
                   "inflight": "w|9-0"})
    ref.partial_fit(X, y)
    batches: set[str] = set()
    executed = []
    real_pipeline = r.pipeline

    def counting_pipeline(*args, **kw):
        pipe = real_pipeline(*args, **kw)
        real_execute = pipe.execute
        pipe.execute = lambda *a, **k: executed.append(1) or real_execute(*a, **k)
        return pipe

    rep.client = type("Counting", (), {"pipeline": staticmethod(counting_pipeline)})()
    assert rep.catch_up(batches=batches, block_ms=20) == 23 and batches == {"w|9-0"}
    assert len(executed) == 1  # the wait, the entries and the checks: one round trip
    assert_same_stats(rep.model, ref)
    assert rep.version == r.xrevrange(K.log, count=1)[0][0].decode()


def test_a_blocking_catch_up_behind_the_trim_point_reloads_the_snapshot(r):
    """The trim mark is read behind the blocking read: entries after a gap are never
    applied (the model reloads the snapshot, then reads on)."""
    cfg = ensure_config(r, SPEC)
    behind = Replica(r, K, cfg).load()
    ref = _write_log(r, cfg)
    ahead = Replica(r, K, cfg).load()
    snap = Snapshotter(r, K, "w1", margin_ms=0)
    snap.hold_lease()
    assert snap.write(ahead)
    behind.catch_up(block_ms=20)
    assert behind.reloads == 1 and behind.version == ahead.version
    assert_same_stats(behind.model, ref)


def test_only_the_lease_holder_writes_and_snapshots_only_move_forward(r):
    cfg = ensure_config(r, SPEC)
    _write_log(r, cfg)
    rep = Replica(r, K, cfg).load()
    old = Replica(r, K, cfg)
    old.catch_up(limit=3)
    a, b = Snapshotter(r, K, "a", margin_ms=0), Snapshotter(r, K, "b", margin_ms=0)
    assert a.hold_lease() and not b.hold_lease()
    assert not b.write(rep)  # not the holder
    assert a.write(rep)
    a.release()
    assert b.hold_lease()
    assert not b.write(old)  # older than the stored snapshot: refused
    assert r.hget(K.snapshot, "log_id").decode() == rep.version


def test_a_dead_consumer_is_removed_only_with_nothing_pending(r):
    """The lease holder removes consumers without a heartbeat, idle and with nothing
    pending. The pending check and the delete are one script: a consumer that reads a batch
    after the holder listed it idle keeps it (XGROUP DELCONSUMER would drop it from the
    group's pending list, and nobody would ever process it)."""
    from streamnb_workers.replication.snapshotter import (
        delete_consumer_if_idle,
        remove_dead_consumers,
    )
    from streamnb_workers.store.keys import GROUP

    r.xgroup_create(K.input, GROUP, id="0", mkstream=True)
    ids = [r.xadd(K.input, {"data": b"x"}) for _ in range(3)]
    r.xreadgroup(GROUP, "idle", {K.input: ">"}, count=1)
    r.xack(K.input, GROUP, ids[0])
    r.xreadgroup(GROUP, "busy", {K.input: ">"}, count=1)
    assert delete_consumer_if_idle(r, K, "busy") is False
    assert delete_consumer_if_idle(r, K, "idle") is True
    assert {c["name"] for c in r.xinfo_consumers(K.input, GROUP)} == {b"busy"}

    # the holder's listing says "late" has nothing pending; it reads a batch before the delete
    r.xreadgroup(GROUP, "late", {K.input: ">"}, count=1)
    listed = [{"name": b"late", "pending": 0, "idle": 10**9}]
    view = type("Listing", (), {"__getattr__": lambda _, a: getattr(r, a),
                                "xinfo_consumers": lambda _, *a: listed})()
    assert remove_dead_consumers(view, K, 30.0, "holder") == []
    assert [p["consumer"] for p in r.xpending_range(K.input, GROUP, "-", "+", 10)] == \
        [b"busy", b"late"]


def test_score_codes_enter_the_window_and_bad_ones_skip_the_entry(r):
    spec = ModelSpec("win", kind="multinomial", model_params={"n_features": 6},
                     featurizer_config={"input": "dense", "dim": 6},
                     decision={"target_fpr": 0.1, "score_window": 100})
    cfg = ensure_config(r, spec)
    keys = ModelKeys("win")
    scratch = make_model("multinomial", n_features=6)
    X = np.ones((2, 6))
    r.xadd(keys.log, {"data": encode_delta(scratch.batch_stats(X, ["a", "b"]), None, 2, "w", "1",
                                           score_codes=[5, 3000])})
    r.xadd(keys.log, {"data": encode_delta(None, None, 0, "w", "2", score_codes=[7])})  # codes alone
    bad = encode_delta(scratch.batch_stats(X, ["a", "b"]), None, 2, "w", "3", score_codes=[1])
    r.xadd(keys.log, {"data": bad.replace(b"\xa1h\x91\x01", b"\xa1h\x91\xff")})  # code -1
    rep = Replica(r, keys, cfg).load()
    assert rep.scores.total == 3 and rep.scores.ring[:3].tolist() == [5, 3000, 7]
    assert rep.corrupt_entries == 1 and rep.model.class_count_.sum() == 2  # (not merged)
