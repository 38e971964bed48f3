"""Relabel is a correction, through workers against a real redis-server: a labelled message
whose learn-once key was learnt under another label is relearnt (the recorded label and
weight subtracted, the new label learnt) exactly once and identically on every replica;
the same label again is ``already_learnt``; a ``ref`` label contradicting the key's label
is a correction the same way."""

from __future__ import annotations

import msgpack
import pytest
from prometheus_client import CollectorRegistry

from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.replication.shards import keys_of, shard_of
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.learn_keys import decode_record
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    assert_same_stats,
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

MW = {"model": "mail", "worker": "w0"}


def _outputs(r) -> dict[str, dict]:
    outs = [decode_output(f[b"data"]) for _, f in r.xrange(ModelKeys("mail").out)]
    return {o["id"]: o for o in outs}


def _as(m: dict, label: str, tag: str) -> dict:
    """The message ``m`` sent again (another id, the same key and payload) as ``label``."""
    return {**m, "id": f"{m['id']}-{tag}", "label": label}


def _relabelled(msgs: list[dict], final: dict[str, str]) -> list[dict]:
    return [{**m, "label": final.get(m["id"], m.get("label"))} for m in msgs]


def _record(r, key: str, name: str = "mail"):
    rec = r.hget(ModelKeys(name).learnt_keys, key)
    return None if rec is None else decode_record(rec)


def _total(regs, name: str, **labels) -> float:
    return sum(reg.get_sample_value(name, {**MW, "worker": f"w{i}", **labels}) or 0.0
               for i, reg in enumerate(regs))


def _workers(url: str, n: int = 2, batch: int = 13, spec=None):
    regs = [CollectorRegistry() for _ in range(n)]
    ws = [url_worker(url, [spec or count_spec()], fast_options(f"w{i}", batch=batch),
                     Metrics(reg)) for i, reg in enumerate(regs)]
    return ws, regs


def test_a_correction_sent_twice_is_relearnt_once_on_every_replica(redis_server):
    r = redis_server.client()
    msgs = token_messages(150, classes=("spam", "ham"), seed=21)
    produce(r, "mail", msgs)
    ws, regs = _workers(redis_server.url)
    run_in_threads(ws)
    spam = [m for m in msgs if m["label"] == "spam"][:6]
    fixes = [_as(m, "ham", "fix") for m in spam]
    again = [_as(m, "ham", "again") for m in spam]
    # interleaved: both workers hold copies of the same keys at the same time
    produce(r, "mail", [m for pair in zip(fixes, again, strict=True) for m in pair])
    run_in_threads(ws)
    ref = offline_model("multinomial", PARAMS, FCFG,
                        _relabelled(msgs, {m["id"]: "ham" for m in spam}))
    for w in ws:
        w.models["mail"].tail()
        assert_same_stats(w.models["mail"].replica.model, ref)
    assert_same_stats(learnt_model(r, "mail")[0], ref)
    outs = _outputs(r)
    for m in spam:
        pair = [outs[f"{m['id']}-fix"], outs[f"{m['id']}-again"]]
        assert sorted(o.get("reason") for o in pair) == ["already_learnt", "relearnt"]
        relearnt = next(o for o in pair if o["reason"] == "relearnt")
        assert relearnt["learned"] is True and relearnt["was"] == "spam"
        assert relearnt["true_label"] == "ham"
        assert not any(o["learned"] for o in pair if o["reason"] == "already_learnt")
        assert "was" not in next(o for o in pair if o["reason"] == "already_learnt")
        assert _record(r, m["key"]) == ("ham", 1.0)
    assert _total(regs, "streamnb_messages_relearnt_total") == 6
    assert _total(regs, "streamnb_messages_already_learnt_total") == 6
    assert _total(regs, "streamnb_label_corrections_total") == 6
    assert _total(regs, "streamnb_messages_unlearned_total", **{"class": "spam"}) == 6
    # a relearnt message is not a new one: the count of messages learnt is unchanged
    assert int(r.get(ModelKeys("mail").learnt)) == 150


