"""MultinomialNB, BernoulliNB, CategoricalNB against scikit-learn, and their bad-input handling."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import naive_bayes as skl
from sklearn.datasets import load_digits

from streamnb.models import make_model
from streamnb.models.bernoulli import BernoulliNB
from streamnb.models.categorical import CategoricalNB
from streamnb.models.io import dumps, loads
from streamnb.models.multinomial import MultinomialNB

TOL = 1e-8


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X, y


def sparse_counts(seed: int = 0, n: int = 400, d: int = 300, n_classes: int = 3):
    """Random CSR counts whose columns depend on the class; some columns never occur."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, size=n)
    rates = rng.gamma(0.3, 1.0, size=(n_classes, d))
    rates[:, rng.random(d) < 0.2] = 0.0
    X = rng.poisson(rates[y] * 0.5).astype(np.float64)
    return sp.csr_matrix(X), y


def in_order(model, log_proba: np.ndarray, classes) -> np.ndarray:
    """Reorder the columns of ``log_proba`` (model.classes_ order) into ``classes`` order."""
    pos = {c: i for i, c in enumerate(model.classes_.tolist())}
    return log_proba[:, [pos[c] for c in np.asarray(classes).tolist()]]


def assert_parity(model, sk, X_test) -> None:
    got = in_order(model, model.predict_log_proba(X_test), sk.classes_)
    np.testing.assert_allclose(got, sk.predict_log_proba(X_test), rtol=0, atol=TOL)
    assert (model.predict(X_test) == sk.predict(X_test)).mean() > 0.999


def fit_batches(model, X, y, rng, X_probe, n_batches=7):
    """partial_fit in random mini-batches, predicting in between (exercises the incremental refresh)."""
    order = rng.permutation(X.shape[0])
    for chunk in np.array_split(order, n_batches):
        model.partial_fit(X[chunk], y[chunk])
        model.predict_log_proba(X_probe)
    return model


def fit_merged(make, X, y, rng, n_parts):
    part = rng.integers(0, n_parts, size=X.shape[0])
    models = [make().fit(X[part == p], y[part == p]) for p in range(n_parts) if (part == p).any()]
    first = models[0]
    for other in models[1:]:
        first.merge(other)
    return first


# name -> (ours, sklearn's, data kind)
CASES = {
    "multinomial-digits": (lambda: MultinomialNB(alpha=0.7), lambda: skl.MultinomialNB(alpha=0.7), "digits"),
    "multinomial-sparse": (lambda: MultinomialNB(), lambda: skl.MultinomialNB(), "sparse"),
    "bernoulli-digits": (lambda: BernoulliNB(binarize=4.0), lambda: skl.BernoulliNB(binarize=4.0), "digits"),
    "bernoulli-sparse": (lambda: BernoulliNB(alpha=0.5), lambda: skl.BernoulliNB(alpha=0.5), "sparse"),
    "categorical-digits": (lambda: CategoricalNB(alpha=0.8), lambda: skl.CategoricalNB(alpha=0.8), "digits"),
    "categorical-random": (lambda: CategoricalNB(), lambda: skl.CategoricalNB(), "categorical"),
}


def data_for(kind, digits):
    if kind == "digits":
        return digits
    if kind == "sparse":
        return sparse_counts()
    rng = np.random.default_rng(5)
    y = rng.choice(np.array(["x", "y", "z"], dtype=object), size=500)
    X = rng.integers(0, [2, 3, 7, 4], size=(500, 4))
    X[y == "x", 2] = rng.integers(0, 3, size=(y == "x").sum())
    return X, y


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("how", ["one-batch", "mini-batches", "merged-2", "merged-5"])
def test_parity_with_sklearn(case, how, digits):
    make, make_sk, kind = CASES[case]
    X, y = data_for(kind, digits)
    rng = np.random.default_rng(hash((case, how)) % 2**32)
    if how == "one-batch":
        model = make().fit(X, y)
    elif how == "mini-batches":
        model = fit_batches(make(), X, y, rng, X[:20])
    else:
        model = fit_merged(make, X, y, rng, int(how[-1]))
    assert_parity(model, make_sk().fit(X, y), X)


