"""GaussianNB, LDA and QDA: parity with scikit-learn, lecture numbers, edge cases."""

from __future__ import annotations

import warnings
from functools import cache

import numpy as np
import pytest
from scipy.special import log_expit, log_softmax
from scipy.stats import norm
from sklearn import datasets
from sklearn import discriminant_analysis as skda
from sklearn import naive_bayes as sknb

from streamnb.bounds import bhattacharyya_distance
from streamnb.exceptions import SingularCovarianceWarning
from streamnb.models.gaussian import GaussianNB
from streamnb.models.io import dumps, loads
from streamnb.models.lda import LinearDiscriminantAnalysis
from streamnb.models.qda import QuadraticDiscriminantAnalysis
from streamnb.stats import ClassCounts, GaussianMoments, StatsBundle

MODES = ["batch", "minibatch", "merged"]


@cache
def dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    return X, y


def fit_streamnb(model_cls, params, X, y, mode, seed=0):
    """One batch, random mini-batches, or 2-5 partial models merged."""
    rng = np.random.default_rng(seed)
    if mode == "batch":
        return model_cls(**params).fit(X, y)
    perm = rng.permutation(len(y))
    if mode == "minibatch":
        cuts = np.sort(rng.choice(np.arange(1, len(y)), size=rng.integers(5, 15), replace=False))
        model = model_cls(**params)
        for idx in np.split(perm, cuts):
            model.partial_fit(X[idx], y[idx])
        return model
    parts = np.array_split(perm, rng.integers(2, 6))
    models = [model_cls(**params).fit(X[idx], y[idx]) for idx in parts]
    merged = models[0]
    for other in models[1:]:
        merged.merge(other)
    return merged


def in_sorted_order(model, log_proba):
    """Columns reordered to scikit-learn's sorted classes."""
    return log_proba[:, np.argsort(np.asarray(model.classes_))]


def exact_log_proba(sk_model, X):
    """scikit-learn's LDA/QDA posteriors, from decision_function (their predict_log_proba
    takes log of rounded probabilities)."""
    d = sk_model.decision_function(X)
    return np.c_[log_expit(-d), log_expit(d)] if d.ndim == 1 else log_softmax(d, axis=1)


@cache
def sklearn_qda_ddof() -> int:
    """Older scikit-learn divides QDA class scatter by n - 1, 1.9 by n: detect which."""
    X = np.array([[0.0, 1.0], [2.0, 0.0], [1.0, 3.0], [5.0, 2.0], [1.0, 1.0], [3.0, 3.0]])
    sk = skda.QuadraticDiscriminantAnalysis().fit(X, [0, 0, 0, 1, 1, 1])
    trace = float(np.sum(sk.scalings_[0]))
    biased = float(np.trace(np.cov(X[:3].T, bias=True)))
    return 0 if abs(trace - biased) < 1e-9 else 1


# --------------------------------------------------------------------- parity
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["iris", "wine", "breast_cancer", "digits"])
def test_gaussian_nb_parity(name, mode):
    X, y = dataset(name)
    sk = sknb.GaussianNB().fit(X, y)
    model = fit_streamnb(GaussianNB, {}, X, y, mode)
    assert model.epsilon_ == pytest.approx(sk.epsilon_, rel=1e-9)
    got = in_sorted_order(model, model.predict_log_proba(X))
    # digits has constant pixels (variance = the floor alone): log posteriors reach -1e8,
    # where float64 resolution is ~1e-8, so a relative term is added there.
    np.testing.assert_allclose(got, sk.predict_log_proba(X), atol=1e-8, rtol=1e-11)
    assert (model.predict(X) == sk.predict(X)).all()


