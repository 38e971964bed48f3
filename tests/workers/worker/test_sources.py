"""Sources, through workers against a real redis-server: what each source taught is kept
apart, ``forget --source`` takes one out exactly, once and identically on every replica
(the statistics digest of a run that only learnt the others), a key a forgotten source
taught is learnt again when sent again, a user's label replaces what autolearn learnt
for the same key, and the number of sources is bounded."""

from __future__ import annotations

import fakeredis
import msgpack
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from benchmarks.replay_digest import stats_arrays, stats_digest
from streamnb.models import dumps as dump_model
from streamnb_workers.client.forget import forget_source
from streamnb_workers.client.status import collect
from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.replication.replica import Replica, encode_delta
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config
from streamnb_workers.wire.learn_keys import decode_record, encode_record, record_teacher
from streamnb_workers.wire.outputs import decode_dead, decode_output
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    count_spec,
    fast_options,
    learnt_model,
    offline_model,
    produce,
    run_in_threads,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis


def _workers(url: str, name: str = "mail", n: int = 2, **kw):
    return [url_worker(url, [count_spec(name)], fast_options(f"w{i}", batch=17, **kw),
                       Metrics(CollectorRegistry())) for i in range(n)]


def _digest(model) -> str:
    return stats_digest(stats_arrays(model.stats))


def _taught(msgs: list[dict], source: str | None) -> list[dict]:
    return [{**m, "source": source} if source else dict(m) for m in msgs]


def _replica_digests(ws, name: str = "mail") -> set[str]:
    for w in ws:
        w.models[name].tail()
    return {_digest(w.models[name].replica.model) for w in ws}


@pytest.fixture
def two_sources(redis_server):
    """Model "mail" taught by sources ``imap`` and ``bulk`` (half the messages each, in
    one stream), by two workers."""
    r = redis_server.client()
    msgs = token_messages(160, classes=("spam", "ham"), seed=31)
    imap, bulk = msgs[::2], msgs[1::2]
    mixed = [m for pair in zip(_taught(imap, "imap"), _taught(bulk, "bulk"), strict=True)
             for m in pair]
    produce(r, "mail", mixed)
    ws = _workers(redis_server.url)
    run_in_threads(ws)
    return r, ws, imap, bulk


def test_forgetting_a_source_leaves_the_statistics_of_a_run_without_it(redis_server, two_sources):
    r, ws, imap, bulk = two_sources
    both = offline_model("multinomial", PARAMS, FCFG, imap + bulk)
    assert _replica_digests(ws) == {_digest(both)}
    weights = collect(r, "mail")["sources"]
    assert set(weights) == {"default", "imap", "bulk"}
    assert sum(weights["imap"].values()) == sum(m.get("label") is not None for m in imap)
    assert sum(weights["default"].values()) == 0

    # the run that only learnt bulk's messages, without any source: a model of its own
    produce(r, "only", bulk)
    only = _workers(redis_server.url, "only")
    run_in_threads(only)
    want = _digest(learnt_model(r, "only")[0])
    assert want == _digest(offline_model("multinomial", PARAMS, FCFG, bulk))

    forget_source(r, "mail", "imap")
    assert _replica_digests(ws) == {want}                 # every replica, bit for bit
    assert _digest(learnt_model(r, "mail")[0]) == want    # and snapshot + log
    assert "imap" not in collect(r, "mail")["sources"]

    forget_source(r, "mail", "imap")                      # nothing left to take out
    assert _replica_digests(ws) == {want}

    # what imap taught counts as not learnt any more: sent again, it is learnt again
    produce(r, "mail", [{**m, "id": m["id"] + "-again"} for m in _taught(imap, "imap")])
    run_in_threads(ws)
    assert _replica_digests(ws) == {_digest(offline_model("multinomial", PARAMS, FCFG,
                                                          imap + bulk))}
    outs = [decode_output(f[b"data"]) for _, f in r.xrange(ModelKeys("mail").out)]
    again = [o for o in outs if o["id"].endswith("-again") and o.get("true_label") is not None]
    assert again and all(o["learned"] and "reason" not in o for o in again)
    key = next(m["key"] for m in imap if m.get("label") is not None)
    assert record_teacher(r.hget(ModelKeys("mail").learnt_keys, key)) == ("imap", 2)


def test_a_forget_of_one_message_after_its_source_was_forgotten_unlearns_nothing(
        redis_server, two_sources):
    r, ws, imap, bulk = two_sources
    forget_source(r, "mail", "bulk")
    gone = next(m for m in bulk if m.get("label") is not None)
    produce(r, "mail", [{**gone, "forget": True, "id": "f1"}])
    run_in_threads(ws)
    # a worker that knew of the forget when it built the commit dead-letters it as
    # not_learnt; one that did not yet subtracts under bulk's old epoch, which every
    # replica skips: either way nothing is taken off twice
    dead = [decode_dead(f[b"data"]) for _, f in r.xrange(ModelKeys("mail").dead)]
    assert [d["reason"] for d in dead] in ([], ["not_learnt"])
    assert _replica_digests(ws) == {_digest(offline_model("multinomial", PARAMS, FCFG, imap))}
    assert _digest(learnt_model(r, "mail")[0]) == _digest(
        offline_model("multinomial", PARAMS, FCFG, imap))