@pytest.mark.parametrize("one_batch", [False, True])
def test_spam_then_ham_then_spam_equals_one_spam_learn(redis_server, one_batch):
    r = redis_server.client()
    msgs = token_messages(60, classes=("spam", "ham"), seed=5)
    spam = [m for m in msgs if m["label"] == "spam"][:4]
    ws, regs = _workers(redis_server.url, batch=200 if one_batch else 13)
    steps = [msgs, [_as(m, "ham", "h") for m in spam], [_as(m, "spam", "s") for m in spam]]
    if one_batch:
        produce(r, "mail", [m for step in steps for m in step])
        run_in_threads(ws)
    else:
        for step in steps:
            produce(r, "mail", step)
            run_in_threads(ws)
    ref = offline_model("multinomial", PARAMS, FCFG, msgs)
    for w in ws:
        w.models["mail"].tail()
        assert_same_stats(w.models["mail"].replica.model, ref)
    assert_same_stats(learnt_model(r, "mail")[0], ref)
    outs = _outputs(r)
    for m in spam:
        assert (outs[f"{m['id']}-h"]["reason"], outs[f"{m['id']}-h"]["was"]) == ("relearnt", "spam")
        assert (outs[f"{m['id']}-s"]["reason"], outs[f"{m['id']}-s"]["was"]) == ("relearnt", "ham")
        assert _record(r, m["key"]) == ("spam", 1.0)
    assert _total(regs, "streamnb_messages_relearnt_total") == 8


def test_a_relearnt_message_keeps_the_weight_its_verdict_gave_it(redis_server):
    """With an error weight, the label learnt after a wrong verdict weighs more; relearning
    subtracts the weight recorded and learns the new label with the weight its own verdict
    gives it, so the statistics hold the final label once, at the weight of its last learn."""
    r = redis_server.client()
    msgs = token_messages(80, classes=("spam", "ham"), seed=9)
    spec = count_spec(error_weight=3.0)
    ws, _ = _workers(redis_server.url, n=1, spec=spec)
    produce(r, "mail", msgs)
    run_in_threads(ws)
    before = learnt_model(r, "mail")[0].stats["classes"].as_dict()
    m = next(m for m in msgs if m["label"] == "spam" and
             _outputs(r)[m["id"]]["label"] == "spam")  # a spam its verdict got right
    old = _record(r, m["key"])
    produce(r, "mail", [_as(m, "ham", "fix")])
    run_in_threads(ws)
    out = _outputs(r)[f"{m['id']}-fix"]
    assert out["label"] == "spam" and out["reason"] == "relearnt"  # the verdict: wrong
    assert _record(r, m["key"]) == ("ham", 3.0)
    after = learnt_model(r, "mail")[0].stats["classes"].as_dict()
    assert after["spam"] == before["spam"] - old[1]
    assert after["ham"] == before["ham"] + 3.0


