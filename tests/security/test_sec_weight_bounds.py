"""Bounded weights and values through a real worker on a real ``redis-server``: a weight
above ``--max-weight`` is a ``bad_weight`` dead letter, a value beyond ``--max-value`` a
``too_large`` one, both counted; what is learnt at the bounds leaves every statistic
finite, and the snapshot written from it loads (docs/reliability.md, "Bounds")."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamnb.models.io import dumps, loads
from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.codec import DEFAULT_LIMITS, DEFAULT_MAX_VALUE, DEFAULT_MAX_WEIGHT
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import count_spec, fast_options, learnt_model, url_worker

pytestmark = pytest.mark.redis

TOP = DEFAULT_MAX_WEIGHT


def _send(r, keys, messages):
    for m in messages:
        r.xadd(keys.input, {"data": msgpack.packb(m, use_bin_type=True)})


def _dead_reasons(r, keys):
    return [decode_output(f[b"data"])["reason"] for _, f in r.xrange(keys.dead)]


def _finite(model):
    for part in model.stats.parts.values():
        for value in vars(part).values():
            if isinstance(value, np.ndarray):
                assert np.isfinite(value).all(), part


@pytest.mark.parametrize("spec", [
    count_spec("counts", half_life=4.0),
    ModelSpec("dense", kind="qda", featurizer_config={"input": "dense", "dim": 2}, half_life=4.0),
], ids=["multinomial", "qda"])
def test_weights_and_values_beyond_the_bounds_are_dead_letters(redis_server, spec):
    r = redis_server.client()
    keys = ModelKeys(spec.name)
    dense = spec.kind == "qda"

    def payload(i):
        if dense:
            return {"x": [DEFAULT_MAX_VALUE * (-1) ** i, float(i)]}
        return {"features": {"cheap": DEFAULT_MAX_VALUE, f"w{i}": 1.0}}

    refused = [{**payload(0), "label": "spam", "weight": 1e308},
               {**payload(1), "label": "ham", "weight": TOP * 1.000001},
               {**payload(2), "label": "ham", "weight": 2**63 - 1}]
    beyond = ({"x": [1e200, 0.0], "label": "spam"} if dense
              else {"features": {"cheap": 1e200}, "label": "spam"})
    accepted = [{**payload(i), "id": f"m{i}", "label": ("spam", "ham")[i % 2], "weight": TOP}
                for i in range(12)]
    _send(r, keys, refused + [beyond] + accepted)
    metrics = Metrics(CollectorRegistry())
    options = fast_options("w1", batch=5, snapshot_every=1)
    w = url_worker(redis_server.url, [spec], options, metrics)
    w.run_until_idle(timeout=60)

    assert _dead_reasons(r, keys) == ["bad_weight"] * 3 + ["too_large"]
    dead = decode_output(r.xrange(keys.dead, count=1)[0][1][b"data"])
    assert dead["detail"] == "weight 1e+308 is above the limit 1e+06"
    count = metrics.dead_letters.labels(model=spec.name, worker="w1", reason="bad_weight")
    assert count._value.get() == 3
    model = w.models[spec.name].replica.model
    assert w.models[spec.name].replica.learnt == len(accepted)
    _finite(model)
    assert r.hget(keys.snapshot, "data")  # the lease holder wrote one, and it loads
    loaded, _version = learnt_model(r, spec.name)
    _finite(loaded)
    assert dumps(loads(dumps(loaded))) == dumps(loaded)


def test_the_bounds_are_worker_settings(redis_server):
    r = redis_server.client()
    keys = ModelKeys("low")
    _send(r, keys, [{"text": "a", "label": "spam", "weight": 11.0},
                    {"text": "b", "label": "spam", "weight": 10.0},
                    {"features": {"a": 101.0}, "label": "ham"}])
    limits = dataclasses.replace(DEFAULT_LIMITS, max_weight=10.0, max_value=100.0)
    w = url_worker(redis_server.url, [count_spec("low")], fast_options("w1", limits=limits))
    w.run_until_idle(timeout=30)
    assert _dead_reasons(r, keys) == ["bad_weight", "too_large"]
    assert w.models["low"].replica.model.class_count_.tolist() == [10.0]
    with pytest.raises(ValueError, match="max_weight must be a finite number > 0"):
        dataclasses.replace(DEFAULT_LIMITS, max_weight=float("inf"))
