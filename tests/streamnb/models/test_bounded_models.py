"""Bounded by design: a categorical value beyond the model's limit is refused before it
costs memory (ValueError in the library, ``bad_category`` in the daemon), and no model
returns NaN on any input that passes its validation."""

from __future__ import annotations

import tracemalloc
import warnings

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamnb.models import make_model
from streamnb.models.categorical import CategoricalNB
from streamnb.stats.category_counts import DEFAULT_MAX_CATEGORIES, CategoryCounts
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import fast_options, url_worker


# ------------------------------------------------------------------ categorical limit
@pytest.mark.parametrize("value", [DEFAULT_MAX_CATEGORIES, 10_000_000, 2.0**40, 1e300])
def test_a_category_beyond_the_limit_is_a_value_error_that_allocates_nothing(value):
    X = np.array([[0.0, 1.0], [1.0, value]])
    tracemalloc.start()
    with pytest.raises(ValueError, match=r"feature 1 is beyond the limit: categories are 0 \.\. "
                                         rf"{DEFAULT_MAX_CATEGORIES - 1}"):
        CategoricalNB().partial_fit(X, ["a", "b"])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000  # (10,000,000 categories of 2 classes would be 160 MB)
    with pytest.raises(ValueError, match="beyond the limit"):
        CategoryCounts().update(X, ["a", "b"])


def test_the_limit_is_a_parameter_and_the_largest_category_below_it_is_learnt():
    model = CategoricalNB(max_categories=4).fit(np.array([[3], [0]]), ["a", "b"])
    assert model.n_categories_.tolist() == [4]
    assert model.get_params()["max_categories"] == 4
    with pytest.raises(ValueError, match=r"category 4 of feature 0 .* \(max_categories=4\)"):
        model.partial_fit(np.array([[4]]), ["a"])
    with pytest.raises(ValueError, match="beyond the limit"):  # predicting is validated alike
        model.predict(np.array([[4]]))
    assert model.n_categories_.tolist() == [4]  # nothing was learnt from the refused batch
    with pytest.raises(ValueError, match="max_categories must be an int >= 1"):
        CategoricalNB(max_categories=0).fit(np.array([[0]]), ["a"])


@pytest.mark.redis
def test_the_daemon_dead_letters_a_category_beyond_the_limit(redis_server):
    r = redis_server.client()
    k = ModelKeys("cat")
    spec = ModelSpec("cat", kind="categorical", model_params={"max_categories": 16},
                     featurizer_config={"input": "dense", "dim": 2})
    for x, label in [([0, 1], "a"), ([1, 10_000_000], "b"), ([2, 3], "b"), ([-1, 0], "a"),
                     ([0.5, 0], "a"), ([15, 15], "a")]:
        r.xadd(k.input, {"data": msgpack.packb({"x": x, "label": label})})
    w = url_worker(redis_server.url, [spec], fast_options("w1"))
    w.run_until_idle()
    dead = [decode_output(f[b"data"]) for _, f in r.xrange(k.dead)]
    assert [d["reason"] for d in dead] == ["bad_category"] * 3
    assert "category 10000000 of feature 1 is beyond the limit" in dead[0]["detail"]
    assert "Negative" in dead[1]["detail"] and "0.5" in dead[2]["detail"]
    assert r.xlen(k.out) == 3 and r.xpending(k.input, GROUP)["pending"] == 0
    model = w.models["cat"].replica.model
    assert model.n_categories_.tolist() == [16, 16]
    assert model.class_count_.tolist() == [2.0, 1.0]


# ------------------------------------------------------------------ no NaN, ever
KINDS = ("multinomial", "bernoulli", "categorical", "gaussian", "lda", "qda", "hybrid")
_weights = st.sampled_from([0.0, 1e-300, 1e-10, 0.5, 1.0, 3.0, 1e10, 1e300])


@st.composite
def _fits(draw):
    kind = draw(st.sampled_from(KINDS))
    n, d = draw(st.integers(1, 6)), draw(st.integers(2 if kind == "hybrid" else 1, 3))
    if kind == "categorical":
        values = st.integers(0, 5).map(float)
    elif kind in ("multinomial", "bernoulli", "hybrid"):  # (hybrid: counts, then 1 meta)
        values = st.sampled_from([0.0, 1.0, 2.0, 1e-300, 1e300])
    else:
        values = st.one_of(st.floats(-1e300, 1e300), st.sampled_from([0.0, 1.0, -1.0]))
    X = np.array(draw(st.lists(st.lists(values, min_size=d, max_size=d), min_size=n, max_size=n)))
    y = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n))
    w = np.array(draw(st.lists(_weights, min_size=n, max_size=n)))
    rows = draw(st.lists(st.lists(values, min_size=d, max_size=d), min_size=1, max_size=3))
    return kind, X, y, w, np.array(rows)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_fits())
def test_no_model_returns_nan_on_input_that_passes_validation(fit):
    kind, X, y, w, X_new = fit
    model = make_model(kind, **({"n_meta": 1} if kind == "hybrid" else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (singular covariances are jittered, and say so)
        try:
            model.partial_fit(X, y, sample_weight=w)
        except ValueError:
            return  # refused at validation: a clear error, no model
        for rows in (X, X_new):
            lp = model.predict_log_proba(rows)
            assert not np.isnan(lp).any(), (kind, X, y, w, rows, lp)
            assert (lp <= 1e-9).all()
            assert np.isfinite(lp).any(axis=1).all()  # a distribution: some class is possible
            assert len(model.predict(rows)) == len(rows)


@pytest.mark.parametrize("kind", ["gaussian", "lda", "qda"])
def test_zero_total_weight_predicts_the_uniform_prior(kind):
    X = np.array([[1.0, 2.0], [2.0, 0.0], [0.0, 3.0]])
    model = make_model(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.partial_fit(X, ["a", "b", "a"], sample_weight=np.zeros(3))
        lp = model.predict_log_proba(np.array([[1.0, 1.0], [1e300, -1e300]]))
    np.testing.assert_allclose(lp, np.log(0.5))
