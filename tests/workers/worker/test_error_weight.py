"""The mail defaults of a new count model: the error weight (a message whose verdict got
its label wrong is learnt with twice its weight), "unsure" while a class has barely been
learnt, and the per-feature score in ``:out``. Within a batch (prequential) they give
what one message at a time gives; through workers on a real redis-server every message
is learnt once, with the weight its published verdict implies, and the replicas agree."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from streamnb.decision import UNSURE
from streamnb_workers.store.model_config import ModelSpec, resolve_spec
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.worker.batch import decode_entries, featurize, predict
from streamnb_workers.worker.learn_weights import is_error
from tests.helpers.workers import (
    FCFG,
    MAIL_KEYS,
    all_done,
    assert_same_stats,
    fast_options,
    learnt_model,
    produce,
    run_in_threads,
    token_messages,
    url_worker,
)

SPEC = ModelSpec("mail", kind="multinomial", featurizer_config=dict(FCFG))
CFG = resolve_spec(SPEC)


def _items(msgs: list[dict]) -> tuple[list, object]:
    featurizer = CFG.make_featurizer()
    entries = [(f"{1000 + i}-0".encode(), {b"data": msgpack.packb(m)}) for i, m in enumerate(msgs)]
    return featurize(featurizer, decode_entries(entries, None, max_deliveries=5)).items, featurizer


def test_mail_defaults_of_a_new_count_model_and_how_to_turn_them_off():
    assert CFG.error_weight == 2.0
    assert CFG.decision == {"min_class_weight": 3.0, "score": "per_feature"}
    off = resolve_spec(ModelSpec("m", kind="multinomial", error_weight=1,
                                 decision={"min_class_weight": None, "score": "log_odds"}))
    assert off.error_weight == 1.0 and off.decision == {}
    dense = resolve_spec(ModelSpec("g", kind="gaussian",
                                   featurizer_config={"input": "dense", "dim": 2}))
    assert dense.error_weight == 1.0 and dense.decision == {}
    for bad in (0.5, 1000.5, float("inf")):
        with pytest.raises(ValueError, match="error_weight must be a number from 1 to 1000"):
            ModelSpec("m", error_weight=bad)


def test_a_batch_predicts_and_weighs_as_one_message_at_a_time():
    msgs = token_messages(120, classes=("spam", "ham"), seed=3, labelled_share=0.8)
    for m in msgs[40:80]:  # spam words in ham: wrong verdicts later in the batch
        if m.get("label") == "ham":
            m["tokens"] = m["tokens"] + ["cheap", "free", "offer", "click", "prize", "winner"]
    items, featurizer = _items(msgs)
    rule = CFG.make_decision_rule()
    batch = predict(CFG.make_model(), rule, featurizer, items, error_weight=2.0)
    model = CFG.make_model()
    n_errors = 0
    for it, got in zip(items, batch.verdicts, strict=True):
        want = predict(model, rule, featurizer, [it], error_weight=2.0).verdicts[0]
        assert (got.label, got.weight) == (want.label, want.weight)
        assert got.log_proba.keys() == want.log_proba.keys()
        for c, v in want.log_proba.items():
            assert got.log_proba[c] == pytest.approx(v, abs=1e-9)
        if want.score is None:
            assert got.score is None
        else:
            assert got.score == pytest.approx(want.score, abs=1e-12)
        if it.msg.label is not None:
            wrong = is_error(want.label, it.msg.label, rule, list(want.log_proba))
            assert want.weight == (2.0 if wrong else 1.0)
            n_errors += wrong
            model.partial_fit(featurizer.stack([it.row]), [it.msg.label],
                              sample_weight=np.array([want.weight]))
    assert n_errors >= 3  # the test exercises the passes over the batch


def test_cold_verdicts_are_unsure_and_the_score_is_log_odds_per_feature():
    msgs = [{"id": "a", "tokens": ["cheap", "meds"], "label": "spam"},
            {"id": "b", "tokens": ["team", "notes"], "label": "ham"},
            {"id": "c", "tokens": ["cheap", "offer", "meds"]}]
    items, featurizer = _items(msgs)
    p = predict(CFG.make_model(), CFG.make_decision_rule(), featurizer, items, error_weight=2.0)
    a, b, c = p.verdicts
    # a: no class yet, no verdict, no error; b: only spam known -> unsure, and not an
    # error for a ham (unsure is not flagged); c: one message each, below weight 3
    assert (a.label, a.weight, a.score) == (None, 1.0, None)
    assert (b.label, b.weight, b.score) == (UNSURE, 1.0, None)
    assert c.label == UNSURE
    assert c.score == pytest.approx((c.log_proba["spam"] - c.log_proba["ham"]) / 3, abs=1e-12)
    assert c.score > 0
    # an unsure spam is an error: learnt twice
    items, featurizer = _items([{"id": "h", "tokens": ["team"], "label": "ham"},
                                {"id": "s", "tokens": ["cheap"], "label": "spam"}])
    p = predict(CFG.make_model(), CFG.make_decision_rule(), featurizer, items, error_weight=2.0)
    assert [(v.label, v.weight) for v in p.verdicts] == [(None, 1.0), (UNSURE, 2.0)]


@pytest.mark.redis
def test_workers_learn_each_message_once_with_the_weight_of_its_verdict(redis_server):
    r = redis_server.client()
    msgs = token_messages(400, classes=("spam", "ham"), seed=5)
    rng = np.random.default_rng(5)
    for m in msgs:  # noise, so that verdicts go wrong now and then
        if rng.random() < 0.15:
            m["tokens"] = m["tokens"] + ["cheap", "meeting", "free", "report"][: int(rng.integers(1, 4))]
        m["key"] = m["id"]  # each message its own learn-once key, whatever its content
    produce(r, "mail", msgs)
    workers = [url_worker(redis_server.url, [SPEC], fast_options(f"w{i}", batch=25))
               for i in range(2)]
    run_in_threads(workers)
    assert all_done(r, len(msgs))
    outs = [decode_output(f[b"data"]) for _, f in r.xrange(MAIL_KEYS.out)]
    assert sorted(o["id"] for o in outs) == sorted(m["id"] for m in msgs)  # each once
    # the reference: every message learnt once, offline, with the weight its published
    # verdict implies
    rule = CFG.make_decision_rule()
    featurizer = CFG.make_featurizer()
    by_id = {o["id"]: o for o in outs}
    model = CFG.make_model()
    n_errors = 0
    for m in msgs:
        o = by_id[m["id"]]
        known = sorted(o["log_proba"])
        wrong = is_error(o["label"], m["label"], rule, known)
        n_errors += wrong
        items, _ = _items([m])
        model.partial_fit(featurizer.stack([items[0].row]), [m["label"]],
                          sample_weight=np.array([2.0 if wrong else 1.0]))
        if len(known) == 2:
            lp = o["log_proba"]
            assert o["score"] == pytest.approx((lp["spam"] - lp["ham"]) / len(m["tokens"]),
                                               rel=1e-12, abs=1e-12)
        else:
            assert "score" not in o
    assert n_errors >= 5
    stored, _ = learnt_model(r, "mail")
    assert_same_stats(stored, model, rtol=1e-12)
    # identical replicas: each worker's model is the stored one, bit for bit
    for w in workers:
        replica = w.models["mail"].replica
        replica.catch_up()
        assert_same_stats(replica.model, stored)


@pytest.mark.redis
def test_a_correction_moves_the_weight_the_message_was_learnt_with(redis_server):
    r = redis_server.client()
    # (a token of its own each: identical mail would be learnt once, by its content key)
    msgs = [{"id": f"s{i}", "tokens": ["cheap", "meds", "offer", f"s{i}"], "label": "spam"}
            for i in range(5)]
    msgs += [{"id": f"h{i}", "tokens": ["team", "notes", "lunch", f"h{i}"], "label": "ham"}
             for i in range(5)]
    msgs.append({"id": "x", "tokens": ["cheap", "meds", "offer", "x"], "label": "ham"})  # spam?
    produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [SPEC], fast_options("w1", batch=50))
    w.run_until_idle()
    outs = {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in r.xrange(MAIL_KEYS.out))}
    assert outs["x"]["label"] == "spam" and outs["x"]["learned"]
    produce(r, "mail", [{"ref": "x", "label": "spam"}])  # the sender says it was spam
    w.run_until_idle()
    stored, _ = learnt_model(r, "mail")
    rule = CFG.make_decision_rule()
    featurizer = CFG.make_featurizer()
    model = CFG.make_model()
    for m in msgs:
        o = outs[m["id"]]
        weight = 2.0 if is_error(o["label"], m["label"], rule, sorted(o["log_proba"])) else 1.0
        label = "spam" if m["id"] == "x" else m["label"]
        items, _ = _items([m])
        model.partial_fit(featurizer.stack([items[0].row]), [label],
                          sample_weight=np.array([weight]))
    assert_same_stats(stored, model, rtol=1e-12)
    # x was learnt twice as ham (a wrong verdict), then moved whole to spam
    assert stored.stats["classes"].as_dict()["ham"] == sum(
        2.0 if is_error(outs[m["id"]]["label"], "ham", rule, ["ham", "spam"]) else 1.0
        for m in msgs if m["label"] == "ham" and m["id"] != "x")


def test_the_command_line_turns_each_default_off():
    from streamnb.exceptions import SettingsError
    from streamnb_workers.cli.main import build_parser, subparsers
    from streamnb_workers.cli.options import model_specs
    from streamnb_workers.cli.settings import resolve

    def spec(*flags: str) -> ModelSpec:
        parser = build_parser()
        args = parser.parse_args(["worker", "--model", "mail", "--kind", "multinomial", *flags])
        subs = subparsers(parser)
        return model_specs(resolve(subs["worker"], args, "worker", env={}, all_parsers=subs))[0]

    off = resolve_spec(spec("--error-weight", "1", "--min-class-weight", "0",
                            "--score", "log_odds"))
    assert off.error_weight == 1.0 and off.decision == {"min_class_weight": 0.0}
    assert resolve_spec(spec()).decision == CFG.decision
    with pytest.raises(SettingsError, match="error_weight must be a number from 1 to 1000"):
        spec("--error-weight", "0.5")


@pytest.mark.redis
def test_a_forget_subtracts_the_weight_the_message_was_learnt_with(redis_server):
    r = redis_server.client()
    msgs = [{"id": f"s{i}", "tokens": ["cheap", "meds", "offer", f"s{i}"], "label": "spam"}
            for i in range(5)]
    msgs += [{"id": f"h{i}", "tokens": ["team", "notes", "lunch", f"h{i}"], "label": "ham"}
             for i in range(5)]
    x = {"id": "x", "tokens": ["cheap", "meds", "offer", "x"], "label": "ham"}
    produce(r, "mail", msgs + [x])
    w = url_worker(redis_server.url, [SPEC], fast_options("w1", batch=50))
    w.run_until_idle()
    before, _ = learnt_model(r, "mail")
    produce(r, "mail", [{"tokens": x["tokens"], "forget": True}])  # its content key
    w.run_until_idle()
    after, _ = learnt_model(r, "mail")
    outs = {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in r.xrange(MAIL_KEYS.out))}
    assert outs["x"]["label"] == "spam"  # a wrong verdict: x was learnt twice as ham
    ham = before.stats["classes"].as_dict()["ham"]
    assert after.stats["classes"].as_dict()["ham"] == ham - 2.0
    assert after.stats["classes"].as_dict()["spam"] == before.stats["classes"].as_dict()["spam"]
