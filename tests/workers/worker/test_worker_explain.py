"""--explain K puts each prediction's top tokens and weights into its output, and the
workers publish token names per bucket (real redis-server, real worker)."""

from __future__ import annotations

import json
from collections import Counter

import msgpack
import numpy as np
import pytest

from streamnb.features import Featurizer
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.codec import decode_input
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.worker.housekeeping import housekeeping
from tests.helpers.workers import (
    COMMON,
    VOCAB,
    count_spec,
    fast_options,
    learnt_model,
    produce,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis

K = ModelKeys("mail")


def _outputs(r) -> dict[str, dict]:
    return {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in r.xrange(K.out))}


def _rows(featurizer, messages):
    return featurizer.stack([featurizer.featurize(decode_input(msgpack.packb(m), "0-0").as_payload())
                             for m in messages])


@pytest.mark.parametrize("kind", ["multinomial", "bernoulli"])
def test_outputs_carry_an_exact_explanation_with_token_names(redis_server, kind):
    r = redis_server.client()
    spec = ModelSpec("mail", kind=kind, featurizer_config={"bits": 12})
    train = token_messages(120, classes=("spam", "ham"), seed=1)
    produce(r, "mail", train)
    w = url_worker(redis_server.url, [spec], fast_options("w1", explain=3))
    w.run_until_idle()
    test = [{k: v for k, v in m.items() if k != "label"} | {"id": f"t{i}"}
            for i, m in enumerate(token_messages(30, classes=("spam", "ham"), seed=2))]
    produce(r, "mail", test)
    w.run_until_idle()
    w.shutdown()
    out = _outputs(r)
    model, _ = learnt_model(r, "mail")
    X = _rows(Featurizer(bits=12), test)
    decision = model.decision_function(X)
    for m, d in zip(test, decision, strict=True):
        o = out[m["id"]]
        e = o["explain"]
        assert e["classes"] == ["ham", "spam"]
        assert 1 <= len(e["tokens"]) <= 3
        names = [name for name, _ in e["tokens"]]
        assert set(names) <= set(m["tokens"])  # named by the message's own tokens
        weights = [wt for _, wt in e["tokens"]]
        assert np.all(np.diff(np.abs(weights)) <= 1e-15)
        total = e["bias"] + sum(weights) + e["other"]
        assert total == pytest.approx(d, abs=1e-9)
        # and it is the output's own log-odds
        assert total == pytest.approx(o["log_proba"]["spam"] - o["log_proba"]["ham"], abs=1e-9)


def test_explain_off_leaves_outputs_as_they_were(redis_server):
    r = redis_server.client()
    produce(r, "mail", token_messages(40, seed=3))
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1"))
    w.run_until_idle()
    w.shutdown()
    assert r.xlen(K.out) == 40
    assert not any("explain" in o for o in _outputs(r).values())


def test_three_classes_explain_the_decision_against_the_runner_up(redis_server):
    r = redis_server.client()
    produce(r, "mail", token_messages(150, seed=4))
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", explain=2))
    w.run_until_idle()
    test = [{"id": f"t{i}", "tokens": m["tokens"]} for i, m in enumerate(token_messages(20, seed=5))]
    produce(r, "mail", test)
    w.run_until_idle()
    w.shutdown()
    out = _outputs(r)
    for m in test:
        o = out[m["id"]]
        lp = o["log_proba"]
        ranked = sorted(lp, key=lambda c: -lp[c])
        e = o["explain"]
        assert e["classes"] == [ranked[1], ranked[0]] and ranked[0] == o["label"]
        total = e["bias"] + sum(wt for _, wt in e["tokens"]) + e["other"]
        assert total == pytest.approx(lp[ranked[0]] - lp[ranked[1]], abs=1e-9)


def test_workers_publish_the_most_frequent_token_names(redis_server):
    r = redis_server.client()
    msgs = token_messages(200, classes=("spam", "ham"), seed=6)
    produce(r, "mail", msgs)
    spec = ModelSpec("mail", kind="multinomial", featurizer_config={"bits": 16})
    w = url_worker(redis_server.url, [spec], fast_options("w1", token_names=50, token_names_every=2))
    w.run_until_idle()
    assert not r.exists(K.tokens)  # first published a minute after the start
    w.models["mail"].timers.names.due_at_once()
    housekeeping(w.models["mail"], ["mail"])
    w.shutdown()
    table = {int(b): json.loads(v) for b, v in r.hgetall(K.tokens).items()}
    f = Featurizer(bits=16)
    words = {t for m in msgs for t in m["tokens"]}
    named = {name for names in table.values() for name, _ in names}
    assert named == words  # 22 words, fewer than the capacity: all of them
    for bucket, names in table.items():
        for name, count in names:
            assert f.hasher.bucket(name) == bucket
            # counted in every second message: about half the messages holding it
            holding = sum(name in m["tokens"] for m in msgs)
            assert 0 < count <= holding
    assert len(table) <= 50