def test_a_user_label_replaces_what_autolearn_learnt_for_the_key(redis_server):
    r = redis_server.client()
    cfg = ensure_config(r, count_spec())
    msgs = token_messages(40, classes=("spam", "ham"), seed=7)
    produce(r, "mail", msgs)
    ws = _workers(redis_server.url)
    run_in_threads(ws)
    # autolearn learnt one unlabelled message as spam (its delta and its key, as a worker
    # with --autolearn writes them)
    auto = {"id": "auto1", "key": "auto-k1", "tokens": ["cheap", "meds", "today"]}
    model = cfg.make_model()
    row = ws[0].models["mail"].featurizer.featurize(
        __import__("streamnb.features", fromlist=["Payload"]).Payload("tokens", auto["tokens"]))
    delta = model.batch_stats(ws[0].models["mail"].featurizer.stack([row]), ["spam"])
    r.xadd(ModelKeys("mail").log, {"data": encode_delta(None, None, 1, "w0", "b", 0,
                                                        [(("autolearn", 0), delta, None)])})
    r.hset(ModelKeys("mail").learnt_keys, "auto-k1", encode_record("spam", 1.0, ("autolearn", 0)))
    assert set(collect(r, "mail")["sources"]) == {"default", "autolearn"}
    # the user labels it spam too: the autolearnt contribution is moved, not added to
    produce(r, "mail", [{**auto, "label": "spam", "source": "imap"}])
    run_in_threads(ws)
    want = offline_model("multinomial", PARAMS, FCFG, msgs + [{**auto, "label": "spam"}])
    assert _replica_digests(ws) == {_digest(want)}
    weights = collect(r, "mail")["sources"]
    assert sum(weights["autolearn"].values()) == 0 and weights["imap"] == {"spam": 1.0}
    assert record_teacher(r.hget(ModelKeys("mail").learnt_keys, "auto-k1"))[0] == "imap"
    assert decode_record(r.hget(ModelKeys("mail").learnt_keys, "auto-k1")) == ("spam", 1.0)
    forget_source(r, "mail", "autolearn")                 # changes nothing any more
    assert _replica_digests(ws) == {_digest(want)}


def test_sources_beyond_the_bound_and_bad_names_are_dead_letters(redis_server):
    r = redis_server.client()
    msgs = token_messages(12, classes=("spam", "ham"), seed=3)
    for m in msgs:
        m["label"] = m.get("label") or "ham"
    sent = [{**msgs[0], "source": "a"}, {**msgs[1], "source": "b"}, {**msgs[2], "source": "a"},
            {**msgs[3], "source": "bad name"}, {**msgs[4], "source": "autolearn"},
            {**msgs[5], "source": "default"}, msgs[6]]
    produce(r, "mail", sent)
    ws = _workers(redis_server.url, n=1, max_sources=2)   # default + a
    run_in_threads(ws)
    dead = {d["entry"]: d for d in (decode_dead(f[b"data"])
                                    for _, f in r.xrange(ModelKeys("mail").dead))}
    reasons = sorted(d["reason"] for d in dead.values())
    assert reasons == ["bad_source", "bad_source", "too_many_sources"]
    assert set(collect(r, "mail")["sources"]) == {"default", "a"}
    want = offline_model("multinomial", PARAMS, FCFG, [msgs[0], msgs[2], msgs[5], msgs[6]])
    assert _replica_digests(ws) == {_digest(want)}


def test_the_parts_by_source_survive_a_snapshot():
    r = fakeredis.FakeRedis()
    cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 2}))
    keys = ModelKeys("doc")
    rep = Replica(r, keys, cfg).load()
    a = rep.model.batch_stats(np.array([[1.0, 0, 2, 0]]), ["ham"])
    b = rep.model.batch_stats(np.array([[0, 3.0, 0, 1]]), ["spam"])
    r.xadd(keys.log, {"data": encode_delta(a, None, 1, "w", "1", 0, [(("x", 0), b, None)])})
    rep.catch_up()
    r.hset(keys.snapshot, mapping={"log_id": rep.version, "data": dump_model(rep.model),
                                   "ts": "0", "sources": rep.sources.encode()})
    loaded = Replica(r, keys, cfg).load()
    assert loaded.sources.weights(loaded.model) == {"default": {"ham": 1.0}, "x": {"spam": 1.0}}
    r.xadd(keys.log, {"data": msgpack.packb({"t": "forget", "s": "x"})})
    loaded.catch_up()
    assert loaded.model.stats["features"].toarray().tolist() == [[1.0, 0.0, 2.0, 0.0]]


