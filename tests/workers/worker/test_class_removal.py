"""``streamnb forget --class LABEL`` against a real redis-server and two workers: the
removal travels on ``:in`` like a forget, its commit logs it for every replica and
releases the class's learn-once keys; afterwards every replica is the model that never
saw the class (to the bit), a key learnt under it is learnt afresh, a cached message's
label learns it afresh, and a removal replayed changes nothing more."""

from __future__ import annotations

import numpy as np
import pytest

from streamnb_workers.cli.main import main
from streamnb_workers.replication.replica import decode_log_entry
from streamnb_workers.replication.shards import load_model, shard_names
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import (
    FCFG,
    assert_same_stats,
    count_spec,
    fast_options,
    offline_model,
    produce,
    run_in_threads,
    token_messages,
    url_worker,
    vector_messages,
)
from tests.workers.worker.test_class_sets import cli_spec, outputs, probes

pytestmark = pytest.mark.redis
K = ModelKeys("mail")
PARAMS = {"n_features": 1024, "alpha": 1.0}
TYPOS = [{"id": f"t{i}", "key": f"typo-{i}", "tokens": toks, "label": "Spam"}
         for i, toks in enumerate([["cheap", "meds", "zzz"], ["free", "prize", "qqq"],
                                   ["winner", "click"]])]


def forget_class(url: str, *flags: str, model: str = "mail") -> int:
    return main(["forget", "--redis", url, "--model", model, *flags])


def caught_up(workers, name: str = "mail"):
    for w in workers:
        w.models[name].replica.catch_up()
    return [w.models[name].replica.model for w in workers]


def reference(messages):
    from streamnb_workers.store.model_config import resolve_spec

    params = resolve_spec(count_spec()).model_params
    return offline_model("multinomial", params, FCFG, messages)


@pytest.fixture
def two(redis_server):
    spec = count_spec("mail", classes="any")
    return redis_server, [url_worker(redis_server.url, [spec], fast_options(f"w{i}"))
                          for i in range(2)]


def test_removal_is_exact_on_every_replica_and_releases_the_keys(two, capsys):
    server, ws = two
    r = server.client()
    train = token_messages(80, classes=("spam", "ham"), seed=3)
    produce(r, "mail", train + TYPOS)
    run_in_threads(ws)
    assert caught_up(ws)[0].classes_.tolist() == ["Spam", "ham", "spam"]
    assert r.hexists(K.learnt_keys, "typo-0")

    assert forget_class(server.url, "--class", "Spam") == 2  # it holds weight
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds weight 3" in err[0] and "--force" in err[0]
    assert forget_class(server.url, "--class", "Spam", "--force") == 0
    assert "removing class 'Spam' (weight 3)" in capsys.readouterr().out
    run_in_threads(ws)
    a, b = caught_up(ws)
    assert_same_stats(a, b)
    assert_same_stats(a, reference(train))  # the model that never saw Spam, to the bit
    assert a.classes_.tolist() == ["ham", "spam"]
    assert not any(r.hexists(K.learnt_keys, t["key"]) for t in TYPOS)  # released
    assert r.hlen(K.learnt_keys) == len(train) == r.zcard(K.key_order)
    drops = [decode_log_entry(f[b"data"]) for _, f in r.xrange(K.log)
             if decode_log_entry(f[b"data"])["t"] == "drop"]
    assert drops == [{"t": "drop", "c": "Spam"}]

    # a released key is learnt afresh; a cached message's label learns it afresh
    produce(r, "mail", [{**TYPOS[0], "id": "t0-again", "label": "spam"},
                        {"ref": "t1", "label": "ham"}])
    run_in_threads(ws)
    out = outputs(r)["t0-again"]
    assert out["learned"] is True and "reason" not in out
    want = reference(train + [{**TYPOS[0], "label": "spam"}, {**TYPOS[1], "label": "ham"}])
    a, b = caught_up(ws)
    assert_same_stats(a, b)
    assert_same_stats(a, want)
    assert r.hget(K.learnt_keys, "typo-0") is not None

    # applied once: the entry replayed in the log, and a second removal, change nothing
    (entry,) = [f for _, f in r.xrange(K.log) if decode_log_entry(f[b"data"])["t"] == "drop"]
    r.xadd(K.log, {"data": entry[b"data"]})
    produce(r, "mail", [{"forget_class": "Spam"}])
    run_in_threads(ws)
    a, b = caught_up(ws)
    assert_same_stats(a, b)
    assert_same_stats(a, want)
    assert r.xlen(K.dead) == 0
    assert forget_class(server.url, "--class", "Spam") == 2  # no such class any more
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'Spam' is not a class of model 'mail' (classes: ham, spam)" in err[0]


