"""The work loop against a real redis-server: N workers learn exactly what one offline fit learns."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
import redis

from streamnb.exceptions import ConfigConflict
from streamnb_workers.defaults import DEFAULT_MAIL_ALPHA
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.model_config import ModelSpec, resolve_spec
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import (
    assert_same_stats,
    count_spec,
    fast_options,
    learnt_model,
    offline_model,
    produce,
    run_in_threads,
    spawn_worker,
    token_messages,
    url_worker,
    vector_messages,
)

pytestmark = pytest.mark.redis


def _outputs(r: redis.Redis, name: str) -> list[dict]:
    return [decode_output(f[b"data"]) for _, f in r.xrange(ModelKeys(name).out)]


@pytest.mark.parametrize("n_workers", [1, 2, 3])
def test_workers_learn_what_one_offline_fit_learns(redis_server, n_workers):
    r = redis_server.client()
    msgs = token_messages(2000, seed=n_workers, labelled_share=0.8)
    produce(r, "mail", msgs)
    spec = count_spec()
    workers = [url_worker(redis_server.url, [spec], fast_options(f"w{i}")) for i in range(n_workers)]
    run_in_threads(workers)
    params = resolve_spec(count_spec()).model_params  # exactly what the daemon runs
    ref = offline_model("multinomial", params, {"bits": 10, "counts": "raw"}, msgs)
    versions = set()
    for w in workers:
        rep = w.models["mail"].replica
        assert_same_stats(rep.model, ref)
        assert rep.learnt == sum(1 for m in msgs if "label" in m)
        versions.add(rep.version)
    assert len(versions) == 1
    # every message has exactly one prediction, nothing pending, nothing dead
    outs = _outputs(r, "mail")
    assert sorted(o["id"] for o in outs) == sorted(m["id"] for m in msgs)
    assert r.xpending(ModelKeys("mail").input, GROUP)["pending"] == 0
    assert r.xlen(ModelKeys("mail").dead) == 0
    # test-then-train: labelled outputs carry their true label, learned=True
    lab = [o for o in outs if "true_label" in o]
    assert lab and all(o["learned"] for o in lab)
    if n_workers > 1:  # the work was shared
        assert len({o["worker"] for o in outs}) > 1


def test_gaussian_moments_match_offline_within_1e9(redis_server):
    r = redis_server.client()
    msgs = vector_messages(1500, d=3, seed=3)
    produce(r, "vec", msgs)
    spec = ModelSpec("vec", kind="gaussian", featurizer_config={"input": "dense", "dim": 3})
    workers = [url_worker(redis_server.url, [spec], fast_options(f"g{i}", batch=37))
               for i in range(2)]
    run_in_threads(workers)
    ref = offline_model("gaussian", {}, {"input": "dense", "dim": 3}, msgs)
    for w in workers:
        assert_same_stats(w.models["vec"].replica.model, ref, rtol=1e-9, atol=1e-9)
    # both replicas are bit-identical (same log, same order)
    assert_same_stats(workers[0].models["vec"].replica.model, workers[1].models["vec"].replica.model)


def test_separate_processes_converge(redis_server, tmp_path):
    r = redis_server.client()
    msgs = token_messages(2000, seed=7)
    spec = count_spec()
    opts = {"batch": 40, "block_ms": 50, "heartbeat_s": 0.5, "snapshot_every": 300,
            "trim_margin_ms": 0, "claim_idle_ms": 2000}
    procs = [spawn_worker(redis_server.url, spec, dict(opts, consumer=f"p{i}"),
                          tmp_path / f"p{i}.log") for i in range(2)]
    k = ModelKeys("mail")
    try:
        deadline = time.monotonic() + 30
        while r.hlen(k.workers) < 2 and time.monotonic() < deadline:  # both up (heartbeats)
            time.sleep(0.05)
        produce(r, "mail", msgs)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if r.xlen(k.out) >= len(msgs) and r.xpending(k.input, GROUP)["pending"] == 0:
                break
            time.sleep(0.1)
        assert r.xlen(k.out) == len(msgs)
    finally:
        for p in procs:
            p.terminate()
        codes = [p.wait(20) for p in procs]
    assert codes == [0, 0], [(tmp_path / f"p{i}.log").read_text()[-2000:] for i in range(2)]
    model, version = learnt_model(r, "mail")
    params = resolve_spec(count_spec()).model_params  # exactly what the daemon runs
    ref = offline_model("multinomial", params, {"bits": 10, "counts": "raw"}, msgs)
    assert_same_stats(model, ref)
    assert int(r.get(k.learnt)) == len(msgs)
    # warm shutdown removed both consumers (nothing pending) and their heartbeats
    assert r.xinfo_groups(k.input)[0]["consumers"] == 0
    assert r.hlen(k.workers) == 0


def test_malformed_messages_go_to_dead_and_the_worker_goes_on(redis_server):
    r = redis_server.client()
    k = ModelKeys("mail")
    good = token_messages(20, seed=1)
    produce(r, "mail", good[:10])
    r.xadd(k.input, {"data": b"\xc1not msgpack"})
    r.xadd(k.input, {"data": msgpack.packb({"tokens": ["a"], "text": "b"})})
    r.xadd(k.input, {"data": msgpack.packb({"x": [1.0, 2.0], "label": "spam"})})
    r.xadd(k.input, {"data": msgpack.packb({"tokens": ["a"], "label": 7})})  # int among str
    r.xadd(k.input, {"other": b"field"})
    produce(r, "mail", good[10:])
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1"))
    w.run_until_idle()
    dead = [decode_output(f[b"data"]) for _, f in r.xrange(k.dead)]
    assert [d["reason"] for d in dead] == [
        "not_msgpack", "several_payloads", "incompatible_payload", "bad_label", "no_data"]
    assert dead[0]["payload"] == b"\xc1not msgpack"
    assert "this model's labels are str" in dead[3]["detail"]
    assert r.xlen(k.out) == 20
    assert r.xpending(k.input, GROUP)["pending"] == 0
    assert_same_stats(w.models["mail"].replica.model,
                      offline_model("multinomial", {"n_features": 1024},
                                    {"bits": 10, "counts": "raw"}, good))


def test_conflicting_config_raises_and_names_the_difference(redis_server):
    r = redis_server.client()
    url_worker(redis_server.url, [count_spec()], fast_options("w1")).start()
    other = ModelSpec("mail", kind="multinomial", model_params={"alpha": 0.5},
                      featurizer_config={"bits": 12, "counts": "raw"})
    with pytest.raises(ConfigConflict) as err:
        url_worker(redis_server.url, [other], fast_options("w2")).start()
    text = str(err.value)
    # the stored alpha is the hashed-mail default (DEFAULT_MAIL_ALPHA), filled in at creation
    assert f"model_params.alpha: stored {DEFAULT_MAIL_ALPHA}, given 0.5" in text
    assert "featurizer.bits: stored 10, given 12" in text
    with pytest.raises(ConfigConflict, match="kind: stored 'multinomial', given 'bernoulli'"):
        url_worker(redis_server.url, [ModelSpec("mail", kind="bernoulli")], fast_options("w3")).start()
    # no kind given: the stored config is used
    w = url_worker(redis_server.url, [ModelSpec("mail")], fast_options("w4"))
    w.start()
    assert w.models["mail"].config.featurizer["bits"] == 10
    assert r.hget(ModelKeys("mail").config, "kind") == b"multinomial"


def test_refuses_to_clobber_a_non_stream_input_key(redis_server):
    r = redis_server.client()
    r.set(ModelKeys("mail").input, "precious")
    with pytest.raises(Exception, match="is a string, not a stream"):
        url_worker(redis_server.url, [count_spec()], fast_options("w1")).start()
    assert r.get(ModelKeys("mail").input) == b"precious"


def test_one_worker_serves_several_models(redis_server):
    r = redis_server.client()
    a, b = token_messages(300, seed=1), token_messages(200, seed=2, classes=("spam", "ham"))
    produce(r, "alpha", a)
    produce(r, "beta", b)
    specs = [count_spec("alpha"), ModelSpec("beta", kind="bernoulli",
                                            featurizer_config={"bits": 9})]
    w = url_worker(redis_server.url, specs, fast_options("w1"))
    w.run_until_idle()
    assert_same_stats(w.models["alpha"].replica.model,
                      offline_model("multinomial", {"n_features": 1024},
                                    {"bits": 10, "counts": "raw"}, a))
    assert_same_stats(w.models["beta"].replica.model,
                      offline_model("bernoulli", {"n_features": 512}, {"bits": 9}, b))
    assert r.xlen(ModelKeys("alpha").out) == 300 and r.xlen(ModelKeys("beta").out) == 200


def test_forgetting_decays_every_replica_at_the_same_log_position(redis_server):
    r = redis_server.client()
    msgs = token_messages(400, seed=5)
    produce(r, "mail", msgs)
    spec = count_spec(half_life=100.0)  # a decay event every 5 learnt messages, g = 0.5**0.05
    workers = [url_worker(redis_server.url, [spec], fast_options(f"w{i}", batch=7)) for i in range(2)]
    run_in_threads(workers)
    k = ModelKeys("mail")
    kinds = [msgpack.unpackb(f[b"data"])["t"] for _, f in r.xrange(k.log)]
    assert kinds.count("decay") == 400 // 5
    m0, m1 = (w.models["mail"].replica.model for w in workers)
    assert_same_stats(m0, m1)
    # replay the log by hand: a decay multiplies the total weight by g
    total = 0.0
    from streamnb.stats.bundle import StatsBundle
    for _, f in r.xrange(k.log):
        e = msgpack.unpackb(f[b"data"])
        if e["t"] == "decay":
            total *= 0.5 ** (5 / 100)
        else:
            total += StatsBundle.from_bytes(e["add"])["classes"].total
    assert m0.stats["classes"].total == pytest.approx(total, rel=1e-12)
    assert total < 400 * 0.5  # 400 messages over 4 half-lives: most weight forgotten


def test_predictions_use_the_model_before_the_batch(redis_server):
    # prequential=False: the whole batch is predicted with the model before it (the default,
    # prequential within the batch, is tested in tests/streamnb/models/test_prequential.py)
    r = redis_server.client()
    k = ModelKeys("mail")
    produce(r, "mail", [{"id": "first", "tokens": ["cheap"], "label": "spam"}])
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", prequential=False))
    w.run_until_idle()
    first = _outputs(r, "mail")[0]
    assert first["label"] is None and first["log_proba"] == {}  # nothing learnt before it
    produce(r, "mail", [{"id": "h", "tokens": ["lunch"], "label": "ham"},
                        {"id": "q", "tokens": ["cheap", "cheap"]}])
    w.run_until_idle()
    outs = {o["id"]: o for o in _outputs(r, "mail")}
    # the batch [h, q] was predicted with the model that knew only "spam"
    assert set(outs["q"]["log_proba"]) == {"spam"} and outs["q"]["label"] == "spam"
    assert first["model_version"] == "0-0"
    assert outs["q"]["model_version"] == r.xrange(k.log)[0][0].decode()  # after "first" only
    params = resolve_spec(count_spec()).model_params  # exactly what the daemon runs
    ref = offline_model("multinomial", params, {"bits": 10, "counts": "raw"},
                        [{"tokens": ["cheap"], "label": "spam"}, {"tokens": ["lunch"], "label": "ham"}])
    produce(r, "mail", [{"id": "z", "tokens": ["cheap", "lunch", "lunch"]}])
    w.run_until_idle()
    z = {o["id"]: o for o in _outputs(r, "mail")}["z"]
    from streamnb.features import Featurizer
    from streamnb_workers.wire.codec import decode_input
    f = Featurizer.from_config({"bits": 10, "counts": "raw"})
    X = f.stack([f.featurize(decode_input(msgpack.packb({"tokens": ["cheap", "lunch", "lunch"]}), "0-0").as_payload())])
    expect = dict(zip(ref.classes_.tolist(), ref.predict_log_proba(X)[0].tolist(), strict=True))
    assert z["log_proba"] == pytest.approx(expect, abs=1e-12)
    assert np.isclose(np.logaddexp(*z["log_proba"].values()), 0.0)


def test_snapshot_trimming_and_a_late_joiner_converge(redis_server):
    r = redis_server.client()
    k = ModelKeys("mail")
    msgs = token_messages(1200, seed=9)
    produce(r, "mail", msgs[:800])
    first = url_worker(redis_server.url, [count_spec()],
                       fast_options("w1", batch=20, snapshot_every=10, trim_margin_ms=0))
    first.run_until_idle()
    assert first.models["mail"].snapshotter.written >= 3
    assert r.xlen(k.log) < 40  # 40 deltas were committed; the log was trimmed below the snapshot
    late = url_worker(redis_server.url, [count_spec()], fast_options("w2", batch=20))
    late.start()
    assert late.models["mail"].replica.reloads == 1  # it started from the snapshot
    produce(r, "mail", msgs[800:])
    run_in_threads([first, late])
    params = resolve_spec(count_spec()).model_params  # exactly what the daemon runs
    ref = offline_model("multinomial", params, {"bits": 10, "counts": "raw"}, msgs)
    for w in (first, late):
        assert_same_stats(w.models["mail"].replica.model, ref)
    assert first.models["mail"].replica.version == late.models["mail"].replica.version