def test_gaussian_nb_user_priors_parity():
    X, y = dataset("iris")
    priors = [0.2, 0.3, 0.5]
    sk = sknb.GaussianNB(priors=priors).fit(X, y)
    model = GaussianNB(priors=priors).fit(X, y)
    np.testing.assert_allclose(model.predict_log_proba(X), sk.predict_log_proba(X), atol=1e-8)
    by_label = GaussianNB(priors={2: 0.5, 0: 0.2, 1: 0.3}).fit(X, y)
    np.testing.assert_allclose(by_label.predict_log_proba(X), sk.predict_log_proba(X), atol=1e-8)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "name,shrinkage,priors",
    [
        ("iris", None, None),
        ("iris", 0.2, None),
        ("iris", None, [0.5, 0.3, 0.2]),
        ("iris", 0.7, [0.1, 0.1, 0.8]),
        ("wine", None, None),
        ("wine", 1.0, None),
        ("wine", 0.05, [0.3, 0.3, 0.4]),
        # Unshrunk, breast_cancer's covariance (condition number ~1e14) only agrees to ~1e-8.
        ("breast_cancer", 0.1, None),
    ],
)
def test_lda_parity(name, shrinkage, priors, mode):
    X, y = dataset(name)
    sk = skda.LinearDiscriminantAnalysis(solver="lsqr", shrinkage=shrinkage, priors=priors).fit(X, y)
    model = fit_streamnb(LinearDiscriminantAnalysis, {"shrinkage": shrinkage, "priors": priors},
                         X, y, mode) if priors is None else _fit_sorted(
        LinearDiscriminantAnalysis, {"shrinkage": shrinkage, "priors": priors}, X, y, mode)
    got = in_sorted_order(model, model.predict_log_proba(X))
    np.testing.assert_allclose(got, exact_log_proba(sk, X), atol=1e-8)
    assert (model.predict(X) == sk.predict(X)).all()


def _fit_sorted(model_cls, params, X, y, mode):
    """Priors given as a list follow classes_, so register the classes in sorted order."""
    model = model_cls(**params)
    model.partial_fit(X[:1], y[:1], classes=np.unique(y))
    model.unlearn(X[:1], y[:1])
    assert list(model.classes_) == sorted(set(y))
    return model.merge(fit_streamnb(model_cls, params, X, y, mode))


def test_lda_linear_form_matches_sklearn():
    for name in ("iris", "breast_cancer"):
        X, y = dataset(name)
        Xs = (X - X.mean(0)) / X.std(0)
        sk = skda.LinearDiscriminantAnalysis(solver="lsqr").fit(Xs, y)
        model = LinearDiscriminantAnalysis().fit(Xs, y)
        assert list(model.classes_) == list(sk.classes_)
        np.testing.assert_allclose(model.coef_, sk.coef_, atol=1e-8)
        np.testing.assert_allclose(model.intercept_, sk.intercept_, atol=1e-8)
        np.testing.assert_allclose(model.decision_function(Xs), sk.decision_function(Xs), atol=1e-8)
        np.testing.assert_allclose(model.covariance_, sk.covariance_, atol=1e-12)


def test_lda_binary_predicts_class_one_when_decision_is_nonnegative():
    X, y = dataset("breast_cancer")
    Xs = (X - X.mean(0)) / X.std(0)
    model = LinearDiscriminantAnalysis(shrinkage=0.1).fit(Xs, y)
    w, b = model.coef_[0], model.intercept_[0]
    expected = np.where(Xs @ w + b >= 0, model.classes_[1], model.classes_[0])
    assert (model.predict(Xs) == expected).all()
    # the log-odds of class 1 is the decision function
    lp = model.predict_log_proba(Xs)
    np.testing.assert_allclose(lp[:, 1] - lp[:, 0], model.decision_function(Xs), atol=1e-8)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "name,reg_param,priors",
    [("iris", 0.0, None), ("iris", 0.3, None), ("iris", 0.0, [0.6, 0.2, 0.2]),
     ("wine", 0.0, None), ("wine", 0.01, None)],
)
def test_qda_parity(name, reg_param, priors, mode):
    X, y = dataset(name)
    sk = skda.QuadraticDiscriminantAnalysis(reg_param=reg_param, priors=priors).fit(X, y)
    params = {"reg_param": reg_param, "priors": priors, "ddof": sklearn_qda_ddof()}
    model = (fit_streamnb(QuadraticDiscriminantAnalysis, params, X, y, mode) if priors is None
             else _fit_sorted(QuadraticDiscriminantAnalysis, params, X, y, mode))
    got = in_sorted_order(model, model.predict_log_proba(X))
    np.testing.assert_allclose(got, exact_log_proba(sk, X), atol=1e-8)


def test_qda_ddof_one_is_the_unbiased_covariance():
    X, y = dataset("iris")
    model = QuadraticDiscriminantAnalysis(ddof=1, reg_param=0.1).fit(X, y)
    for c, label in enumerate(model.classes_):
        expected = 0.9 * np.cov(X[y == label].T) + 0.1 * np.eye(4)
        np.testing.assert_allclose(model.covariance_[c], expected, rtol=1e-12)