def test_a_ref_label_that_contradicts_the_key_is_a_correction(redis_server):
    """A delayed label (by message id) goes by what the key records: after the message was
    relearnt through another copy, a ref agreeing with the key is a no-op and one that
    contradicts it moves the contribution, once however often it is sent."""
    r = redis_server.client()
    msgs = token_messages(60, classes=("spam", "ham"), seed=13)
    m = next(m for m in msgs if m["label"] == "spam")
    ws, regs = _workers(redis_server.url)
    produce(r, "mail", msgs)
    run_in_threads(ws)

    def check(final_label: str) -> None:
        ref = offline_model("multinomial", PARAMS, FCFG, _relabelled(msgs, {m["id"]: final_label}))
        for w in ws:
            w.models["mail"].tail()
            assert_same_stats(w.models["mail"].replica.model, ref)
        assert_same_stats(learnt_model(r, "mail")[0], ref)
        assert _record(r, m["key"])[0] == final_label

    produce(r, "mail", [{"ref": m["id"], "label": "ham"}] * 3)  # a correction, sent 3 times
    run_in_threads(ws)
    check("ham")
    produce(r, "mail", [_as(m, "spam", "s")])  # relearnt back by a copy of the message
    run_in_threads(ws)
    assert _outputs(r)[f"{m['id']}-s"]["was"] == "ham"
    check("spam")
    # the cache entry of m still says ham: the key's record says spam and wins
    produce(r, "mail", [{"ref": m["id"], "label": "spam"}])
    run_in_threads(ws)
    check("spam")
    produce(r, "mail", [{"ref": m["id"], "label": "ham"}, {"ref": m["id"], "label": "ham"}])
    run_in_threads(ws)
    check("ham")
    assert _total(regs, "streamnb_messages_relearnt_total") == 1
    assert _total(regs, "streamnb_label_corrections_total") == 3
    assert r.xlen(ModelKeys("mail").dead) == 0


def test_relabel_on_a_sharded_model(redis_server):
    """A key's shard is fixed by its message id: the copies carry the same id here (as a
    mail client relabelling a mail sends it with its Message-ID), so each is relearnt in
    the shard that learnt it."""
    r = redis_server.client()
    msgs = token_messages(90, classes=("spam", "ham"), seed=17)
    spec = count_spec("mail", shards=3)
    ws, regs = _workers(redis_server.url, spec=spec)
    ws[0].start()  # the model's config and its shards'
    shards = keys_of("mail", 3)

    def send(batch):
        for m in batch:
            keys = shards[shard_of(m["id"], 3)]
            r.xadd(keys.input, {"data": msgpack.packb(m, use_bin_type=True)})

    send(msgs)
    run_in_threads(ws)
    spam = [m for m in msgs if m["label"] == "spam"][:6]
    send([{**m, "label": "ham"} for m in spam] * 2)
    run_in_threads(ws)
    ref = offline_model("multinomial", PARAMS, FCFG,
                        _relabelled(msgs, {m["id"]: "ham" for m in spam}))
    assert_same_stats(learnt_model(r, "mail")[0], ref)
    assert sum(s.value for reg in regs for metric in reg.collect() for s in metric.samples
               if s.name == "streamnb_messages_relearnt_total") == 6


@pytest.mark.parametrize("forget_first", [False, True])
def test_a_relabel_and_a_forget_of_one_key_in_one_batch_apply_in_stream_order(redis_server,
                                                                               forget_first):
    r = redis_server.client()
    msgs = token_messages(40, classes=("spam", "ham"), seed=23)
    m = next(m for m in msgs if m["label"] == "spam")
    ws, _ = _workers(redis_server.url, n=1, batch=50)
    produce(r, "mail", msgs)
    run_in_threads(ws)
    forget = {"forget": True, "key": m["key"], "tokens": m["tokens"]}
    relabel = _as(m, "ham", "fix")
    produce(r, "mail", [forget, relabel] if forget_first else [relabel, forget])
    run_in_threads(ws)
    out = _outputs(r)[relabel["id"]]
    if forget_first:  # forgotten, then learnt anew as ham
        final = _relabelled(msgs, {m["id"]: "ham"})
        assert out["learned"] is True and "reason" not in out
        assert _record(r, m["key"]) == ("ham", 1.0)
    else:  # relearnt as ham, then forgotten
        final = [x for x in msgs if x["id"] != m["id"]]
        assert (out["reason"], out["was"]) == ("relearnt", "spam")
        assert _record(r, m["key"]) is None
    ref = offline_model("multinomial", PARAMS, FCFG, final)
    assert_same_stats(ws[0].models["mail"].replica.model, ref)
    assert_same_stats(learnt_model(r, "mail")[0], ref)
    assert r.xlen(ModelKeys("mail").dead) == 0
