"""The operating point (``--target-fpr``, ``--calibration``) against a real redis-server:
every worker gives an entry the same threshold and probability, whatever the batches and
the number of workers; they are those of the window of the labelled scores before the
entry, one at a time; and a replica rebuilt from the log or a snapshot holds the same
window."""

from __future__ import annotations

import msgpack
import pytest
from prometheus_client import CollectorRegistry

from streamnb.operating_point import ScoreWindow
from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.replication.replica import Replica
from streamnb_workers.replication.snapshotter import Snapshotter
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import read_config
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.redis_server import REDIS_SERVER, RedisServer
from tests.helpers.workers import (
    IN_ORDER,
    count_spec,
    fast_options,
    produce,
    run_in_threads,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis

DECISION = {"min_class_weight": None, "target_fpr": 0.05, "calibration": "isotonic",
            "score_window": 300}
N = 700


def _messages() -> list[dict]:
    msgs = token_messages(N, classes=("spam", "ham"), seed=5, labelled_share=0.8)
    for i, m in enumerate(msgs):  # some ham that looks like spam, so the threshold moves
        if "label" in m and i % 9 == 0:
            m["label"] = "ham" if m["label"] == "spam" else "spam"
    return msgs


def _outputs(client, name: str) -> list[dict]:
    return [decode_output(f[b"data"]) for _, f in client.xrange(f"streamnb:{{{name}}}:out")]


@pytest.fixture(scope="module")
def runs():
    """The same messages through two workers (batches of 50) and through one (batches of
    7); the outputs of each, by message id."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        yield _run(server)


def _run(redis_server, pair_batch=50):
    client = redis_server.client()
    msgs = _messages()
    produce(client, "pair", msgs)
    produce(client, "solo", msgs)
    pair = [url_worker(redis_server.url, [count_spec("pair", decision=dict(DECISION))],
                       fast_options(name, batch=pair_batch, **IN_ORDER))
            for name in ("a", "b")]
    run_in_threads(pair)
    registry = CollectorRegistry()
    solo = url_worker(redis_server.url, [count_spec("solo", decision=dict(DECISION))],
                      fast_options("c", batch=7), metrics=Metrics(registry))
    run_in_threads([solo])
    solo.registry = registry
    return client, {o["id"]: o for o in _outputs(client, "pair")}, \
        {o["id"]: o for o in _outputs(client, "solo")}, msgs, pair[0], solo


def test_two_workers_give_every_entry_the_threshold_of_one(runs):
    _, pair, solo, msgs, *_ = runs
    check_pair_is_solo(pair, solo, msgs)


def test_two_workers_in_batches_of_20_give_every_entry_the_threshold_of_one():
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        _, pair, solo, msgs, *_ = _run(server, pair_batch=20)
    check_pair_is_solo(pair, solo, msgs)


def check_pair_is_solo(pair, solo, msgs):
    assert len(pair) == len(solo) == N
    assert {o["worker"] for o in pair.values()} == {"a", "b"}  # both predicted
    with_threshold = [m["id"] for m in msgs if "threshold" in solo[m["id"]]]
    assert len(with_threshold) > N - 20  # (all but the first, before two classes)
    for mid in with_threshold:
        for key in ("threshold", "proba", "label", "score"):
            assert pair[mid][key] == solo[mid][key], (mid, key)
    thresholds = {solo[mid]["threshold"] for mid in with_threshold}
    assert len(thresholds) > 2  # it moved with the window
    # the verdict is the threshold's
    for mid in with_threshold:
        o = solo[mid]
        assert o["label"] == ("spam" if o["score"] >= o["threshold"] else "ham")
        assert 0.0 < o["proba"] < 1.0


def test_thresholds_are_those_of_the_window_one_at_a_time(runs):
    _, _, solo, msgs, *_ = runs
    window = ScoreWindow(size=DECISION["score_window"], score="per_feature",
                         target_fpr=DECISION["target_fpr"], calibration="isotonic")
    for m in msgs:
        o = solo[m["id"]]
        if "score" not in o:
            continue
        point = window.point
        assert o["threshold"] == point.threshold
        assert o["proba"] == float(point.calibrator(o["score"]))
        if m.get("label") in ("spam", "ham"):
            window.add([window.code(o["score"], m["label"] == "spam")])
    assert window.total > 500


def test_a_replica_from_the_log_or_a_snapshot_holds_the_same_window(runs):
    client, _, _, _, worker, _ = runs
    keys = ModelKeys("pair")
    cfg = read_config(client, "pair")
    held = worker.models["pair"].replica
    held.catch_up()
    from_log = Replica(client, keys, cfg).load()
    assert from_log.scores is not None and from_log.scores.total > 500
    assert held.version == from_log.version
    assert held.scores.to_bytes() == from_log.scores.to_bytes()
    client.delete(keys.lease)  # (the workers are stopped; their lease had not expired)
    snap = Snapshotter(client, keys, "snapper", lease_ms=5000)
    assert snap.hold_lease() and snap.write(from_log)
    assert client.hget(keys.snapshot, "scores") == from_log.scores.to_bytes()
    from_snapshot = Replica(client, keys, cfg).load()
    assert from_snapshot.version == from_log.version
    assert from_snapshot.scores.to_bytes() == from_log.scores.to_bytes()
    assert from_snapshot.scores.point.threshold == from_log.scores.point.threshold


def test_log_entries_carry_the_codes(runs):
    client = runs[0]
    entries = [msgpack.unpackb(f[b"data"], raw=False) for _, f in
               client.xrange("streamnb:{pair}:log")]
    assert sum(len(e.get("h", [])) for e in entries) > 500


def test_the_gauges_say_the_point_in_use(runs):
    _, _, solo, msgs, _, worker = runs
    point = worker.models["solo"].replica.scores.point
    labels = {"model": "solo", "worker": "c"}
    value = worker.registry.get_sample_value
    assert value("streamnb_operating_threshold", labels) == point.threshold
    assert value("streamnb_operating_point_supported", labels) == 1.0  # (>= 59 ham at 0.05)
    assert value("streamnb_operating_point_negatives", labels) == point.n_negative > 59