# ----------------------------------------------------------- lecture numbers
def _nb_from_moments(means, variances, counts, labels=("A", "B")):
    moments = GaussianMoments(1, diagonal=True, labels=list(labels), n=counts,
                              mean=np.array(means, dtype=float)[:, None],
                              m2=(np.array(variances) * np.array(counts))[:, None])
    classes = ClassCounts(list(labels), counts)
    return GaussianNB.from_stats(StatsBundle(classes=classes, moments=moments))


def test_lecture_gaussian_nb_picks_b_at_minus_three():
    # N(0, 1) vs N(3, 9), equal priors: at x = -3, log N_A = -0.919 - 4.5 < log N_B = -0.919 - ln 3 - 2.
    from_stats = _nb_from_moments([0.0, 3.0], [1.0, 9.0], [10.0, 10.0])
    fitted = GaussianNB().fit([[-1.0], [1.0], [0.0], [6.0]], ["A", "A", "B", "B"])
    for model in (from_stats, fitted):
        assert model.predict([[-3.0]]).tolist() == ["B"]
        jll = model.predict_joint_log_proba([[-3.0]])[0]
        expected = np.log(0.5) + norm.logpdf(-3.0, [0.0, 3.0], [1.0, 3.0])
        np.testing.assert_allclose(jll, expected, atol=1e-7)   # floor: var_smoothing * 9


def test_lecture_bhattacharyya_from_models():
    nb = _nb_from_moments([0.0, 0.0], [1.0, 4.0], [50.0, 50.0])
    (pair,) = nb.bhattacharyya()
    assert (pair.class_a, pair.class_b) == ("A", "B")
    assert round(pair.bound, 4) == 0.4472
    # LDA with N(0,1) vs N(2,1) and priors 0.8/0.2: shared covariance 1.
    moments = GaussianMoments(1, diagonal=False, labels=["A", "B"], n=[80.0, 20.0],
                              mean=[[0.0], [2.0]], m2=[[[80.0]], [[20.0]]])
    lda = LinearDiscriminantAnalysis.from_stats(
        StatsBundle(classes=ClassCounts(["A", "B"], [80.0, 20.0]), moments=moments))
    (pair,) = lda.bhattacharyya()
    assert round(pair.distance, 4) == 0.5 and round(pair.bound, 4) == 0.2426
    # The Bayes threshold 1.6931 is where the LDA's decision function changes sign.
    assert lda.decision_function([[1.6931 - 1e-4]])[0] < 0 < lda.decision_function([[1.6931 + 1e-4]])[0]


def test_qda_bhattacharyya_matches_bounds_on_its_covariances():
    X, y = dataset("iris")
    model = QuadraticDiscriminantAnalysis(reg_param=0.01).fit(X, y)
    pairs = model.bhattacharyya()
    assert [(p.class_a, p.class_b) for p in pairs] == [(0, 1), (0, 2), (1, 2)]
    cov, means, pri = model.covariance_, model.means_, model.priors_
    for p in pairs:
        a, b = p.class_a, p.class_b
        s = (cov[a] + cov[b]) / 2
        dm = means[b] - means[a]
        expected = dm @ np.linalg.solve(s, dm) / 8 + 0.5 * (
            np.linalg.slogdet(s)[1] - 0.5 * (np.linalg.slogdet(cov[a])[1] + np.linalg.slogdet(cov[b])[1]))
        assert p.distance == pytest.approx(expected, rel=1e-10)
        assert p.bound == pytest.approx(np.sqrt(pri[a] * pri[b]) * np.exp(-expected), rel=1e-10)
    # versicolor vs virginica overlap far more than setosa vs either
    assert pairs[2].distance < min(pairs[0].distance, pairs[1].distance)


# ----------------------------------------------------------- variance floor
def test_variance_floor_follows_all_data_not_the_first_batch():
    rng = np.random.default_rng(1)
    X1 = rng.normal(size=(20, 2)) * 0.01
    X2 = rng.normal(size=(20, 2)) * 100.0
    y1, y2 = rng.integers(0, 2, 20), rng.integers(0, 2, 20)
    model = GaussianNB(var_smoothing=1e-3).partial_fit(X1, y1).partial_fit(X2, y2)
    whole = np.vstack([X1, X2])
    assert model.epsilon_ == pytest.approx(1e-3 * np.var(whole, axis=0).max(), rel=1e-12)
    sk = sknb.GaussianNB(var_smoothing=1e-3).fit(whole, np.r_[y1, y2])
    np.testing.assert_allclose(model.predict_log_proba(whole), sk.predict_log_proba(whole), atol=1e-8)


