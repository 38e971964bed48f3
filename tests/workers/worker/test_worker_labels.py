"""Delayed labels, corrections and reference expiry: exactly once, against a real redis-server."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest

from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    assert_same_stats,
    cached,
    cached_learnt,
    count_spec,
    fast_options,
    offline_model,
    produce,
    run_in_threads,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis



def _with_labels(msgs: list[dict], labels: dict[str, str]) -> list[dict]:
    out = []
    for m in msgs:
        m = {k: v for k, v in m.items() if k != "label"}
        if m["id"] in labels:
            m["label"] = labels[m["id"]]
        out.append(m)
    return out


def _dead(r, name="mail"):
    return [decode_output(f[b"data"]) for _, f in r.xrange(ModelKeys(name).dead)]


def test_delayed_label_correction_repeat_and_expiry(redis_server):
    r = redis_server.client()
    k = ModelKeys("mail")
    msgs = token_messages(10, seed=2, labelled_share=0.0)
    produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1"))
    w.run_until_idle()
    model = w.models["mail"].replica
    assert model.learnt == 0 and r.xlen(k.log) == 0

    # delayed labels: learnt from the cached features, without resending the message
    produce(r, "mail", [{"ref": "m0", "label": "spam"}, {"ref": "m1", "label": "ham"}])
    w.run_until_idle()
    assert_same_stats(model.model, offline_model("multinomial", PARAMS, FCFG,
                                                 _with_labels(msgs, {"m0": "spam", "m1": "ham"})))
    assert model.learnt == 2
    assert cached_learnt(r, "mail", "m0") == "spam"

    # a correction moves m0's contribution from spam to ham (spam keeps its zero-weight row)
    produce(r, "mail", [{"ref": "m0", "label": "ham"}])
    w.run_until_idle()
    ref = offline_model("multinomial", PARAMS, FCFG, _with_labels(msgs, {"m0": "ham", "m1": "ham"}))
    got = model.model
    assert got.stats["classes"].as_dict() == {"spam": 0.0, "ham": 2.0}
    np.testing.assert_array_equal(
        got.stats["features"].toarray()[got.stats["features"].labels.index("ham")],
        ref.stats["features"].toarray()[0])
    assert not got.stats["features"].toarray()[got.stats["features"].labels.index("spam")].any()
    assert model.learnt == 2  # a correction learns no new message

    # the same label again: a no-op (no log entry at all)
    n_log = r.xlen(k.log)
    produce(r, "mail", [{"ref": "m0", "label": "ham"}, {"ref": "m0", "label": "ham"}])
    w.run_until_idle()
    assert r.xlen(k.log) == n_log

    # unknown reference -> dead letter ref_expired; nothing else changes
    produce(r, "mail", [{"ref": "never-seen", "label": "spam"}])
    w.run_until_idle()
    dead = _dead(r)
    assert [d["reason"] for d in dead] == ["ref_expired"]
    assert "never-seen" in dead[0]["detail"]
    assert r.xlen(k.log) == n_log
    # ref messages get no prediction; every payload message got exactly one
    assert r.xlen(k.out) == 10


def test_cache_ttl_expiry_gives_ref_expired(redis_server):
    r = redis_server.client()
    produce(r, "mail", [{"id": "a", "tokens": ["cheap", "meds"]}])
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", cache_ttl_s=0.2))
    w.run_until_idle()
    assert cached(r, "mail", "a") is not None
    time.sleep(0.4)
    produce(r, "mail", [{"ref": "a", "label": "spam"}])
    w.run_until_idle()
    assert [d["reason"] for d in _dead(r)] == ["ref_expired"]
    assert w.models["mail"].replica.learnt == 0


def test_label_in_the_same_batch_as_its_message(redis_server):
    r = redis_server.client()
    msgs = [{"id": "x", "tokens": ["cheap", "meds"]}, {"ref": "x", "label": "spam"},
            {"id": "y", "tokens": ["lunch"], "label": "ham"}, {"ref": "y", "label": "spam"}]
    produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", batch=10))
    w.run_until_idle()
    ref = offline_model("multinomial", PARAMS, FCFG,
                        [{"tokens": ["cheap", "meds"], "label": "spam"},
                         {"tokens": ["lunch"], "label": "spam"}])
    got = w.models["mail"].replica.model
    assert got.stats["classes"].as_dict()["spam"] == 2.0
    np.testing.assert_array_equal(got.stats["features"].toarray()[got.stats["features"].labels.index("spam")],
                                  ref.stats["features"].toarray()[0])
    assert cached_learnt(r, "mail", "y") == "spam"


def test_concurrent_labels_and_corrections_are_applied_exactly_once(redis_server, monkeypatch):
    delayed_calls = []
    from streamnb_workers.observe import observer

    monkeypatch.setattr(observer.ModelObserver, "score_delayed",
                        lambda self, classes, lp, truth, delays: delayed_calls.append(list(truth)))
    r = redis_server.client()
    k = ModelKeys("mail")
    msgs = token_messages(200, seed=4, labelled_share=0.3)
    produce(r, "mail", msgs)
    workers = [url_worker(redis_server.url, [count_spec()], fast_options(f"w{i}", batch=9))
               for i in range(3)]
    run_in_threads(workers)  # (a label must come after its message was processed)
    rng = np.random.default_rng(0)
    labels = []
    for _ in range(600):  # labels, relabels and repeats for random messages, in random order
        labels.append({"ref": f"m{int(rng.integers(200))}", "label": str(rng.choice(["spam", "ham", "news"]))})
    produce(r, "mail", labels)
    run_in_threads(workers)
    # the final learnt label of every message, as the cache says; the model must equal an
    # offline fit of exactly those (message, label) pairs
    final = {}
    for m in msgs:
        lab = cached_learnt(r, "mail", m["id"])
        if lab is not None:
            final[m["id"]] = lab
    ref = offline_model("multinomial", PARAMS, FCFG, _with_labels(msgs, final))
    for w in workers:
        got = w.models["mail"].replica.model
        counts = got.stats["classes"].as_dict()
        assert {c: v for c, v in counts.items() if v} == ref.stats["classes"].as_dict()
        for lab in ref.stats["classes"].labels:
            np.testing.assert_array_equal(
                got.stats["features"].toarray()[got.stats["features"].labels.index(lab)],
                ref.stats["features"].toarray()[ref.stats["features"].labels.index(lab)])
    assert int(r.get(k.learnt)) == len(final)
    # every message unlabelled at arrival and labelled later was scored once as a delayed label
    # (only those predicted by a fitted model: the very first batches had no prediction)
    predicted = {o["id"] for o in (decode_output(f[b"data"]) for _, f in r.xrange(k.out))
                 if o["log_proba"]}
    first_labelled_later = ({lab["ref"] for lab in labels} & predicted) - \
        {m["id"] for m in msgs if "label" in m}
    assert sum(len(c) for c in delayed_calls) == len(first_labelled_later)
    assert not _dead(r)
    _ = msgpack  # keep the import for readers decoding entries by hand


def test_without_caching_labelled_messages_delayed_labels_still_work(redis_server):
    """--no-cache-labelled: only messages not learnt on arrival are cached. A delayed label
    for one of them is learnt (and can then be corrected); a correction of a message learnt
    on arrival goes to :dead as ref_expired, saying why."""
    r = redis_server.client()
    msgs = token_messages(40, seed=4, labelled_share=0.5)
    labelled = [m["id"] for m in msgs if "label" in m]
    unlabelled = [m["id"] for m in msgs if "label" not in m]
    assert labelled and unlabelled
    produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", cache_labelled=False))
    w.run_until_idle()
    assert all(cached(r, "mail", i) is not None for i in unlabelled)
    assert not any(cached(r, "mail", i) is not None for i in labelled)

    late, moved = unlabelled[0], labelled[0]
    old = next(m["label"] for m in msgs if m["id"] == moved)
    new = "ham" if old != "ham" else "spam"
    produce(r, "mail", [{"ref": late, "label": "news"}, {"ref": moved, "label": new}])
    w.run_until_idle()
    model = w.models["mail"].replica
    assert model.learnt == len(labelled) + 1
    expected = {m["id"]: m["label"] for m in msgs if "label" in m} | {late: "news"}
    assert_same_stats(model.model, offline_model("multinomial", PARAMS, FCFG, _with_labels(msgs, expected)))
    dead = _dead(r)
    assert [d["reason"] for d in dead] == ["ref_expired"]
    assert "--no-cache-labelled" in dead[0]["detail"] and repr(moved) in dead[0]["detail"]
    produce(r, "mail", [{"ref": late, "label": "spam"}])  # the delayed label can be corrected
    w.run_until_idle()
    expected[late] = "spam"
    assert_same_stats(model.model, offline_model("multinomial", PARAMS, FCFG, _with_labels(msgs, expected)))
    assert model.learnt == len(labelled) + 1 and len(_dead(r)) == 1


def test_a_commit_sends_its_ids_in_stream_order(redis_server, monkeypatch):
    """A batch mixing payloads, a dead letter and a delayed label commits its ids in the
    order they were read (the commit script's ownership check takes the first and the
    last as its range), not payloads first, then dead letters, then labels."""
    import streamnb_workers.worker.committing as committing

    r = redis_server.client()
    produce(r, "mail", token_messages(3, seed=4))
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", send_ahead=False))
    w.run_until_idle()
    ids = [r.xadd(ModelKeys("mail").input, {"data": b"not msgpack \xc1"}).decode()]
    ids += produce(r, "mail", [{"ref": "m0", "label": "ham"}])
    ids += produce(r, "mail", token_messages(2, seed=5))
    ids += [r.xadd(ModelKeys("mail").input, {"data": b"\xc1"}).decode()]
    ids += produce(r, "mail", [{"ref": "m1", "label": "spam"}])
    sent = []
    real = committing.commit_batch

    def spy(client, keys, consumer, req, *args):
        sent.append(list(req.ids))
        return real(client, keys, consumer, req, *args)

    monkeypatch.setattr(committing, "commit_batch", spy)
    w.run_until_idle()
    assert sent == [ids]
    assert [d["reason"] for d in _dead(r)] == ["not_msgpack", "not_msgpack"]
    assert r.xpending(ModelKeys("mail").input, GROUP)["pending"] == 0
