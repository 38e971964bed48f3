"""A worker with ``per_user_s`` serves the per-user models registered for its models and
predicts a user's messages with the global statistics plus the user's: equal to one model
fitted offline on the union, also for a global model of K shards; below the minimum
weight, the global model's own predictions (fakeredis, in process)."""

from __future__ import annotations

import fakeredis
import msgpack
import pytest
from prometheus_client import CollectorRegistry

from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.replication.shards import shard_names
from streamnb_workers.store.connection import ClientConnector
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import read_config
from streamnb_workers.store.user_models import register
from streamnb_workers.wire.codec import decode_input, encode_input
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.worker import Worker
from tests.helpers.workers import count_spec, fast_options

GLOBAL = [("cheap pills now", "spam"), ("meeting notes attached", "ham"),
          ("cheap money offer", "spam"), ("lunch on friday", "ham")]
ALICE = [("meeting offer", "spam"), ("friday pills", "ham"), ("notes money", "spam")]
USER = "doc.u.alice_40b.org"


def send(r, keys: ModelKeys, items, prefix: str) -> None:
    for i, (text, label) in enumerate(items):
        r.xadd(keys.input, {"data": msgpack.packb({"id": f"{prefix}{i}", "text": text,
                                                   "label": label})})


def outputs(r, model: str) -> dict:
    return {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in
                                 r.xrange(ModelKeys(model).out))}


def offline(r, items):
    cfg = read_config(r, "doc")
    model, fz = cfg.make_model(), cfg.make_featurizer()
    rows = [fz.featurize(decode_input(encode_input("text", t), "1-0").as_payload()) for t, _ in items]
    model.partial_fit(fz.stack(rows), [label for _, label in items])
    return model, fz


@pytest.mark.parametrize("shards", [1, 2])
def test_a_users_prediction_is_the_unions_and_below_the_weight_the_globals(shards):
    r = fakeredis.FakeRedis()
    w = Worker(ClientConnector(r), [count_spec("doc", shards=shards)],
               fast_options("w1", per_user_s=0.001, user_min_weight=3),
               Metrics(CollectorRegistry()))
    w.start()
    for j, name in enumerate(shard_names("doc", shards)):
        send(r, ModelKeys(name), GLOBAL[j::shards], f"g{j}-")
    w.run_until_idle()
    register(r, "doc", USER)
    w.step(0)
    assert USER in w.models and read_config(r, USER).kind == "multinomial"
    user = ModelKeys(USER)
    query = [("cheap meeting offer", None)]
    # two messages learnt: weight 2 < 3, the user's part is left out
    send(r, user, ALICE[:2], "a")
    w.run_until_idle()
    send(r, user, query, "q1-")
    for name in shard_names("doc", shards):
        send(r, ModelKeys(name), query, f"q1-{name}-")
    w.run_until_idle()
    mine = outputs(r, USER)["q1-0"]
    theirs = [o for name in shard_names("doc", shards) for i, o in outputs(r, name).items()
              if i.startswith("q1-")]
    assert all(o["log_proba"] == mine["log_proba"] for o in theirs)
    # a third: the user's statistics count, as one model fitted on everything would
    send(r, user, ALICE[2:], "b")
    w.run_until_idle()
    send(r, user, query, "q2-")
    w.run_until_idle()
    got = outputs(r, USER)["q2-0"]["log_proba"]
    model, fz = offline(r, GLOBAL + ALICE)
    X = fz.stack([fz.featurize(decode_input(encode_input("text", query[0][0]), "1-0").as_payload())])
    expected = dict(zip(model.classes_, model.predict_log_proba(X)[0], strict=True))
    assert got.keys() == expected.keys()
    for label, value in expected.items():
        assert got[label] == pytest.approx(value, rel=1e-12, abs=1e-12)
    assert got != mine["log_proba"]
    # the global model learnt nothing of the user's
    assert sum(w.models[n].replica.learnt for n in shard_names("doc", shards)) == len(GLOBAL)