def test_one_sample_class_has_the_floor_as_variance():
    X = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 4.0], [10.0, -1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(divide="raise", invalid="raise"):
            model = GaussianNB().fit(X, ["a", "a", "a", "solo"])
            np.testing.assert_array_equal(model.var_[1], [model.epsilon_, model.epsilon_])
            assert not np.isnan(model.predict_log_proba(X)).any()
            assert model.predict([[10.0, -1.0]]).tolist() == ["solo"]


# ------------------------------------------------------------ singular cases
def _finite_answers(model, X):
    lp = model.predict_log_proba(X)
    assert not np.isnan(lp).any()
    np.testing.assert_allclose(np.exp(lp).sum(1), 1.0)


def test_lda_constant_feature_warns_and_stays_finite():
    rng = np.random.default_rng(2)
    X = np.c_[rng.normal(size=(30, 2)), np.full(30, 5.0)]
    y = np.repeat([0, 1], 15)
    X[y == 1, 0] += 3
    with pytest.warns(SingularCovarianceWarning, match="shared covariance"):
        model = LinearDiscriminantAnalysis().fit(X, y)
        _finite_answers(model, X)
    assert np.isfinite(model.coef_).all()
    assert (model.predict(X) == y).mean() > 0.8


def test_qda_fewer_samples_than_features_warns_with_the_class():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(12, 6))
    y = ["big"] * 9 + ["small"] * 3
    with pytest.warns(SingularCovarianceWarning, match="class 'small'"):
        model = QuadraticDiscriminantAnalysis().fit(X, y)
        _finite_answers(model, X)


def test_qda_one_sample_class_warns_and_stays_finite():
    X = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 4.0], [1.0, 0.0], [10.0, -1.0]])
    with pytest.warns(SingularCovarianceWarning, match="class 'solo'"):
        model = QuadraticDiscriminantAnalysis(ddof=1).fit(X, ["a"] * 4 + ["solo"])
        _finite_answers(model, X)
        _finite_answers(model, X + 100.0)


def test_gaussian_nb_zero_floor_on_constant_data_warns_and_stays_finite():
    X = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 3.0], [1.0, 3.0]])
    with pytest.warns(SingularCovarianceWarning):
        model = GaussianNB(var_smoothing=0.0).fit(X, [0, 0, 1, 1])
        _finite_answers(model, X)
    assert model.predict([[1.0, 2.1]]).tolist() == [0]