def test_a_snapshot_written_back_after_redis_lost_it_keeps_the_parts():
    from streamnb_workers.worker.restore import restore_model_keys

    r = fakeredis.FakeRedis()
    cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 2}))
    r.delete(ModelKeys("doc").config)
    assert restore_model_keys(r, cfg, "w1", "5-0", b"five", 1000, 0, b"parts")[0] == "config"
    assert r.hget(ModelKeys("doc").snapshot, "sources") == b"parts"


def test_autolearn_learns_confident_verdicts_and_is_taken_out_exactly(redis_server):
    r = redis_server.client()
    msgs = token_messages(160, classes=("spam", "ham"), seed=41)
    labelled, unlabelled = msgs[:60], [{k: v for k, v in m.items() if k != "label"}
                                       for m in msgs[60:]]
    produce(r, "mail", labelled)
    produce(r, "mail", unlabelled)
    ws = _workers(redis_server.url, autolearn=True, autolearn_score=0.05,
                  autolearn_min_class_weight=5, autolearn_per_batch=10)
    run_in_threads(ws)
    outs = {o["id"]: o for o in (decode_output(f[b"data"])
                                 for _, f in r.xrange(ModelKeys("mail").out))}
    auto = [outs[m["id"]] for m in unlabelled if outs[m["id"]].get("reason") == "autolearnt"]
    assert auto and all(o["learned"] and "true_label" not in o for o in auto)
    weights = collect(r, "mail")["sources"]
    assert sum(weights["autolearn"].values()) == len(auto)
    assert len(_replica_digests(ws)) == 1                 # replicas identical
    # a user's label for an autolearnt message replaces it, whatever label autolearn gave
    first = next(m for m in unlabelled if outs[m["id"]].get("reason") == "autolearnt")
    produce(r, "mail", [{**first, "id": "user1", "label": "ham"}])
    run_in_threads(ws)
    assert sum(collect(r, "mail")["sources"]["autolearn"].values()) == len(auto) - 1
    # forget it all: the statistics of the run that only learnt the labels
    forget_source(r, "mail", "autolearn")
    want = offline_model("multinomial", PARAMS, FCFG, labelled + [{**first, "label": "ham"}])
    assert _replica_digests(ws) == {_digest(want)}
    assert _digest(learnt_model(r, "mail")[0]) == _digest(want)


def test_a_sharded_model_forgets_a_source_in_every_shard():
    from streamnb_workers.replication.shards import keys_of, load_replicas, shard_spec

    r = fakeredis.FakeRedis()
    cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 2},
                                     shards=2))
    for j, keys in enumerate(keys_of("doc", 2)):
        shard_cfg = ensure_config(r, shard_spec(cfg, keys.name))
        stats = shard_cfg.make_model().batch_stats(np.array([[1.0 + j, 0, 0, 1]]), ["ham"])
        r.xadd(keys.log, {"data": encode_delta(stats, None, 1, "w", "b", 0,
                                               [(("x", 0), stats.copy(), None)])})
    assert len(forget_source(r, "doc", "x")) == 2
    model, _, replicas = load_replicas(r, "doc")
    assert model.stats["features"].toarray().tolist() == [[3.0, 0.0, 0.0, 2.0]]
    assert all(rep.epochs == {"x": 1} for rep in replicas)


def test_a_class_removed_leaves_every_part_and_a_later_sub_of_it_is_skipped():
    from streamnb_workers.replication.replica import encode_class_drop

    r = fakeredis.FakeRedis()
    cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 2}))
    keys = ModelKeys("doc")
    rep = Replica(r, keys, cfg).load()
    ham = rep.model.batch_stats(np.array([[1.0, 0, 2, 0]]), ["ham"])
    typo = rep.model.batch_stats(np.array([[0, 3.0, 0, 1]]), ["Spam"])
    r.xadd(keys.log, {"data": encode_delta(ham, None, 2, "w", "1", 0, [(("x", 0), typo, None)])})
    r.xadd(keys.log, {"data": encode_class_drop("Spam")})
    # a batch built before the removal takes a Spam row off x: it went with the class
    r.xadd(keys.log, {"data": encode_delta(None, None, 0, "w", "2", 0, [(("x", 0), None, typo)])})
    rep.catch_up()
    assert rep.corrupt_entries == 0
    assert rep.sources.weights(rep.model) == {"default": {"ham": 1.0}, "x": {}}
    assert rep.model.stats["classes"].labels == ["ham"]
    r.xadd(keys.log, {"data": msgpack.packb({"t": "forget", "s": "x"})})
    rep.catch_up()
    assert rep.model.stats["features"].toarray().tolist() == [[1.0, 0.0, 2.0, 0.0]]
