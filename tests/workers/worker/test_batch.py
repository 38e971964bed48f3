"""One batch's steps as pure functions (workers/worker/batch.py, workers/worker/commit_content.py), without Redis: decoding,
featurizing, the labels of another type, the predictions (against the library's
one-message-at-a-time loop and numbers worked by hand), and the commit's content."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest

from streamnb.features import Row
from streamnb_workers.store.label_cache import decode_entry, encode_entry, encode_label
from streamnb_workers.store.model_config import ModelSpec, resolve_spec
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.worker.batch import (
    Dead,
    cache_rows,
    decode_entries,
    drop_foreign_labels,
    featurize,
    own_stats,
    predict,
    prediction_plan,
)
from streamnb_workers.worker.commit_content import PredictedBatch, commit_content

# argmax labels from the first class on (no "unsure" while a class has little weight)
CFG = resolve_spec(ModelSpec("b", kind="multinomial", model_params={"alpha": 0.5},
                             featurizer_config={"bits": 8, "counts": "raw"},
                             decision={"min_class_weight": None}))


def _entries(msgs: list) -> list[tuple[bytes, dict]]:
    return [(f"{1000 + i}-0".encode(), {b"data": m if isinstance(m, bytes) else msgpack.packb(m)})
            for i, m in enumerate(msgs)]


def _steps(msgs: list, model=None):
    model = CFG.make_model() if model is None else model
    featurizer = CFG.make_featurizer()
    decoded = decode_entries(_entries(msgs), None, max_deliveries=5)
    return model, featurizer, decoded, featurize(featurizer, decoded)


def _batch(msgs: list, model=None, **kw) -> tuple:
    model, featurizer, decoded, f = _steps(msgs, model)
    p = predict(model, CFG.make_decision_rule(), featurizer, f.items) if f.items else None
    batch = PredictedBatch(order=decoded.order, items=f.items, verdicts=p.verdicts if p else [],
                           refs=f.refs, ref_data=f.ref_data, dead=f.dead, version="7-0",
                           classes=p.classes if p else [], **kw)
    return model, featurizer, batch


def test_decode_keeps_the_order_and_dead_letters_each_bad_entry():
    entries = _entries([{"id": "a", "tokens": ["x"], "zzz": 1}, b"\xc1", {"id": "c", "text": "hi"}])
    entries.insert(1, (b"1000-5", {b"other": b"no data"}))
    decoded = decode_entries(entries, {"1002-0": 6}, max_deliveries=5)
    assert decoded.order == ["1000-0", "1000-5", "1001-0", "1002-0"]
    assert [(d.entry_id, d.reason) for d in decoded.dead] == [
        ("1000-5", "no_data"), ("1001-0", "not_msgpack"), ("1002-0", "poison")]
    assert decoded.dead[2].detail == "delivered 6 times, the limit is 5"
    assert [eid for eid, _, _ in decoded.messages] == ["1000-0"]
    assert decoded.unknown_keys == 1 and not decoded.labelled


def test_featurize_splits_labels_from_payloads_and_dead_letters_what_it_cannot_use():
    _, featurizer, decoded, f = _steps([
        {"id": "a", "tokens": ["x", "y"], "label": "spam"}, {"ref": "a", "label": "ham"},
        {"id": "c", "x": [1.0, 2.0]}, {"id": "d", "text": "hello world"}])
    assert [it.msg.id for it in f.items] == ["a", "d"]
    assert [(r.entry_id, r.ref, r.label) for r in f.refs] == [("1001-0", "a", "ham")]
    assert f.ref_data["1001-0"] == msgpack.packb({"ref": "a", "label": "ham"})
    assert [(d.entry_id, d.reason) for d in f.dead] == [("1002-0", "incompatible_payload")]
    assert f.items[0].row == featurizer.featurize(decoded.messages[0][1].as_payload()) and decoded.labelled


def test_labels_of_another_type_are_dead_letters():
    msgs = [{"id": "a", "tokens": ["x"], "label": 1}, {"id": "b", "tokens": ["y"], "label": "s"},
            {"ref": "a", "label": "t"}, {"id": "d", "tokens": ["z"]}]
    _, _, decoded, f = _steps(msgs)
    kept = drop_foreign_labels([], decoded, f)  # before the first class: the first label's type
    assert [it.msg.id for it in kept.items] == ["a", "d"] and kept.refs == []
    assert [(d.entry_id, d.reason) for d in kept.dead] == [("1001-0", "bad_label"),
                                                           ("1002-0", "bad_label")]
    assert "but this model's labels are int" in kept.dead[0].detail
    kept = drop_foreign_labels(["ham"], decoded, f)  # the model's classes decide
    assert [it.msg.id for it in kept.items] == ["b", "d"] and len(kept.refs) == 1
    assert drop_foreign_labels(["ham"], decoded, f).dead[0].entry_id == "1000-0"


def test_predictions_are_those_of_one_message_at_a_time():
    msgs = [{"id": f"m{i}", "tokens": ["cheap", "meds"] if i % 2 else ["team", "notes", "x"],
             "label": ("spam" if i % 2 else "ham") if i % 3 else None} for i in range(12)]
    model, featurizer, _, f = _steps(msgs)
    p = predict(model, CFG.make_decision_rule(), featurizer, f.items)
    reference = CFG.make_model()
    for it, v in zip(f.items, p.verdicts, strict=True):
        X = featurizer.stack([it.row])
        if reference.stats["classes"].labels:
            want = dict(zip(reference.classes_, reference.predict_log_proba(X)[0], strict=True))
            assert v.log_proba.keys() == want.keys()
            for c, lp in want.items():
                assert v.log_proba[c] == pytest.approx(lp, abs=1e-12)
            assert v.label == max(want, key=want.get)
        else:
            assert (v.label, v.log_proba, v.model_log_proba) == (None, {}, None)
        if it.msg.label is not None:
            reference.partial_fit(X, [it.msg.label])
    # m0 (no label) and m1 (the first label, predicted before it is learnt): no class yet
    assert p.classes == ["spam", "ham"] and len(p.observed) == 10 and p.log_proba.shape == (10, 2)
    assert model.stats["classes"].labels == []  # the model itself is not touched


def test_the_whole_batch_with_the_model_as_it_is_when_not_prequential():
    model = CFG.make_model()
    _, featurizer, _, f = _steps([{"id": "a", "tokens": ["x"], "label": "ham"},
                                  {"id": "b", "tokens": ["x"]}])
    p = predict(model, CFG.make_decision_rule(), featurizer, f.items, prequential=False)
    assert [v.label for v in p.verdicts] == [None, None] and p.observed == []
    model.partial_fit(featurizer.stack([f.items[0].row] * 3), ["ham", "ham", "spam"])
    p = predict(model, CFG.make_decision_rule(), featurizer, f.items, prequential=False)
    assert [v.label for v in p.verdicts] == ["ham", "ham"]
    # equal rows: equal posteriors, the learnt priors 2/3 and 1/3 with equal likelihoods
    assert p.verdicts[0].log_proba == pytest.approx({"ham": math.log(2 / 3),
                                                     "spam": math.log(1 / 3)}, abs=1e-12)


def test_what_is_made_before_the_wait_is_what_the_commit_would_make():
    model, featurizer, _, f = _steps([{"id": "a", "tokens": ["x"], "label": "ham"},
                                      {"id": "b", "tokens": ["y", "y"]},
                                      {"id": "c", "tokens": ["x", "z"], "label": "spam"}])
    X = featurizer.stack([it.row for it in f.items])
    ids, stats = own_stats(model, f.items, X)
    assert ids == ["1000-0", "1002-0"]
    again = model.batch_stats(X[[0, 2]], ["ham", "spam"])
    assert stats.to_bytes() == again.to_bytes()
    assert prediction_plan(model, X, f.items) is not None
    rows = cache_rows(f.items, cache_labelled=False)
    assert list(rows) == ["1001-0"] and rows["1001-0"] == f.items[1].row.to_bytes()
    assert list(cache_rows(f.items, cache_labelled=True)) == ["1000-0", "1001-0", "1002-0"]
    mixed = _steps([{"id": "a", "tokens": ["x"], "label": 1}, {"id": "b", "tokens": ["y"], "label": "s"}])[3]
    assert own_stats(model, mixed.items, featurizer.stack([it.row for it in mixed.items])) is None


def test_the_commit_content_of_a_batch():
    msgs = [{"id": "a", "tokens": ["x"], "label": "ham"}, b"\xc1", {"id": "b", "tokens": ["y"]},
            {"ref": "b", "label": "spam"}, {"ref": "gone", "label": "ham"}]
    model, featurizer, batch = _batch(msgs)
    content = commit_content(batch, {"gone": None}, model, featurizer, "w1", cache=True,
                             cache_labelled=False)
    assert content.ids == ["1000-0", "1001-0", "1002-0", "1003-0", "1004-0"]  # stream order
    outs = [decode_output(o) for o in content.outputs]
    assert [(o["id"], o.get("learned"), o["model_version"], o["worker"]) for o in outs] == [
        ("a", True, "7-0", "w1"), ("b", None, "7-0", "w1")]  # ("learned" with a label of its own)
    assert [(d.entry_id, d.reason) for d in content.dead] == [("1001-0", "not_msgpack"),
                                                              ("1004-0", "ref_expired")]
    assert "--no-cache-labelled" in content.dead[1].detail
    # both learnt in the batch ("b" by the label that refers to it): nothing cached
    assert content.cache_entries == [] and content.n_learnt == 2
    assert content.learnt_labels == ["ham", "spam"] and content.sub is None
    assert content.add.to_bytes() == model.batch_stats(
        featurizer.stack([it.row for it in batch.items]), ["ham", "spam"]).to_bytes()
    assert content.resolution.delayed and content.scored == []  # "a" came before any class
    cached = commit_content(batch, {"gone": None}, model, featurizer, "w1", cache=True,
                            cache_labelled=True).cache_entries
    assert [mid for mid, _ in cached] == ["a", "b"]
    entry = decode_entry("k", "ra", cached[0][1])
    assert entry.learnt == "ham" and entry.row == batch.items[0].row
    assert commit_content(batch, {}, model, featurizer, "w1", cache=False,
                          cache_labelled=True).cache_entries == []


def test_a_delayed_label_and_a_correction_from_the_cache():
    model, featurizer, batch = _batch([{"ref": "old", "label": "spam"},
                                       {"ref": "seen", "label": "ham"}])
    row = featurizer.featurize(decode_entries(_entries([{"id": "z", "tokens": ["q"]}]), None, 5)
                               .messages[0][1].as_payload())
    entries = {m: encode_entry(encode_label(learnt), row.to_bytes(), "ham", {"ham": -0.1, "spam": -2.4},
                               2.0, 5.0) for m, learnt in (("old", None), ("seen", "spam"))}
    cached = {m: decode_entry(f"bucket-{m}", "r" + m, e) for m, e in entries.items()}
    content = commit_content(batch, cached, model, featurizer, "w1", True, True)
    assert content.n_learnt == 1 and content.outputs == [] and content.dead == []
    res = content.resolution
    assert res.corrections == 1 and res.unlearned == ["spam"] and len(res.delayed) == 1
    assert content.add.to_bytes() == model.batch_stats(
        featurizer.stack([row, row]), ["spam", "ham"], np.array([2.0, 2.0])).to_bytes()
    assert content.sub.to_bytes() == model.batch_stats(
        featurizer.stack([row]), ["spam"], np.array([2.0])).to_bytes()
    # each change compares the entry read and writes it with the new label
    assert [(c.key, c.expected) for c in res.cas] == [("bucket-old", entries["old"]),
                                                      ("bucket-seen", entries["seen"])]
    assert [decode_entry("k", "f", c.new).learnt for c in res.cas] == ["spam", "ham"]
    # a cached row that does not fit this model (2**8 columns) is as good as expired
    wide = Row(indices=np.array([300], dtype=np.int32), values=np.ones(1), n_tokens=1)
    outside = decode_entry("k", "rold", encode_entry(b"", wide.to_bytes(), "ham", {}, 1.0, 5.0))
    content = commit_content(batch, {"old": outside, "seen": cached["seen"]}, model, featurizer,
                             "w1", True, True)
    assert [d.reason for d in content.dead] == ["ref_expired"] and content.n_learnt == 0


def test_a_batch_without_the_entries_another_worker_claimed():
    msgs = [{"id": "a", "tokens": ["x"], "label": "ham"}, b"\xc1", {"id": "b", "tokens": ["y"]},
            {"ref": "a", "label": "spam"}]
    model, featurizer, batch = _batch(msgs, announced="w1|1000-0")
    rest = batch.without({"1000-0", "1003-0"})
    assert [it.msg.id for it in rest.items] == ["b"] and rest.refs == []
    assert [d.entry_id for d in rest.dead] == ["1001-0"] and rest.announced == "w1|1000-0"
    assert rest.verdicts == batch.verdicts[1:] and rest.order == batch.order
    content = commit_content(rest, {}, model, featurizer, "w1", True, True)
    assert content.ids == ["1001-0", "1002-0"]
    nothing = batch.without(set(batch.order))
    assert commit_content(nothing, {}, model, featurizer, "w1", True, True) is None
    assert isinstance(batch.dead[0], Dead)