@pytest.mark.parametrize("make, make_sk", [
    (lambda n: MultinomialNB(n_features=n), skl.MultinomialNB),
    (lambda n: BernoulliNB(n_features=n), skl.BernoulliNB),
])
def test_parity_with_width_fixed_up_front(make, make_sk):
    X, y = sparse_counts(seed=1)
    model = make(X.shape[1])
    assert model.n_features_in_ == X.shape[1]
    fit_batches(model, X, y, np.random.default_rng(0), X[:10])
    assert_parity(model, make_sk().fit(X, y), X)
    with pytest.raises(ValueError, match=f"expecting {X.shape[1]}"):
        make(X.shape[1]).partial_fit(X[:, :-1], y)


@pytest.mark.parametrize("make, make_sk, binarize", [
    (lambda: MultinomialNB(smoothing_m="seen"), skl.MultinomialNB, None),
    (lambda: BernoulliNB(smoothing_m="seen"), skl.BernoulliNB, 0.0),
])
def test_seen_smoothing_equals_sklearn_on_seen_columns(make, make_sk, binarize):
    X, y = sparse_counts(seed=2)
    train, test = slice(0, 300), slice(300, None)
    seen = np.asarray((X[train] > (binarize or 0)).sum(axis=0)).ravel() > 0
    assert 0 < seen.sum() < X.shape[1]
    # the test rows have features never seen in training, which "seen" ignores
    assert X[test][:, ~seen].nnz > 0
    model = fit_batches(make(), X[train], y[train], np.random.default_rng(3), X[test])
    sk = make_sk().fit(X[train][:, seen], y[train])
    got = in_order(model, model.predict_log_proba(X[test]), sk.classes_)
    np.testing.assert_allclose(got, sk.predict_log_proba(X[test][:, seen]), atol=TOL, rtol=0)


def test_hashed_width_with_seen_smoothing():
    """n_features = 2**20 and smoothing over seen buckets, as the daemon runs it."""
    X_small, y = sparse_counts(seed=4, n=200, d=150)
    rng = np.random.default_rng(4)
    buckets = np.sort(rng.choice(2**20, size=150, replace=False))
    coo = X_small.tocoo()
    X = sp.csr_matrix((coo.data, (coo.row, buckets[coo.col])), shape=(200, 2**20))
    for make, make_sk in ((MultinomialNB, skl.MultinomialNB), (BernoulliNB, skl.BernoulliNB)):
        model = make(n_features=2**20, smoothing_m="seen")
        for chunk in np.array_split(np.arange(200), 4):
            model.partial_fit(X[chunk], y[chunk])
            model.predict(X[:5])
        seen = np.asarray(X_small.sum(axis=0)).ravel() > 0
        sk = make_sk().fit(X_small[:, seen], y)
        got = in_order(model, model.predict_log_proba(X), sk.classes_)
        np.testing.assert_allclose(got, sk.predict_log_proba(X_small[:, seen]), atol=TOL, rtol=0)


# --------------------------------------------------------------- linear form
def sk_log_odds_form(sk, kind):
    if kind == "multinomial":
        flp = sk.feature_log_prob_
        return flp[1] - flp[0], sk.class_log_prior_[1] - sk.class_log_prior_[0]
    flp = sk.feature_log_prob_
    neg = np.log1p(-np.exp(flp))
    w = flp - neg
    b = sk.class_log_prior_ + neg.sum(axis=1)
    return w[1] - w[0], b[1] - b[0]


@pytest.mark.parametrize("kind", ["multinomial", "bernoulli"])
def test_coef_intercept_decision_function_two_classes(kind, digits):
    X, y = digits
    keep = (y == 3) | (y == 8)
    X, y = X[keep], np.where(y[keep] == 3, "three", "eight")
    model = (MultinomialNB() if kind == "multinomial" else BernoulliNB(binarize=2.0))
    fit_batches(model, X, y, np.random.default_rng(1), X[:5], n_batches=3)
    sk = (skl.MultinomialNB() if kind == "multinomial" else skl.BernoulliNB(binarize=2.0)).fit(X, y)
    w, b = sk_log_odds_form(sk, kind)
    # sklearn sorts classes: eight, three; ours keep arrival order
    sign = 1.0 if model.classes_.tolist() == sk.classes_.tolist() else -1.0
    np.testing.assert_allclose(model.coef_[0], sign * w, atol=1e-9)
    np.testing.assert_allclose(model.intercept_[0], sign * b, atol=1e-9)
    lp = model.predict_log_proba(X)
    dec = model.decision_function(X)
    assert dec.shape == (X.shape[0],)
    np.testing.assert_allclose(dec, lp[:, 1] - lp[:, 0], atol=1e-8)
    assert (model.predict(X) == np.where(dec >= 0, model.classes_[1], model.classes_[0])).all()


