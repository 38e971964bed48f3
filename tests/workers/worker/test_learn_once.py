"""Learn-once keys and forget, through workers against a real redis-server: a message
sent again is predicted, not learnt; a forget subtracts exactly what its key learnt, once."""

from __future__ import annotations

import msgpack
import pytest
from prometheus_client import CollectorRegistry

from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.wire.learn_keys import decode_record, message_key
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

def _outputs(r, name="mail"):
    from streamnb_workers.store.keys import ModelKeys

    return [decode_output(f[b"data"]) for _, f in r.xrange(ModelKeys(name).out)]


def _dead(r, name="mail"):
    from streamnb_workers.store.keys import ModelKeys

    return [decode_output(f[b"data"]) for _, f in r.xrange(ModelKeys(name).dead)]


def _without_keys(msgs):
    """The messages as a producer without keys sends them (keys from the payload)."""
    return [{k: v for k, v in m.items() if k != "key"} for m in msgs]


def test_a_message_sent_again_is_predicted_not_learnt_and_counted(redis_server):
    r = redis_server.client()
    msgs = token_messages(120, seed=3)
    # the whole run twice, the second time also with duplicates inside one batch
    produce(r, "mail", msgs)
    produce(r, "mail", msgs[:10] + msgs[:10] + msgs[10:])
    reg = CollectorRegistry()
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", batch=50),
                   Metrics(reg))
    w.run_until_idle()
    model, _ = learnt_model(r, "mail")
    assert_same_stats(model, offline_model("multinomial", PARAMS, FCFG, msgs))
    outs = _outputs(r)
    assert len(outs) == 250
    first, again = outs[:120], outs[120:]
    assert all(o["learned"] for o in first) and not any("reason" in o for o in first)
    assert not any(o["learned"] for o in again)
    assert {o["reason"] for o in again} == {"already_learnt"}
    assert reg.get_sample_value("streamnb_messages_already_learnt_total",
                                {"model": "mail", "worker": "w1"}) == 130
    assert int(r.get("streamnb:{mail}:learnt")) == 120
    scored = sum(s.value for metric in reg.collect() for s in metric.samples
                 if s.name == "streamnb_prequential_predictions_total")
    # each message scored once, when its key was learnt (not the first: no class yet)
    assert scored == 119
    # what was learnt per key: the label and the weight
    rec = r.hget("streamnb:{mail}:keys", msgs[7]["key"])
    assert decode_record(rec) == (msgs[7]["label"], 1.0)


def test_keys_from_the_payload_when_the_producer_gives_none(redis_server):
    r = redis_server.client()
    msgs = [{"text": "cheap meds now", "label": "spam"}, {"text": "lunch at noon", "label": "ham"},
            {"text": "cheap meds now", "label": "spam"},
            {"text": "cheap meds now", "label": "ham"}]  # the same message, relabelled
    produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1"))
    w.run_until_idle()
    outs = _outputs(r)
    assert [o["learned"] for o in outs] == [True, True, False, True]
    assert [o.get("reason") for o in outs] == [None, None, "already_learnt", "relearnt"]
    assert outs[3]["was"] == "spam"
    record = r.hget("streamnb:{mail}:keys", message_key("cheap meds now", "text"))
    assert decode_record(record) == ("ham", 1.0)
    counts = learnt_model(r, "mail")[0].stats["classes"].as_dict()
    assert counts == {"ham": 2.0, "spam": 0.0}


def test_two_workers_learn_each_key_once_and_stay_identical(redis_server):
    r = redis_server.client()
    msgs = token_messages(300, seed=5)
    # interleaved copies: the two workers' batches hold the same keys at the same time
    produce(r, "mail", [m for pair in zip(msgs, msgs, strict=True) for m in pair])
    ws = [url_worker(redis_server.url, [count_spec()], fast_options(f"w{i}", batch=20))
          for i in range(2)]
    run_in_threads(ws)
    ref = offline_model("multinomial", PARAMS, FCFG, msgs)
    for w in ws:
        assert_same_stats(w.models["mail"].replica.model, ref)
    assert_same_stats(learnt_model(r, "mail")[0], ref)
    learned = [o["learned"] for o in _outputs(r)]
    assert sum(learned) == 300 and len(learned) == 600


def test_keys_kept_are_bounded_oldest_dropped(redis_server):
    r = redis_server.client()
    msgs = token_messages(60, seed=1)
    produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", batch=7,
                                                                   learnt_keys_max=25))
    w.run_until_idle()
    assert r.hlen("streamnb:{mail}:keys") == 25 == r.zcard("streamnb:{mail}:keyorder")
    assert r.hexists("streamnb:{mail}:keys", msgs[59]["key"])
    assert not r.hexists("streamnb:{mail}:keys", msgs[0]["key"])