# ------------------------------------------------------------------- priors
@pytest.mark.parametrize("cls", [GaussianNB, LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis])
def test_zero_prior_and_empty_classes_get_minus_inf_without_warnings(cls):
    X, y = dataset("iris")
    model = cls(priors={0: 0.0, 1: 0.5, 2: 0.5, 3: 0.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(divide="raise", invalid="raise"):
            model.partial_fit(X, y, classes=[0, 1, 2, 3])
            lp = model.predict_log_proba(X)
    assert list(model.classes_) == [0, 1, 2, 3]
    assert np.isneginf(lp[:, [0, 3]]).all()
    assert np.isfinite(lp[:, 1:3]).all()
    np.testing.assert_allclose(np.exp(lp).sum(1), 1.0)


@pytest.mark.parametrize("priors", [[0.5, 0.6], [1.5, -0.5], [np.nan, 1.0], [[0.5, 0.5]], "ab"])
@pytest.mark.parametrize("cls", [GaussianNB, LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis])
def test_invalid_priors_raise(cls, priors):
    with pytest.raises(ValueError, match="priors"):  # checked before learning, not at init
        cls(priors=priors).validate_params()


GAUSSIAN_MODELS = [GaussianNB, LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis]


@pytest.mark.parametrize("learn", ["fit", "partial_fit"])
@pytest.mark.parametrize("cls", GAUSSIAN_MODELS)
def test_priors_changed_after_fit_leave_priors_and_predictions_unchanged(cls, learn):
    """scikit-learn's test_qda_prior_copy: the model validates and copies the priors when
    it starts learning; the caller's array, changed afterwards (here to values that do
    not sum to 1), is kept as given but read no more, not even by a later partial_fit."""
    X, y = dataset("iris")
    priors = np.array([0.2, 0.3, 0.5])
    model = cls(priors=priors)
    if learn == "fit":
        model.fit(X, y)
    else:
        model.partial_fit(X[::2], y[::2])
    before = model.predict_log_proba(X)
    priors[0] = 0.6
    if learn == "partial_fit":
        model.partial_fit(X[1::2], y[1::2])
        before = model.predict_log_proba(X)
    assert model.priors is priors and model.get_params()["priors"] is priors
    np.testing.assert_array_equal(model.priors_, [0.2, 0.3, 0.5])
    np.testing.assert_array_equal(model.class_log_prior_, np.log([0.2, 0.3, 0.5]))
    np.testing.assert_array_equal(model.predict_log_proba(X), before)
    expected = cls(priors=[0.2, 0.3, 0.5]).fit(X, y)
    np.testing.assert_allclose(before, expected.predict_log_proba(X), rtol=1e-9, atol=1e-9)
    model.set_params(priors=[0.5, 0.25, 0.25])  # a new value is read at once, as before
    np.testing.assert_array_equal(model.priors_, [0.5, 0.25, 0.25])
    model.fit(X, y)  # and fit reads the parameter anew
    np.testing.assert_array_equal(model.priors_, [0.5, 0.25, 0.25])


@pytest.mark.parametrize("cls", GAUSSIAN_MODELS)
def test_validated_priors_survive_save_load_merge_and_prequential(cls):
    """The priors changed after fit to other valid priors: a model file, a merge and a
    prequential prediction (a scratch copy of the model) still use the validated ones."""
    X, y = dataset("iris")
    priors = np.array([0.2, 0.3, 0.5])
    model = cls(priors=priors).fit(X[::2], y[::2])
    priors[:] = [0.6, 0.2, 0.2]
    reference = cls(priors=[0.2, 0.3, 0.5]).fit(X[::2], y[::2])
    copy = loads(dumps(model))
    np.testing.assert_array_equal(copy.priors_, [0.2, 0.3, 0.5])
    np.testing.assert_array_equal(copy.predict_log_proba(X), reference.predict_log_proba(X))
    a = model.predict_log_proba_prequential(X[1:20:2], y[1:20:2]).log_proba
    b = reference.predict_log_proba_prequential(X[1:20:2], y[1:20:2]).log_proba
    np.testing.assert_array_equal(a, b)
    model.merge(cls().fit(X[1::2], y[1::2]))  # the hyper-parameters are this model's
    reference.merge(cls().fit(X[1::2], y[1::2]))
    np.testing.assert_array_equal(model.priors_, [0.2, 0.3, 0.5])
    np.testing.assert_array_equal(model.predict_log_proba(X), reference.predict_log_proba(X))


def test_priors_of_the_wrong_length_raise_at_prediction():
    X, y = dataset("iris")
    with pytest.raises(ValueError, match="priors has 2 values, but the model has 3 classes"):
        QuadraticDiscriminantAnalysis(priors=[0.5, 0.5]).fit(X, y).predict(X)


@pytest.mark.parametrize("kw", [{"shrinkage": 1.5}, {"shrinkage": "auto"}, {"shrinkage": -0.1}])
def test_invalid_shrinkage(kw):
    with pytest.raises(ValueError, match="shrinkage"):
        LinearDiscriminantAnalysis(**kw).validate_params()


@pytest.mark.parametrize("kw", [{"reg_param": 2.0}, {"ddof": -1}])
def test_invalid_qda_params(kw):
    with pytest.raises(ValueError):
        QuadraticDiscriminantAnalysis(**kw).validate_params()


# ---------------------------------------------------------------- bad input
BAD_BATCHES = [
    (lambda X, y: (X[:, :2], y), "features"),
    (lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 3, np.nan, X), y), "NaN"),
    (lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 3, np.inf, X), y), "infinity"),
    (lambda X, y: (X, [str(v) for v in y]), "mixed types"),
    (lambda X, y: (X, [0] + [str(v) for v in y[1:]]), "mixed types"),
    (lambda X, y: (X[:0], y[:0]), "empty"),
    (lambda X, y: (X, y[:-1]), "labels"),
]