def test_multiclass_coef_is_per_class_joint_log_likelihood(digits):
    X, y = digits
    model = MultinomialNB().fit(X, y)
    assert model.coef_.shape == (10, 64)
    np.testing.assert_allclose(model.decision_function(X[:50]), model.predict_joint_log_proba(X[:50]), atol=1e-9)


# --------------------------------------------------------- learning dynamics
@pytest.mark.parametrize("make, make_sk", [
    (MultinomialNB, skl.MultinomialNB), (BernoulliNB, skl.BernoulliNB), (CategoricalNB, skl.CategoricalNB),
])
def test_unlearn_equals_fit_on_the_rest(make, make_sk, digits):
    X, y = digits
    model = make().fit(X, y)
    model.predict(X[:3])
    model.unlearn(X[:400], y[:400])
    assert_parity(model, make_sk().fit(X[400:], y[400:]), X[400:])


@pytest.mark.parametrize("make, make_sk", [
    (MultinomialNB, skl.MultinomialNB), (BernoulliNB, skl.BernoulliNB), (CategoricalNB, skl.CategoricalNB),
])
def test_decay_equals_scaled_weights(make, make_sk, digits):
    X, y = digits
    model = make().fit(X[:900], y[:900])
    model.predict(X[:3])
    model.decay(0.5).partial_fit(X[900:], y[900:])
    w = np.r_[np.full(900, 0.5), np.ones(X.shape[0] - 900)]
    assert_parity(model, make_sk().fit(X, y, sample_weight=w), X)