def test_a_typo_class_removed_leaves_spam_and_ham_verdicts(redis_server):
    """The mail defaults with ``--classes any``: a typo label learnt once makes every
    verdict unsure (its weight is below min_class_weight); removed, verdicts are those of
    the spam/ham model again, identical on both replicas."""
    r = redis_server.client()
    ws = [url_worker(redis_server.url, [cli_spec("--classes", "any")], fast_options(f"w{i}"))
          for i in range(2)]
    produce(r, "mail", token_messages(60, classes=("spam", "ham"), seed=2))
    run_in_threads(ws)
    produce(r, "mail", [{**p, "id": f"before-{p['id']}"} for p in probes()])
    run_in_threads(ws)
    produce(r, "mail", [{"id": "typo", "key": "typo-key", "tokens": ["cheap", "meds"],
                         "label": "Spam"}])
    run_in_threads(ws)
    produce(r, "mail", [{**p, "id": f"typo-{p['id']}"} for p in probes()])
    run_in_threads(ws)
    assert forget_class(redis_server.url, "--class", "Spam", "--force") == 0
    run_in_threads(ws)
    produce(r, "mail", [{**p, "id": f"after-{p['id']}"} for p in probes()])
    run_in_threads(ws)
    out = outputs(r)
    a, b = caught_up(ws)
    assert_same_stats(a, b)
    assert a.classes_.tolist() == ["ham", "spam"]
    for i in range(3):
        before, typo, after = (out[f"{t}-p{i}"] for t in ("before", "typo", "after"))
        assert typo["label"] == "unsure"
        assert after["label"] == before["label"] in ("spam", "ham")
        assert set(after["log_proba"]) == {"spam", "ham"}
        assert after["score"] == pytest.approx(before["score"], rel=1e-9, abs=1e-12)


def test_declared_and_unknown_classes_are_refused(redis_server, capsys):
    r = redis_server.client()
    w = url_worker(redis_server.url, [cli_spec()], fast_options("w1"))
    produce(r, "mail", token_messages(20, classes=("spam", "ham"), seed=4))
    w.run_until_idle()
    before = w.models["mail"].replica.model.stats.to_bytes()
    for flags, said in [(["--class", "ham", "--force"], "'ham' is a declared class of model "
                         "'mail' (spam, ham): it is not removed"),
                        (["--class", "eggs"], "'eggs' is not a class of model 'mail'"),
                        ([], "forget takes PATH... or --class LABEL"),
                        (["--class", "eggs", "x.eml"], "forget takes PATH... or --class LABEL"),
                        (["--force", "x.eml"], "--force goes with --class LABEL")]:
        assert forget_class(redis_server.url, *flags) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    # a producer of its own is refused by the worker: a dead letter, the model unchanged
    produce(r, "mail", [{"forget_class": "ham"}, {"forget_class": "ham", "text": "x"}])
    w.run_until_idle()
    reasons = [decode_output(f[b"data"])["reason"] for _, f in r.xrange(K.dead)]
    assert reasons == ["declared_class", "several_payloads"]
    w.models["mail"].replica.catch_up()
    assert w.models["mail"].replica.model.stats.to_bytes() == before


