"""explain(x, k): bias + every feature's contribution is the model's decision function."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import naive_bayes as skl

from streamnb.models import (
    BernoulliNB,
    CategoricalNB,
    GaussianNB,
    HybridNB,
    LinearDiscriminantAnalysis,
    MultinomialNB,
)

TOL = 1e-9


def _counts(seed: int, n: int = 300, d: int = 60, n_classes: int = 2):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, size=n)
    rates = rng.gamma(0.4, 1.0, size=(n_classes, d))
    rates[:, rng.random(d) < 0.2] = 0.0  # columns never seen in training
    X = rng.poisson(rates[y]).astype(np.float64)
    return X, np.array(["ham", "spam", "other"])[y]


def _check_identity(model, X) -> None:
    decision = model.decision_function(X)
    explained = model.explain_rows(X, k=5)
    assert len(explained) == X.shape[0]
    for e, d in zip(explained, decision, strict=True):
        assert e.features.size <= 5
        assert abs(e.bias + e.contributions.sum() + e.other - d) <= TOL * max(1.0, abs(d))
        # ranked by magnitude
        assert np.all(np.diff(np.abs(e.contributions)) <= 0)
    one = model.explain(X[0], k=3)
    assert one.as_pairs() == [p for p in explained[0].as_pairs()[:3]]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("make", [
    lambda: MultinomialNB(),
    lambda: MultinomialNB(alpha=0.1, smoothing_m="seen"),
    lambda: BernoulliNB(),
    lambda: BernoulliNB(alpha=0.1, smoothing_m="seen"),
    lambda: BernoulliNB(binarize=1.5),
    lambda: CategoricalNB(),
    lambda: MultinomialNB(class_prior=[0.9, 0.1]),
], ids=["multinomial", "multinomial-seen", "bernoulli", "bernoulli-seen", "bernoulli-binarize",
        "categorical", "multinomial-prior"])
def test_bias_plus_contributions_is_the_decision_function(seed, make):
    X, y = _counts(seed)
    model = make().fit(X[:200], y[:200])
    _check_identity(model, X[200:])
    if model.accepts_sparse:
        _check_identity(model, sp.csr_matrix(X[200:]))


@pytest.mark.parametrize("token_model", ["multinomial", "bernoulli"])
@pytest.mark.parametrize("seed", [0, 1])
def test_hybrid_identity_with_meta_columns(seed, token_model):
    X, y = _counts(seed, d=40)
    rng = np.random.default_rng(seed + 10)
    meta = rng.normal(size=(X.shape[0], 4)) * [1.0, 10.0, 1000.0, 0.01] + (y == "spam")[:, None]
    Xh = np.hstack([X, meta])
    model = HybridNB(n_meta=4, token_model=token_model, alpha=0.5).fit(Xh[:200], y[:200])
    _check_identity(model, Xh[200:])
    _check_identity(model, sp.csr_matrix(Xh[200:]))
    # meta features are named by their column: after the token columns
    e = model.explain(Xh[200], k=100)
    assert set(range(40, 44)) <= set(e.features.tolist())
    assert e.other == 0.0


def test_gaussian_nb_identity():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 300)
    X = rng.normal(size=(300, 6)) + y[:, None] * 0.7
    model = GaussianNB().fit(X[:200], y[:200])
    _check_identity(model, X[200:])


def test_multinomial_terms_match_sklearn():
    X, y = _counts(4)
    ours = MultinomialNB(alpha=0.5).fit(X[:200], y[:200])
    ref = skl.MultinomialNB(alpha=0.5).fit(X[:200], y[:200])
    w = ref.feature_log_prob_[1] - ref.feature_log_prob_[0]
    x = X[250]
    e = ours.explain(x, k=1000)
    want = {j: x[j] * w[j] for j in np.flatnonzero(x)}
    got = dict(e.as_pairs())
    assert set(got) == {j for j, v in want.items() if v != 0}
    for j, v in got.items():
        assert v == pytest.approx(want[j], abs=TOL)
    jll = ref.predict_joint_log_proba(x[None, :])[0]
    assert e.log_odds == pytest.approx(jll[1] - jll[0], abs=TOL)


def test_bernoulli_weights_are_sklearns_logit_differences():
    X, y = _counts(5)
    ours = BernoulliNB(alpha=1.0).fit(X[:200], y[:200])
    ref = skl.BernoulliNB(alpha=1.0).fit(X[:200], y[:200])
    logit = ref.feature_log_prob_ - np.log1p(-np.exp(ref.feature_log_prob_))
    w = logit[1] - logit[0]
    x = X[260]
    present = np.flatnonzero(x > 0)
    e = ours.explain(x, k=present.size)
    assert sorted(e.features.tolist()) == sorted(j for j in present.tolist() if w[j] != 0)
    for j, v in e.as_pairs():
        assert v == pytest.approx(w[j], abs=TOL)
    # the order is by |true weight|
    assert e.features.tolist() == sorted(present.tolist(), key=lambda j: (-abs(w[j]), j))
    jll = ref.predict_joint_log_proba(x[None, :])[0]
    assert e.log_odds == pytest.approx(jll[1] - jll[0], abs=TOL)


def test_bernoulli_ranks_by_true_weight_not_presence_ratio():
    # 10 documents per class. Feature 0: present in 9 spam, 5 ham (theta 0.9 vs 0.5);
    # feature 1: present in 2 spam, 1 ham (0.2 vs 0.1). log(theta_s/theta_h) ranks feature
    # 1 first (0.69 > 0.59); the true weights logit(0.9) - logit(0.5) = 2.20 and
    # logit(0.2) - logit(0.1) = 0.81 rank feature 0 first.
    spam = np.zeros((10, 2))
    spam[:9, 0] = 1
    spam[:2, 1] = 1
    ham = np.zeros((10, 2))
    ham[:5, 0] = 1
    ham[:1, 1] = 1
    model = BernoulliNB(alpha=1e-10).fit(np.vstack([spam, ham]), ["spam"] * 10 + ["ham"] * 10)
    e = model.explain(np.array([1, 1]), k=2)
    assert e.classes == ("ham", "spam")
    assert e.features.tolist() == [0, 1]
    assert e.contributions == pytest.approx([np.log(9) - 0.0, np.log(0.25) - np.log(1 / 9)], abs=1e-8)
    ratio = np.log([0.9 / 0.5, 0.2 / 0.1])
    assert ratio[1] > ratio[0]  # the old ranking would reverse the order
    assert e.log_odds == pytest.approx(model.decision_function(np.array([[1, 1]]))[0], abs=TOL)


def test_class_pair_of_a_three_class_model():
    X, y = _counts(6, n_classes=3)
    model = MultinomialNB().fit(X[:200], y[:200])
    with pytest.raises(ValueError, match="classes=\\(negative, positive\\)"):
        model.explain(X[200])
    jll = model.predict_joint_log_proba(X[200:])
    cls = model.classes_.tolist()
    for e, row in zip(model.explain_rows(X[200:], k=4, classes=("spam", "other")), jll, strict=True):
        assert e.classes == ("spam", "other")
        assert e.log_odds == pytest.approx(row[cls.index("other")] - row[cls.index("spam")], abs=TOL)


def test_k_zero_puts_everything_in_other_and_k_larger_than_row():
    X, y = _counts(7)
    model = MultinomialNB().fit(X, y)
    e0 = model.explain(X[0], k=0)
    assert e0.features.size == 0 and e0.bias + e0.other == pytest.approx(e0.log_odds)
    eall = model.explain(X[0], k=10_000)
    assert eall.other == 0.0 and eall.features.size == np.count_nonzero(X[0])


def test_bad_calls():
    X, y = _counts(8)
    model = MultinomialNB().fit(X, y)
    with pytest.raises(ValueError, match="k must be"):
        model.explain(X[0], k=-1)
    with pytest.raises(ValueError, match="one message"):
        model.explain(X[:2])
    with pytest.raises(ValueError, match="not learnt"):
        model.explain(X[0], classes=("ham", "nope"))
    with pytest.raises(ValueError, match="two different"):
        model.explain(X[0], classes=("ham", "ham"))
    lda = LinearDiscriminantAnalysis().fit(np.random.default_rng(0).normal(size=(20, 2)), [0, 1] * 10)
    with pytest.raises(ValueError, match="does not split"):
        lda.explain(np.zeros(2))
    one = MultinomialNB().partial_fit(X[:3], ["ham"] * 3, classes=["ham", "spam"])
    with pytest.raises(ValueError, match="hold no weight"):
        one.explain(X[0])


def test_top_terms_breaks_ties_by_the_lower_column_at_the_cut():
    from streamnb.models.explanation import top_terms

    e = top_terms(0.0, np.array([5, 3, 9, 1, 7]), np.array([1.0, -1.0, 1.0, 0.5, 0.0]), 2, ("a", "b"))
    assert e.features.tolist() == [3, 5] and e.contributions.tolist() == [-1.0, 1.0]
    assert e.other == 1.5
    every = top_terms(0.0, np.array([5, 3, 9, 1, 7]), np.array([1.0, -1.0, 1.0, 0.5, 0.0]), 9, ("a", "b"))
    assert every.features.tolist() == [3, 5, 9, 1] and every.other == 0.0  # a zero term is never named


def test_other_keeps_its_digits_next_to_a_huge_term():
    from streamnb.models.explanation import top_terms

    e = top_terms(0.0, np.arange(3), np.array([2.5e9, 0.1, 0.2]), 1, ("a", "b"))
    assert e.other == 0.1 + 0.2