def test_a_worker_publishes_its_token_names_when_it_stops(redis_server):
    """A worker stopped before its first minute still leaves the names it counted; one
    that counted nothing new since it published leaves the table as it is."""
    r = redis_server.client()
    msgs = token_messages(40, classes=("spam", "ham"), seed=7)
    produce(r, "mail", msgs)
    spec = ModelSpec("mail", kind="multinomial", featurizer_config={"bits": 16})
    w = url_worker(redis_server.url, [spec], fast_options("w1", token_names=50, token_names_every=1))
    w.run_until_idle()
    assert not r.exists(K.tokens)
    w.shutdown()
    counted = {name: count for v in r.hgetall(K.tokens).values() for name, count in json.loads(v)}
    assert set(counted) == {t for m in msgs for t in m["tokens"]}
    # every message counted (every=1), each name once a message that holds it
    assert counted == {t: sum(t in m["tokens"] for m in msgs) for t in counted}
    r.hset(K.tokens, "1", "[]")
    w2 = url_worker(redis_server.url, [spec], fast_options("w2", token_names=50))
    w2.run_until_idle()
    w2.shutdown()
    assert r.hget(K.tokens, "1") == b"[]"  # nothing counted: not published


def test_token_names_stay_bounded():
    from streamnb_workers.observe.token_names import TokenNames

    names = TokenNames(capacity=100, every=1)
    rng = np.random.default_rng(0)
    for _ in range(300):
        names.add([f"rare{int(x)}" for x in rng.integers(0, 100_000, 50)] + ["always"])
        assert len(names.counts) <= 200
    assert names.counts["always"] == 300
    table = names.table(Featurizer(bits=20).hasher)
    assert sum(len(v) for v in table.values()) <= 100


def test_columns_are_named_by_the_message_meta_and_published_names():
    from streamnb_workers.wire.explanations import name_columns

    f = Featurizer(bits=8, meta=True)
    cheap, other = f.hasher.bucket("cheap"), f.hasher.bucket("unrelated")
    names = name_columns(f, [cheap, 256, 256 + 11, other, 3 if other != 3 else 4],
                         ["cheap", "cheap2"], {other: [("unrelated", 5)]})
    assert names[:4] == ["cheap", "meta:log_size", "meta:log_exclaim", "~unrelated"]
    assert names[4].startswith("#") or names[4] == "cheap2"
    dense = Featurizer(input="dense", dim=3)
    assert name_columns(dense, [0, 2], None) == ["x[0]", "x[2]"]


def test_a_failing_explanation_leaves_the_batch_alone(redis_server, monkeypatch):
    from streamnb_workers.worker import process

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(process, "explain_matrix", broken)
    r = redis_server.client()
    produce(r, "mail", token_messages(30, seed=8))
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", explain=2))
    w.run_until_idle()
    w.shutdown()
    assert r.xlen(K.out) == 30 and r.xlen(K.dead) == 0
    assert not any("explain" in o for o in _outputs(r).values())


def test_a_positive_class_the_model_lacks_falls_back_to_the_second(redis_server):
    r = redis_server.client()
    spec = ModelSpec("mail", kind="multinomial", featurizer_config={"bits": 10},
                     decision={"positive": "spam"})
    w = url_worker(redis_server.url, [spec], fast_options("w1", explain=2))
    produce(r, "mail", token_messages(40, classes=("ham", "news"), seed=9))
    w.run_until_idle()
    produce(r, "mail", [{"id": "t1", "tokens": ["lunch", "market"]}])
    w.run_until_idle()
    w.shutdown()
    assert r.xlen(K.out) == 41 and r.xlen(K.dead) == 0
    assert _outputs(r)["t1"]["explain"]["classes"] == ["ham", "news"]