def test_no_keys_when_learnt_keys_max_is_zero(redis_server):
    r = redis_server.client()
    msgs = token_messages(20, seed=1)
    produce(r, "mail", msgs + msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", learnt_keys_max=0))
    w.run_until_idle()
    assert not r.exists("streamnb:{mail}:keys")
    assert learnt_model(r, "mail")[0].stats["classes"].total == 40


def test_forget_twice_equals_never_learnt(redis_server):
    r = redis_server.client()
    msgs = token_messages(80, seed=7)
    msgs[5] = {**msgs[5], "weight": 2.5}
    produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", batch=30))
    w.run_until_idle()
    forget = {"forget": True, "key": msgs[5]["key"], "tokens": msgs[5]["tokens"]}
    produce(r, "mail", [forget, forget])  # twice, in one batch
    produce(r, "mail", [{"forget": True, **_without_keys([msgs[9]])[0]}])  # key from payload
    w.run_until_idle()
    produce(r, "mail", [forget])  # and again later
    w.run_until_idle()
    kept = [m for i, m in enumerate(msgs) if i != 5]
    ref = offline_model("multinomial", PARAMS, FCFG, kept)
    assert_same_stats(learnt_model(r, "mail")[0], ref)
    assert_same_stats(w.models["mail"].replica.model, ref)
    dead = _dead(r)
    assert [d["reason"] for d in dead] == ["not_learnt"] * 3  # 2nd in batch, payload key, 3rd
    assert not r.hexists("streamnb:{mail}:keys", msgs[5]["key"])
    # forgotten, it may be learnt again (at weight 1 here: the reference has no weights)
    msgs[5] = {k: v for k, v in msgs[5].items() if k != "weight"}
    produce(r, "mail", [msgs[5]])
    w.run_until_idle()
    assert_same_stats(learnt_model(r, "mail")[0], offline_model("multinomial", PARAMS, FCFG,
                                                                  kept + [msgs[5]]))


def test_forget_reaches_every_replica(redis_server):
    r = redis_server.client()
    msgs = token_messages(100, seed=11)
    produce(r, "mail", msgs)
    ws = [url_worker(redis_server.url, [count_spec()], fast_options(f"w{i}", batch=15))
          for i in range(2)]
    run_in_threads(ws)
    gone = [3, 40, 77]
    produce(r, "mail", [{"forget": True, "key": msgs[i]["key"], "tokens": msgs[i]["tokens"]}
                        for i in gone])
    run_in_threads(ws)
    ref = offline_model("multinomial", PARAMS, FCFG,
                        [m for i, m in enumerate(msgs) if i not in gone])
    for w in ws:
        w.models["mail"].tail()
        assert_same_stats(w.models["mail"].replica.model, ref)
    assert _dead(r) == []


def test_a_forget_without_a_payload_is_a_dead_letter(redis_server):
    r = redis_server.client()
    r.xadd("streamnb:{mail}:in", {"data": msgpack.packb({"forget": True, "key": "k"})})
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1"))
    w.run_until_idle()
    assert [d["reason"] for d in _dead(r)] == ["no_payload"]


def test_a_worker_without_keys_still_forgets_what_was_recorded(redis_server):
    r = redis_server.client()
    msgs = token_messages(30, seed=4)
    produce(r, "mail", msgs)
    url_worker(redis_server.url, [count_spec()], fast_options("w1")).run_until_idle()
    produce(r, "mail", [{"forget": True, "key": msgs[2]["key"], "tokens": msgs[2]["tokens"]}])
    w = url_worker(redis_server.url, [count_spec()], fast_options("w2", learnt_keys_max=0))
    w.run_until_idle()
    ref = offline_model("multinomial", PARAMS, FCFG, [m for i, m in enumerate(msgs) if i != 2])
    assert_same_stats(learnt_model(r, "mail")[0], ref)
    assert _dead(r) == []


def test_a_corrected_message_is_forgotten_from_its_new_class(redis_server):
    """A label correction moves a message learnt under a key to another class; its key's
    record follows, so a forget subtracts it from the class that holds it."""
    r = redis_server.client()
    msgs = token_messages(40, seed=8)
    spam = next(i for i, m in enumerate(msgs) if m.get("label") == "spam")
    produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1"))
    w.run_until_idle()
    produce(r, "mail", [{"ref": msgs[spam]["id"], "label": "ham"}])
    w.run_until_idle()
    assert decode_record(r.hget("streamnb:{mail}:keys", msgs[spam]["key"])) == ("ham", 1.0)
    produce(r, "mail", [{"forget": True, "key": msgs[spam]["key"], "tokens": msgs[spam]["tokens"]}])
    w.run_until_idle()
    ref = offline_model("multinomial", PARAMS, FCFG, [m for i, m in enumerate(msgs) if i != spam])
    assert_same_stats(learnt_model(r, "mail")[0], ref)
    assert _dead(r) == []