@pytest.mark.parametrize("make", [MultinomialNB, BernoulliNB, CategoricalNB])
def test_zero_weight_classes_get_minus_inf_without_warnings(make, digits):
    X, y = digits
    model = make().partial_fit(X[:100], y[:100], classes=list(range(10)) + [42])
    model.unlearn(X[:100][y[:100] == 3], y[:100][y[:100] == 3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jll = model.predict_joint_log_proba(X[:20])
        lp = model.predict_log_proba(X[:20])
    classes = model.classes_.tolist()
    assert np.isneginf(jll[:, classes.index(42)]).all() and np.isneginf(jll[:, classes.index(3)]).all()
    assert not np.isnan(lp).any()
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1.0)
    assert 42 not in model.predict(X[:20]) and 3 not in model.predict(X[:20])


@pytest.mark.parametrize("make", [MultinomialNB, BernoulliNB, CategoricalNB])
def test_all_classes_empty_gives_uniform_posterior_not_nan(make, digits):
    X, y = digits
    model = make().partial_fit(X[:10], y[:10])
    model.unlearn(X[:10], y[:10])
    lp = model.predict_log_proba(X[:5])
    np.testing.assert_allclose(lp, np.log(1.0 / len(model.classes_)))


def test_sample_weight_parity(digits):
    X, y = digits
    w = np.random.default_rng(0).uniform(0, 3, size=X.shape[0])
    for make, make_sk in ((MultinomialNB, skl.MultinomialNB), (BernoulliNB, skl.BernoulliNB),
                          (CategoricalNB, skl.CategoricalNB)):
        model = make()
        for chunk in np.array_split(np.arange(X.shape[0]), 3):
            model.partial_fit(X[chunk], y[chunk], sample_weight=w[chunk])
        assert_parity(model, make_sk().fit(X, y, sample_weight=w), X)


def test_batch_stats_is_a_sparse_delta_equal_to_partial_fit(digits):
    X, y = digits
    a = MultinomialNB().fit(X[:500], y[:500])
    b = MultinomialNB().fit(X[:500], y[:500])
    delta = a.batch_stats(sp.csr_matrix(X[500:600]), y[500:600])
    assert delta["features"].is_sparse
    a.merge_stats(delta)
    b.partial_fit(X[500:600], y[500:600])
    np.testing.assert_allclose(a.predict_log_proba(X), b.predict_log_proba(X), atol=1e-12)


# -------------------------------------------------------------------- bad input
def snapshot(model) -> bytes:
    return model.stats.to_bytes()


BAD_INPUTS = [
    ("wrong width", lambda X, y: (X[:, :-1], y, None), "features"),
    ("nan", lambda X, y: (np.where(np.arange(X.shape[1]) == 0, np.nan, X), y, None), "NaN"),
    ("inf", lambda X, y: (np.where(np.arange(X.shape[1]) == 0, np.inf, X), y, None), "infinity"),
    ("mixed labels", lambda X, y: (X, ["a"] + list(y[1:]), None), "mixed types"),
    ("empty", lambda X, y: (X[:0], y[:0], None), "empty"),
    ("nan weight", lambda X, y: (X, y, np.r_[np.nan, np.ones(len(y) - 1)]), "sample_weight"),
    ("negative weight", lambda X, y: (X, y, np.r_[-1.0, np.ones(len(y) - 1)]), "sample_weight"),
    ("label count", lambda X, y: (X, y[:-1], None), "labels"),
]


@pytest.mark.parametrize("make", [MultinomialNB, BernoulliNB, CategoricalNB])
@pytest.mark.parametrize("name, corrupt, message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises_and_changes_nothing(make, name, corrupt, message, digits):
    X, y = digits[0][:50], digits[1][:50]
    model = make().fit(X, y)
    before = snapshot(model)
    expected_lp = model.predict_log_proba(X)
    Xb, yb, wb = corrupt(X, y)
    with pytest.raises(ValueError, match=message):
        model.partial_fit(Xb, yb, sample_weight=wb)
    assert snapshot(model) == before
    np.testing.assert_array_equal(model.predict_log_proba(X), expected_lp)


def test_bernoulli_takes_negative_values_as_absent_as_sklearn(digits):
    """x > binarize (>= 0): a negative value is an absent feature, as in scikit-learn."""
    X, y = digits[0][:200] - 3.0, digits[1][:200]
    ours, theirs = BernoulliNB(binarize=1.0).fit(X, y), skl.BernoulliNB(binarize=1.0).fit(X, y)
    np.testing.assert_allclose(ours.predict_log_proba(X), theirs.predict_log_proba(X), rtol=1e-10,
                               atol=1e-12)


@pytest.mark.parametrize("make", [MultinomialNB])
def test_negative_counts_refused(make, digits):
    X, y = digits[0][:20], digits[1][:20]
    model = make().fit(X, y)
    before = snapshot(model)
    Xn = X.copy()
    Xn[3, 5] = -1.0
    with pytest.raises(ValueError, match="non-negative.*got a minimum of -1"):
        model.partial_fit(Xn, y)
    with pytest.raises(ValueError, match="non-negative"):
        model.partial_fit(sp.csr_matrix(Xn), y)
    with pytest.raises(ValueError, match="non-negative"):
        model.predict(Xn)
    assert snapshot(model) == before


def test_categorical_refuses_non_integer_and_negative_categories(digits):
    X, y = digits[0][:20], digits[1][:20]
    model = CategoricalNB().fit(X, y)
    before = snapshot(model)
    for bad, shown in ((0.5, "0.5"), (-2.0, "-2")):
        Xb = X.copy()
        Xb[1, 1] = bad
        with pytest.raises(ValueError, match=f"non-negative integer categories, got {shown}"):
            model.partial_fit(Xb, y)
    assert snapshot(model) == before


def test_categorical_unseen_category_scored_as_count_zero():
    X = np.array([[0, 1], [1, 0], [1, 1]])
    model = CategoricalNB(alpha=1.0).fit(X, ["a", "a", "b"])
    jll = model.predict_joint_log_proba(np.array([[5, 1]]))
    # feature 0 has K=2; category 5 never seen: alpha / (N_c + 2 alpha); feature 1: (N_c1v + 1) / (N_c + 2)
    want_a = np.log(2 / 3) + np.log(1 / 4) + np.log(2 / 4)
    want_b = np.log(1 / 3) + np.log(1 / 3) + np.log(2 / 3)
    np.testing.assert_allclose(jll[0], [want_a, want_b])


def test_bad_parameters_refused():
    """Checked before the model learns or predicts (scikit-learn's estimators take any
    value at construction), or at once by validate_params and make_model."""
    for bad in (0.0, -1.0, float("nan"), "x"):
        with pytest.raises(ValueError, match="alpha"):
            MultinomialNB(alpha=bad).fit([[1, 0]], ["a"])
        with pytest.raises(ValueError, match="alpha"):
            make_model("multinomial", alpha=bad)
    with pytest.raises(ValueError, match="smoothing_m must be one of"):
        BernoulliNB(smoothing_m="all").validate_params()
    with pytest.raises(ValueError, match="n_features"):
        MultinomialNB(n_features=0).partial_fit([[1, 0]], ["a"])
    with pytest.raises(ValueError, match="binarize"):
        BernoulliNB(binarize=-1.0).validate_params()
    with pytest.raises(ValueError, match="class_prior"):
        MultinomialNB(class_prior=[0.5, -0.5]).validate_params()
    with pytest.raises(ValueError, match="fit_prior"):
        CategoricalNB(fit_prior="yes").validate_params()


def test_bernoulli_binarize_none_needs_binary_input():
    model = BernoulliNB(binarize=None)
    with pytest.raises(ValueError, match="0/1"):
        model.fit(np.array([[0.0, 2.0], [1.0, 0.0]]), [0, 1])
    X = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    sk = skl.BernoulliNB(binarize=None).fit(X, [0, 1, 1])
    np.testing.assert_allclose(model.fit(X, [0, 1, 1]).predict_log_proba(X), sk.predict_log_proba(X), atol=TOL)


def test_repr_and_params_round_trip():
    m = BernoulliNB(alpha=0.5, binarize=1.0, n_features=10, smoothing_m="seen")
    assert type(m)(**m.get_params()).get_params() == m.get_params()
    assert "smoothing_m='seen'" in repr(m)


# ------------------------------------------------------- class_prior fixed when learning
@pytest.mark.parametrize("learn", ["fit", "partial_fit"])
@pytest.mark.parametrize("cls", [MultinomialNB, BernoulliNB, CategoricalNB])
def test_class_prior_changed_after_fit_leaves_priors_and_predictions_unchanged(cls, learn, digits):
    """As the Gaussian models' priors: ``class_prior`` is validated and copied when the
    model starts learning; changing the caller's array afterwards changes neither
    class_log_prior_ nor the predictions, nor a model file or a prequential prediction."""
    X, y = digits
    if cls is CategoricalNB:
        X = (X // 4).astype(int)
    given = np.linspace(1.0, 2.0, 10) / np.linspace(1.0, 2.0, 10).sum()
    class_prior = given.copy()
    model = cls(class_prior=class_prior)
    if learn == "fit":
        model.fit(X, y)
    else:
        model.partial_fit(X[::2], y[::2])
    class_prior[:] = class_prior[::-1]  # other valid priors, which the model must not read
    if learn == "partial_fit":
        model.partial_fit(X[1::2], y[1::2])
    reference = cls(class_prior=given.tolist()).fit(X, y)
    assert model.class_prior is class_prior
    np.testing.assert_array_equal(model.class_log_prior_, np.log(given))
    np.testing.assert_allclose(model.predict_log_proba(X[:50]), reference.predict_log_proba(X[:50]),
                               rtol=1e-12, atol=1e-12)
    copy = loads(dumps(model))
    np.testing.assert_array_equal(copy.class_log_prior_, np.log(given))
    np.testing.assert_array_equal(copy.predict_log_proba(X[:50]), model.predict_log_proba(X[:50]))
    a = model.predict_log_proba_prequential(X[:40], y[:40]).log_proba
    b = reference.predict_log_proba_prequential(X[:40], y[:40]).log_proba
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    sk = getattr(skl, cls.__name__)(class_prior=given).fit(X, y)
    np.testing.assert_allclose(model.class_log_prior_, sk.class_log_prior_, rtol=1e-12)