@pytest.mark.parametrize("kind", ["multinomial", "bernoulli"])
def test_labelled_batches_carry_the_batch_term_that_closes_the_sum(redis_server, kind):
    """Predicted prequentially, a labelled message saw the labelled messages before it in
    its batch; the explanation's model did not: ``batch`` holds the difference, so the sum
    is the output's log-odds for every message."""
    r = redis_server.client()
    spec = ModelSpec("mail", kind=kind, featurizer_config={"bits": 12})
    w = url_worker(redis_server.url, [spec], fast_options("w1", explain=3, batch=40))
    produce(r, "mail", token_messages(40, classes=("spam", "ham"), seed=13))
    w.run_until_idle()
    produce(r, "mail", [m | {"id": f"b{i}"} for i, m in
                        enumerate(token_messages(80, classes=("spam", "ham"), seed=14))])
    w.run_until_idle()
    w.shutdown()
    outs = [o for o in _outputs(r).values() if o["id"].startswith("b")]
    assert len(outs) == 80
    with_batch = 0
    for o in outs:
        e, lp = o["explain"], o["log_proba"]
        total = e["bias"] + e["other"] + sum(wt for _, wt in e["tokens"]) + e.get("batch", 0.0)
        assert total == pytest.approx(lp["spam"] - lp["ham"], abs=1e-9)
        with_batch += "batch" in e
    # the first message of each batch saw no label of its batch; most others did
    assert (with_batch > 40) if kind == "multinomial" else (with_batch == 0)


def test_the_explain_setting_is_the_models_so_two_workers_agree(redis_server):
    """--explain K is stored with the model when it is created: a second worker started
    without it explains as the first does (every output explained, not half of them), and
    one given another K refuses to serve the model."""
    from streamnb.exceptions import ConfigConflict
    from streamnb_workers.store.model_config import read_config
    from tests.helpers.workers import run_in_threads

    r = redis_server.client()
    produce(r, "mail", token_messages(60, classes=("spam", "ham"), seed=3))
    first = url_worker(redis_server.url, [count_spec()], fast_options("w1", explain=2, batch=5))
    first.run_until_idle()
    assert read_config(r, "mail").explain == 2
    second = url_worker(redis_server.url, [count_spec()], fast_options("w2", batch=5))  # no --explain
    test = [{k: v for k, v in m.items() if k != "label"} | {"id": f"t{i}"}
            for i, m in enumerate(token_messages(80, classes=("spam", "ham"), seed=4))]
    produce(r, "mail", test)
    run_in_threads([first, second])
    out = _outputs(r)
    read = second.metrics.messages_read.labels(model="mail", worker="w2")._value.get()
    assert read > 0, "the second worker took none of the messages"
    assert all("explain" in out[m["id"]] for m in test)
    assert all(len(out[m["id"]]["explain"]["tokens"]) <= 2 for m in test)
    assert second.models["mail"].config.explain == 2
    other = url_worker(redis_server.url, [count_spec()], fast_options("w3", explain=5))
    with pytest.raises(ConfigConflict, match="explain: stored 2, given 5"):
        other.start()


def _raw_mails(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        c = ("spam", "ham")[int(rng.integers(2))]
        words = " ".join(map(str, rng.choice(VOCAB[c] + COMMON, size=int(rng.integers(4, 12)))))
        html = i % 3 == 0
        raw = (f"From: Sender {i} <s{i}@example{i % 4}.com>\nSubject: {words[:30]}\n"
               f"Content-Type: text/{'html' if html else 'plain'}; charset=us-ascii\n\n"
               + (f"<p>{words} <a href='http://h{i % 5}.example.org/x'>link</a></p>" if html
                  else words)).encode()
        out.append({"id": f"r{i}", "key": f"r{i}", "raw": raw,
                    **({"label": c} if i % 4 else {})})
    return out


def test_token_names_of_raw_mail_come_from_its_one_tokenization(redis_server, monkeypatch):
    """The sampled mails' names are those a second tokenization gave (the same counts, in
    the same order), and no mail is tokenized twice."""
    from streamnb.features.mail import MailTokenizer

    r = redis_server.client()
    msgs = _raw_mails(130, seed=8)
    produce(r, "mail", msgs)
    analysed: list[bytes] = []
    analyse = MailTokenizer.analyse

    def counting(self, raw, fast=True, hash_words=False):
        analysed.append(bytes(raw))
        return analyse(self, raw, fast, hash_words)

    monkeypatch.setattr(MailTokenizer, "analyse", counting)
    spec = ModelSpec("mail", kind="multinomial", featurizer_config={"bits": 16})
    w = url_worker(redis_server.url, [spec], fast_options("w1", token_names=10_000,
                                                          token_names_every=3, batch=40))
    w.run_until_idle()
    counts = w.models["mail"].token_names.counts
    w.shutdown()
    assert sorted(analysed) == sorted(m["raw"] for m in msgs)  # each mail once
    f = Featurizer(bits=16)
    expected = Counter()
    for m in msgs[2::3]:  # one mail in 3, as sampled: the 3rd, 6th, ...
        expected.update(list(dict.fromkeys(analyse(f.mail, m["raw"]).tokens)))
    assert list(counts.items()) == list(expected.items())
