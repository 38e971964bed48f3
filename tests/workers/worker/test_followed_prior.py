"""A prior that follows the traffic (``--prior-half-life``) against a real redis-server:
two workers give every entry the prior, probability and verdict one worker gives it, as
the score window has them one message at a time, and the prior travels in the log and the
snapshot (streamnb/operating_point.py; docs/worker.md, "Operating point")."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamnb.calibration import adjust_to_prior
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

HALF_LIFE = 40.0
DECISION = {"min_class_weight": None, "calibration": "isotonic", "score_window": 300,
            "prior_half_life": HALF_LIFE}
N = 600


def _messages() -> list[dict]:
    """Spam and ham whose mix moves from 1 in 5 spam to 4 in 5, a third with the tokens
    of one of the other class too and a label in 9 flipped (so that scores overlap and
    the calibrated probability has a middle), a fifth unlabelled."""
    pool = token_messages(3 * N, classes=("spam", "ham"), seed=11)
    by = {c: [m for m in pool if m["label"] == c] for c in ("spam", "ham")}
    rng = np.random.default_rng(4)
    out = []
    for i in range(N):
        share = 0.2 if i < N // 2 else 0.8
        out.append(by["spam" if rng.random() < share else "ham"].pop())
    for i, m in enumerate(out):
        if i % 3 == 1:
            m["tokens"] = m["tokens"] + by["ham" if m["label"] == "spam" else "spam"].pop()["tokens"]
        if i % 9 == 0:
            m["label"] = "ham" if m["label"] == "spam" else "spam"
        if rng.random() < 0.2:
            del m["label"]
    return out


def _outputs(client, name: str) -> dict[str, dict]:
    return {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in
                                 client.xrange(f"streamnb:{{{name}}}:out"))}


@pytest.fixture(scope="module")
def runs():
    """The same messages through two workers (batches of 50) and one (batches of 7)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        client = server.client()
        msgs = _messages()
        produce(client, "pair", msgs)
        produce(client, "solo", msgs)
        # (a wait for the other's earlier batch that a loaded host never gives up)
        pair = [url_worker(server.url, [count_spec("pair", decision=dict(DECISION))],
                           fast_options(name, batch=50, **IN_ORDER))
                for name in ("a", "b")]
        run_in_threads(pair)
        registry = CollectorRegistry()
        solo = url_worker(server.url, [count_spec("solo", decision=dict(DECISION))],
                          fast_options("c", batch=7), metrics=Metrics(registry))
        run_in_threads([solo])
        solo.registry = registry
        yield client, _outputs(client, "pair"), _outputs(client, "solo"), msgs, pair[0], solo


def test_two_workers_give_every_entry_the_prior_of_one(runs):
    _, pair, solo, msgs, *_ = runs
    assert len(pair) == len(solo) == N
    assert {o["worker"] for o in pair.values()} == {"a", "b"}  # both predicted
    with_prior = [m["id"] for m in msgs if "prior" in solo[m["id"]]]
    assert len(with_prior) > N - 150  # all from the first fit of the window (100 labels)
    for mid in with_prior:
        for key in ("prior", "proba", "label", "score"):
            assert pair[mid][key] == solo[mid][key], (mid, key)
    for m in msgs:
        assert ("prior" in pair[m["id"]]) == ("prior" in solo[m["id"]])
    # it followed the mix: about 1/5 spam, then about 4/5
    early = [solo[m["id"]]["prior"] for m in msgs[N // 2 - 50:N // 2]]
    late = [solo[m["id"]]["prior"] for m in msgs[-50:]]
    assert max(early) < 0.45 < 0.6 < min(late)


def test_priors_and_verdicts_are_those_of_the_window_one_at_a_time(runs):
    _, _, solo, msgs, *_ = runs
    window = ScoreWindow(size=DECISION["score_window"], score="per_feature",
                         calibration="isotonic")
    neg = pos = 0.0
    decay = 0.5 ** (1.0 / HALF_LIFE)
    moved = 0
    for m in msgs:
        o = solo[m["id"]]
        if "score" not in o:
            continue
        point = window.point
        if "prior" in o:
            prior = (pos + 1.0) / (neg + pos + 2.0)
            assert o["prior"] == prior
            fitted = (point.n_positive + 1.0) / (point.n_positive + point.n_negative + 2.0)
            p = adjust_to_prior(float(point.calibrator(o["score"])), fitted, prior)
            assert o["proba"] == p
            assert o["label"] == ("spam" if p > 0.5 else "ham")
            moved += o["label"] != ("spam" if o["score"] > 0 else "ham")
        else:
            assert not (point.n_negative and point.n_positive)
        if m.get("label") in ("spam", "ham"):
            window.add([window.code(o["score"], m["label"] == "spam")])
            spam = 1.0 if m["label"] == "spam" else 0.0
            neg, pos = decay * neg + (1.0 - spam), decay * pos + spam
    assert window.total > 400
    assert moved > 0  # some verdict is the moved probability's, not the score's sign


def test_a_replica_from_the_log_or_a_snapshot_holds_the_same_prior(runs):
    client, _, _, _, worker, _ = runs
    keys = ModelKeys("pair")
    cfg = read_config(client, "pair")
    held = worker.models["pair"].replica
    held.catch_up()
    from_log = Replica(client, keys, cfg).load()
    assert from_log.scores.prior == held.scores.prior is not None
    assert from_log.scores.to_bytes() == held.scores.to_bytes()
    client.delete(keys.lease)  # (the workers are stopped; their lease had not expired)
    snap = Snapshotter(client, keys, "snapper", lease_ms=5000)
    assert snap.hold_lease() and snap.write(from_log)
    from_snapshot = Replica(client, keys, cfg).load()
    assert from_snapshot.scores.recent == from_log.scores.recent


def test_the_gauge_says_the_prior_in_use(runs):
    *_, worker = runs
    value = worker.registry.get_sample_value
    assert value("streamnb_operating_prior", {"model": "solo", "worker": "c"}) == \
        worker.models["solo"].replica.scores.prior