@pytest.mark.parametrize("make_bad,match", BAD_BATCHES)
@pytest.mark.parametrize("cls", [GaussianNB, LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis])
def test_bad_input_raises_and_leaves_the_model_unchanged(cls, make_bad, match):
    X, y = dataset("iris")
    model = cls().fit(X[::2], y[::2])
    before_stats, before_lp = model.stats.to_bytes(), model.predict_log_proba(X)
    Xb, yb = make_bad(X[1::2], list(y[1::2]))
    with pytest.raises(ValueError, match=match):
        model.partial_fit(Xb, yb)
    with pytest.raises(ValueError):
        model.partial_fit(X[1::2], y[1::2], sample_weight=np.r_[np.nan, np.ones(74)])
    assert model.stats.to_bytes() == before_stats
    np.testing.assert_array_equal(model.predict_log_proba(X), before_lp)
    with pytest.raises(ValueError, match="features"):
        model.predict(X[:, :3])


@pytest.mark.parametrize("cls", [GaussianNB, LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis])
def test_sparse_input_is_refused(cls):
    import scipy.sparse as sp

    X, y = dataset("iris")
    with pytest.raises(ValueError, match="dense"):
        cls().fit(sp.csr_matrix(X), y)


# ------------------------------------------------- unlearn, decay, laziness
@pytest.mark.parametrize("cls,params", [(GaussianNB, {}), (LinearDiscriminantAnalysis, {}),
                                        (QuadraticDiscriminantAnalysis, {"ddof": 1})])
def test_unlearn_equals_never_learnt(cls, params):
    X, y = dataset("wine")
    gone = np.random.default_rng(5).permutation(len(y))[:60]
    kept = np.setdiff1d(np.arange(len(y)), gone)
    model = cls(**params).fit(X, y)
    model.unlearn(X[gone], y[gone])
    rest = cls(**params).fit(X[kept], y[kept])
    assert list(model.classes_) == list(rest.classes_)
    np.testing.assert_allclose(model.predict_log_proba(X), rest.predict_log_proba(X), atol=1e-7)
    # Unlearning a whole class leaves it with no weight: -inf, no NaN.
    model.unlearn(X[kept][y[kept] == 0], y[kept][y[kept] == 0])
    lp = model.predict_log_proba(X)
    assert np.isneginf(lp[:, 0]).all() and np.isfinite(lp[:, 1:]).all()


def test_weights_equal_repeated_samples():
    X, y = dataset("iris")
    reps = np.random.default_rng(4).integers(1, 4, size=len(y))
    for cls in (GaussianNB, LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis):
        weighted = cls().fit(X, y, sample_weight=reps.astype(float))
        repeated = cls().fit(np.repeat(X, reps, axis=0), np.repeat(y, reps))
        np.testing.assert_allclose(weighted.predict_log_proba(X), repeated.predict_log_proba(X),
                                   atol=1e-8)


def test_decay_keeps_means_and_biased_covariances():
    X, y = dataset("iris")
    for cls in (GaussianNB, LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis):
        model = cls().fit(X, y)
        before = model.predict_log_proba(X)
        model.decay(0.5)
        np.testing.assert_allclose(model.predict_log_proba(X), before, atol=1e-10)


def test_qda_refactorises_only_the_touched_classes():
    X, y = dataset("iris")
    model = QuadraticDiscriminantAnalysis(ddof=1).fit(X, y)
    model.predict(X[:1])
    factors = dict(model._factors)
    model.partial_fit(X[y == 2][:5] + 0.1, y[y == 2][:5])
    model.predict(X[:1])
    assert model._factors[0] is factors[0] and model._factors[1] is factors[1]
    assert model._factors[2] is not factors[2]
    fresh = QuadraticDiscriminantAnalysis.from_stats(model.stats, ddof=1)
    np.testing.assert_allclose(model.predict_log_proba(X), fresh.predict_log_proba(X), atol=1e-12)


def test_stats_travel_as_bytes_and_rebuild_the_same_model():
    X, y = dataset("wine")
    for cls in (GaussianNB, LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis):
        model = cls().fit(X, y)
        clone = cls.from_stats(StatsBundle.from_bytes(model.stats.to_bytes()), **model.get_params())
        np.testing.assert_array_equal(clone.predict_log_proba(X), model.predict_log_proba(X))
        assert set(model.stats.parts) == {"classes", "moments"}


def test_bhattacharyya_diagonal_model_matches_bounds():
    X, y = dataset("iris")
    nb = GaussianNB().fit(X, y)
    for p in nb.bhattacharyya():
        a, b = p.class_a, p.class_b
        assert p.distance == pytest.approx(
            bhattacharyya_distance(nb.theta_[a], np.diag(nb.var_[a]), nb.theta_[b], np.diag(nb.var_[b])))
