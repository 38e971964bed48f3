"""Label abuse through a real worker on a real redis-server: floods of labels for unknown
messages, alternating corrections, labels of the wrong type, labels sent to another model.
Each has a bounded effect, a clear dead-letter reason and a metric."""

from __future__ import annotations

import msgpack
import pytest
from prometheus_client import CollectorRegistry

from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    assert_same_stats,
    cached,
    count_spec,
    fast_options,
    offline_model,
    produce,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis



def _dead(r, name: str = "mail") -> list[dict]:
    return [decode_output(f[b"data"]) for _, f in r.xrange(ModelKeys(name).dead)]


def _count(metrics: Metrics, family: str, **labels: str) -> float:
    return getattr(metrics, family).labels(**labels)._value.get()


def _serve(url: str, specs=None, **kw):
    metrics = Metrics(CollectorRegistry())
    w = url_worker(url, specs or [count_spec()], fast_options("w1", **kw), metrics)
    return w, metrics


def test_flood_of_labels_for_unknown_refs(redis_server) -> None:
    r = redis_server.client()
    k = ModelKeys("mail")
    msgs = token_messages(30, seed=3)
    produce(r, "mail", msgs)
    w, metrics = _serve(redis_server.url, batch=200)
    w.run_until_idle()
    log_len = r.xlen(k.log)
    learnt = w.models["mail"].replica.learnt

    n = 3000
    produce(r, "mail", [{"ref": f"ghost{i}", "label": "spam"} for i in range(n)])
    w.run_until_idle()
    dead = _dead(r)
    assert len(dead) == n and {d["reason"] for d in dead} == {"ref_expired"}
    assert "ghost0" in dead[0]["detail"] and msgpack.unpackb(dead[0]["payload"])["ref"] == "ghost0"
    assert _count(metrics, "dead_letters", model="mail", worker="w1", reason="ref_expired") == n
    # the model is exactly what the 30 real messages made it; no delta was logged
    assert r.xlen(k.log) == log_len and w.models["mail"].replica.learnt == learnt
    assert_same_stats(w.models["mail"].replica.model, offline_model("multinomial", PARAMS, FCFG, msgs))
    assert r.xlen(k.out) == 30  # label-only messages get no prediction


def test_alternating_corrections_learn_once_with_the_last_label(redis_server) -> None:
    r = redis_server.client()
    msgs = token_messages(12, seed=4)
    target = {k: v for k, v in msgs[0].items() if k != "label"}  # m0, unlabelled at first
    msgs[0] = target
    produce(r, "mail", msgs)
    w, metrics = _serve(redis_server.url, batch=7)  # corrections spread over many batches
    w.run_until_idle()
    labels = ["spam", "ham", "news"]
    sent = [labels[i % 3] if i % 5 else labels[(i + 1) % 3] for i in range(301)]
    produce(r, "mail", [{"ref": "m0", "label": lab} for lab in sent])
    w.run_until_idle()

    final = dict(target, label=sent[-1])
    expected = offline_model("multinomial", PARAMS, FCFG, [final, *msgs[1:]])
    rep = w.models["mail"].replica
    assert_same_stats(rep.model, expected)
    assert rep.learnt == 12  # m0 counted once, as a delayed label
    assert not _dead(r)
    assert _count(metrics, "corrections", model="mail", worker="w1") >= 1
    # a second worker rebuilt from the log agrees bit for bit
    w2, _ = _serve(redis_server.url)
    w2.start()
    assert_same_stats(w2.models["mail"].replica.model, expected)


@pytest.mark.parametrize("label, reason", [
    (7, "bad_label"),  # an int among str labels: refused by the worker
    (3.5, "bad_label"),  # not str or int: refused by the decoder
    (True, "bad_label"),
    ([1, 2], "bad_label"),
    ({"a": 1}, "bad_label"),
    ("", "bad_label"),
    ("x" * 10_000, "bad_label"),
])
def test_labels_of_an_unexpected_type(redis_server, label, reason) -> None:
    r = redis_server.client()
    msgs = token_messages(10, seed=5)
    produce(r, "mail", msgs)
    produce(r, "mail", [{"id": "bad", "tokens": ["cheap", "meds"], "label": label},
                        {"ref": "m1", "label": label}])
    w, metrics = _serve(redis_server.url)
    w.run_until_idle()
    dead = _dead(r)
    assert [d["reason"] for d in dead] == [reason, reason]
    assert all(d["detail"] for d in dead)
    assert _count(metrics, "dead_letters", model="mail", worker="w1", reason=reason) == 2
    assert_same_stats(w.models["mail"].replica.model, offline_model("multinomial", PARAMS, FCFG, msgs))


def test_label_for_a_message_of_another_model(redis_server) -> None:
    """Caches are per model: a label sent to the wrong model is ref_expired there and
    changes neither model."""
    r = redis_server.client()
    vec = ModelSpec("vec", kind="gaussian", featurizer_config={"input": "dense", "dim": 2})
    mail_msgs = token_messages(10, seed=6, labelled_share=0.0)
    produce(r, "mail", mail_msgs)
    produce(r, "vec", [{"id": "v0", "x": [0.0, 1.0], "label": "a"},
                       {"id": "v1", "x": [2.0, 1.5], "label": "b"}])
    w, metrics = _serve(redis_server.url, specs=[count_spec(), vec])
    w.run_until_idle()
    before = r.xlen(ModelKeys("vec").log)
    produce(r, "vec", [{"ref": "m0", "label": "a"}])  # m0 is a mail message
    produce(r, "mail", [{"ref": "v0", "label": "spam"}])  # v0 is a vector
    w.run_until_idle()
    assert [d["reason"] for d in _dead(r, "vec")] == ["ref_expired"]
    assert [d["reason"] for d in _dead(r, "mail")] == ["ref_expired"]
    assert r.xlen(ModelKeys("vec").log) == before
    assert w.models["mail"].replica.learnt == 0 and w.models["vec"].replica.learnt == 2
    for name in ("mail", "vec"):
        assert _count(metrics, "dead_letters", model=name, worker="w1", reason="ref_expired") == 1


def test_label_for_a_tampered_cache_entry(redis_server) -> None:
    """A cached row that does not fit the model (written by something else into the cache
    key) is not learnt: the label is dead-lettered and the worker keeps serving."""
    import numpy as np

    from streamnb.features import Row
    from streamnb_workers.store.label_cache import encode_entry

    r = redis_server.client()
    msgs = token_messages(5, seed=7, labelled_share=0.0)
    produce(r, "mail", msgs)
    w, _ = _serve(redis_server.url)
    w.run_until_idle()
    wide = Row(indices=np.array([5000], dtype=np.int32), values=np.array([1.0]), n_tokens=1)
    m0, m1 = cached(r, "mail", "m0"), cached(r, "mail", "m1")
    r.hset(m0.key, m0.field, encode_entry(b"", wide.to_bytes(), "spam", {}, 1.0, 0.0))  # a bucket beyond 2**10
    r.hset(m1.key, m1.field, b"\x00\x00garbage")
    produce(r, "mail", [{"ref": "m0", "label": "spam"}, {"ref": "m1", "label": "spam"},
                        {"ref": "m2", "label": "ham"}])
    w.run_until_idle(timeout=30)
    assert sorted(d["reason"] for d in _dead(r)) == ["ref_expired", "ref_expired"]
    rep = w.models["mail"].replica
    assert rep.learnt == 1
    assert_same_stats(rep.model, offline_model("multinomial", PARAMS, FCFG,
                                               [dict(msgs[2], label="ham")]))
