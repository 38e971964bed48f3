"""HybridNB: token block + Gaussian meta block add in log space, one prior (vs scikit-learn)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import logsumexp
from sklearn.naive_bayes import BernoulliNB as SkBernoulli
from sklearn.naive_bayes import GaussianNB as SkGaussian
from sklearn.naive_bayes import MultinomialNB as SkMultinomial

from streamnb.models import dumps, loads, make_model
from streamnb.models.hybrid import HybridNB

N_TOK, N_META = 30, 3


def data(seed=0, n=60):
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(n) < 0.4, "spam", "ham")
    tok = rng.poisson(np.where((y == "spam")[:, None], np.linspace(2, 0.1, N_TOK), np.linspace(0.1, 2, N_TOK)))
    meta = rng.normal(np.where((y == "spam")[:, None], 1.0, -0.5), 1.0, size=(n, N_META))
    return sp.csr_matrix(np.hstack([tok, meta])), tok.astype(float), meta, y.tolist()


@pytest.mark.parametrize("token_model", ["multinomial", "bernoulli"])
def test_joint_log_likelihood_is_the_sum_of_the_blocks_minus_one_prior(token_model):
    X, tok, meta, y = data()
    model = HybridNB(N_META, token_model, alpha=0.5, n_features=N_TOK + N_META, smoothing_m="columns",
                     var_smoothing=1e-9).fit(X, y)
    sk_tok = (SkMultinomial(alpha=0.5) if token_model == "multinomial" else SkBernoulli(alpha=0.5)).fit(tok, y)
    sk_meta = SkGaussian(var_smoothing=1e-9).fit(meta, y)
    Xt, tt, mt, _ = data(seed=1, n=20)
    order = [list(sk_tok.classes_).index(c) for c in model.classes_]
    prior = np.log(np.bincount([list(sk_tok.classes_).index(c) for c in y]) / len(y))
    expected = (sk_tok.predict_joint_log_proba(tt) + sk_meta.predict_joint_log_proba(mt) - prior)[:, order]
    got = model.predict_joint_log_proba(Xt)
    assert np.allclose(got, expected, rtol=1e-9, atol=1e-8)
    log_post = model.predict_log_proba(Xt)
    assert np.allclose(log_post, expected - logsumexp(expected, axis=1, keepdims=True))
    assert model.predict(Xt).tolist() == model.classes_[np.argmax(expected, axis=1)].tolist()


def test_dense_input_accepted_and_equal_to_sparse():
    X, *_rest, y = data()
    a = HybridNB(N_META).fit(X, y)
    b = HybridNB(N_META).fit(X.toarray(), y)
    assert np.allclose(a.predict_log_proba(X), b.predict_log_proba(X.toarray()))


def test_partial_fit_merge_and_unlearn_equal_one_fit():
    X, *_rest, y = data(n=80)
    full = HybridNB(N_META).fit(X, y)
    inc = HybridNB(N_META).partial_fit(X[:30], y[:30]).partial_fit(X[30:], y[30:])
    other = HybridNB(N_META).partial_fit(X[50:], y[50:])
    merged = HybridNB(N_META).partial_fit(X[:50], y[:50]).merge(other)
    unlearnt = HybridNB(N_META).fit(X, y).partial_fit(X[:10], y[:10]).unlearn(X[:10], y[:10])
    ref = full.predict_log_proba(X)
    for m in (inc, merged, unlearnt):
        assert np.allclose(m.predict_log_proba(X), ref, atol=1e-8)


def test_batch_stats_delta_has_the_three_parts_and_applies():
    X, *_rest, y = data()
    model = HybridNB(N_META).fit(X[:20], y[:20])
    delta = model.batch_stats(X[20:], y[20:])
    assert set(delta.parts) == {"classes", "features", "moments"}
    model.merge_stats(delta)
    assert np.allclose(model.predict_log_proba(X), HybridNB(N_META).fit(X, y).predict_log_proba(X))


def test_model_file_round_trip_and_make_model():
    X, *_rest, y = data()
    model = make_model("hybrid", n_meta=N_META, token_model="bernoulli", alpha=0.3).fit(X, y)
    clone = loads(dumps(model))
    assert clone.get_params() == model.get_params()
    assert np.array_equal(clone.predict_log_proba(X), model.predict_log_proba(X))


def test_validation_messages():
    X, *_rest, y = data()
    model = HybridNB(N_META, n_features=N_TOK + N_META).fit(X, y)
    with pytest.raises(ValueError, match=f"X has {N_TOK} features, but HybridNB is expecting {N_TOK + N_META} features"):
        model.predict(X[:, :N_TOK])
    bad = X.toarray()
    bad[0, 0] = -1
    with pytest.raises(ValueError, match="non-negative"):
        model.partial_fit(bad, y)
    with pytest.raises(ValueError, match="n_meta"):  # checked before learning, not at init
        HybridNB(0).fit(X, y)
    with pytest.raises(ValueError, match="token_model"):
        HybridNB(2, token_model="gaussian").validate_params()
    with pytest.raises(ValueError, match="total width"):
        HybridNB(5, n_features=5).validate_params()


def test_one_sample_class_does_not_divide_by_zero():
    X, *_rest, y = data()
    y = ["ham"] * (len(y) - 1) + ["rare"]
    with np.errstate(all="raise"):
        model = HybridNB(N_META).fit(X, y)
    assert np.isfinite(model.predict_log_proba(X)).all()