def test_a_sharded_model_loses_the_class_in_every_shard(redis_server, capsys):
    r = redis_server.client()
    spec = count_spec("mail", classes="any", shards=2)
    ws = [url_worker(redis_server.url, [spec], fast_options(f"w{i}")) for i in range(2)]
    names = shard_names("mail", 2)
    train = token_messages(40, classes=("spam", "ham"), seed=6)
    for j, name in enumerate(names):  # a typo in each shard
        produce(r, name, [m for i, m in enumerate(train) if i % 2 == j] +
                [{**TYPOS[j], "id": f"{TYPOS[j]['id']}-{j}"}])
    run_in_threads(ws)
    assert "Spam" in load_model(r, "mail")[0].classes_.tolist()
    assert forget_class(redis_server.url, "--class", "Spam", "--force") == 0
    assert "the :in of the 2 shards" in capsys.readouterr().out
    run_in_threads(ws)
    for name in names:
        a, b = caught_up(ws, name)
        assert_same_stats(a, b)
        assert a.classes_.tolist() == ["ham", "spam"]
    for w in ws:
        assert w.models[names[0]].predictor.classes_.tolist() == ["ham", "spam"]
    total, _ = load_model(r, "mail")
    assert_same_stats(total, reference(train))


@pytest.mark.filterwarnings("ignore::streamnb.exceptions.SingularCovarianceWarning")
def test_lda_replicas_lose_the_class_and_pool_the_classes_left(redis_server):
    # (the warning: the first batches' predictions, with a class of one or two samples)
    """LDA through two workers: after the removal of ``c`` both replicas are bit-identical
    and equal (to Chan-merge rounding) the model fitted on ``a`` and ``b`` alone, its
    shared covariance pooled from those two classes."""
    r = redis_server.client()
    msgs = vector_messages(300, d=3, seed=8)
    fcfg = {"input": "dense", "dim": 3}
    spec = ModelSpec("vec", kind="lda", featurizer_config=fcfg, classes="any")
    ws = [url_worker(redis_server.url, [spec], fast_options(f"g{i}", batch=37)) for i in range(2)]
    produce(r, "vec", msgs)
    run_in_threads(ws)
    assert forget_class(redis_server.url, "--class", "c", "--force", model="vec") == 0
    run_in_threads(ws)
    a, b = caught_up(ws, "vec")
    assert_same_stats(a, b)
    ref = offline_model("lda", {}, fcfg, [m for m in msgs if m["label"] != "c"])
    assert a.classes_.tolist() == ["a", "b"]
    assert_same_stats(a, ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(a.covariance_, ref.covariance_, rtol=1e-9, atol=1e-6)
    X = np.array([m["x"] for m in msgs[:50]])
    np.testing.assert_array_equal(a.predict(X), ref.predict(X))
    np.testing.assert_allclose(a.predict_log_proba(X), ref.predict_log_proba(X), atol=1e-9)


def test_a_class_at_weight_zero_goes_without_force(redis_server, capsys):
    """A typo learnt, then its mail forgotten: the class is known at weight 0, and removing
    it needs no --force (nothing learnt goes with it)."""
    r = redis_server.client()
    w = url_worker(redis_server.url, [count_spec("mail", classes="any")], fast_options("w1"))
    train = token_messages(20, classes=("spam", "ham"), seed=7)
    produce(r, "mail", train + [TYPOS[0]])
    w.run_until_idle()
    produce(r, "mail", [{"forget": True, "key": TYPOS[0]["key"], "tokens": TYPOS[0]["tokens"]}])
    w.run_until_idle()
    (model,) = caught_up([w])
    assert "Spam" in model.classes_.tolist()
    assert forget_class(redis_server.url, "--class", "Spam") == 0
    assert "removing class 'Spam' (weight 0)" in capsys.readouterr().out
    w.run_until_idle()
    (model,) = caught_up([w])
    assert model.classes_.tolist() == ["ham", "spam"]
    assert_same_stats(model, reference(train))
