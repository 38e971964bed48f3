"""The models as scikit-learn estimators: scikit-learn's own estimator checks, and its
tools (clone, cross_val_score, GridSearchCV, Pipeline) giving the same numbers with a
streamnb model as with scikit-learn's estimator of the same name."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn.exceptions
import sklearn.naive_bayes as skl
from sklearn.base import clone, is_classifier
from sklearn.datasets import load_digits, load_iris
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

import streamnb.exceptions
from streamnb.exceptions import NotFittedError, SingularCovarianceWarning
from streamnb.models import (
    BernoulliNB,
    CategoricalNB,
    GaussianNB,
    HybridNB,
    LinearDiscriminantAnalysis,
    MultinomialNB,
    QuadraticDiscriminantAnalysis,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "models.md"

#: The checks that cannot hold, and why (docs/models.md lists the same, argued).
EXPECTED_FAILED_CHECKS = {
    "MultinomialNB": {"check_decision_proba_consistency": "negative test values given to a "
                                                          "model of counts"},
    "CategoricalNB": {
        "check_sample_weight_equivalence_on_dense_data": "random floats given as categories",
        "check_classifiers_one_label_sample_weights": "random floats given as categories",
        "check_decision_proba_consistency": "random floats given as categories",
    },
    "LinearDiscriminantAnalysis": {
        "check_sample_weight_equivalence_on_dense_data": "15 samples of 30 features: a "
                                                         "singular shared covariance, jittered",
    },
    "HybridNB": {"check_decision_proba_consistency": "negative test values given to a "
                                                     "model of counts"},
    "QuadraticDiscriminantAnalysis": {
        "check_sample_weight_equivalence_on_dense_data": "15 samples of 30 features: "
                                                         "singular class covariances, jittered",
    },
}


def expected_failed_checks(estimator) -> dict[str, str]:
    return EXPECTED_FAILED_CHECKS.get(type(estimator).__name__, {})


ESTIMATORS = [MultinomialNB(), BernoulliNB(), CategoricalNB(), GaussianNB(),
              LinearDiscriminantAnalysis(), QuadraticDiscriminantAnalysis(),
              HybridNB(n_meta=1)]  # (the checks' data has 2 to 30 columns)


@pytest.mark.slow
@parametrize_with_checks(ESTIMATORS, expected_failed_checks=expected_failed_checks)
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingularCovarianceWarning)  # one-sample classes
        check(estimator)


def test_every_expected_failure_is_argued_in_the_docs():
    text = DOCS.read_text()
    section = text[text.index("### scikit-learn checks that do not hold"):]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    for name, checks in EXPECTED_FAILED_CHECKS.items():
        for check in checks:
            assert re.search(rf"`{check}`", section), (name, check)


# ------------------------------------------------- scikit-learn's errors and warnings
SMALL_X = np.array([[1.0, 2.0], [2.0, 1.0], [0.0, 3.0], [3.0, 0.0], [1.0, 1.0], [2.0, 3.0]])


@pytest.mark.parametrize("method", ["predict", "predict_proba", "predict_log_proba",
                                    "decision_function"])
@pytest.mark.parametrize("model", ESTIMATORS, ids=lambda m: type(m).__name__)
def test_the_unfitted_error_is_sklearns_not_fitted_error(model, method):
    """What check_estimators_unfitted asks, and streamnb's own class as before."""
    with pytest.raises(sklearn.exceptions.NotFittedError, match="is not fitted yet") as info:
        getattr(clone(model), method)(SMALL_X)
    err = info.value
    assert isinstance(err, NotFittedError) and isinstance(err, (ValueError, AttributeError))
    assert type(err).__name__ == "NotFittedError" and type(err).__module__ == "streamnb.exceptions"
    assert not hasattr(clone(model), "classes_")  # an AttributeError, as scikit-learn's
    assert err.__reduce__()[0] is NotFittedError  # pickled by the name pickle finds
    again = copy.deepcopy(err)
    assert type(again) is type(err) and again.args == err.args


def test_every_not_fitted_error_has_the_same_type():
    """NotFittedError(...) always makes the one subclass that is also scikit-learn's, so
    ``except NotFittedError`` (streamnb's or scikit-learn's) catches each of them."""
    made = NotFittedError("not fitted")
    with pytest.raises(NotFittedError):
        GaussianNB().predict(SMALL_X)
    try:
        MultinomialNB().classes_  # noqa: B018
    except sklearn.exceptions.NotFittedError as exc:
        assert type(exc) is type(made)
    assert issubclass(type(made), sklearn.exceptions.NotFittedError)


@pytest.mark.parametrize("model", ESTIMATORS, ids=lambda m: type(m).__name__)
def test_a_column_y_warns_with_sklearns_data_conversion_warning(model):
    """What check_supervised_y_2d asks: scikit-learn's DataConversionWarning class (its
    checks turn that class's warnings on, and catch them), and y flattened."""
    assert streamnb.exceptions.DataConversionWarning is sklearn.exceptions.DataConversionWarning
    y = np.array([0, 1, 0, 1, 1, 0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")  # any other warning class, a look-alike included
        warnings.simplefilter("always", sklearn.exceptions.DataConversionWarning)
        fitted = clone(model).fit(SMALL_X, y[:, None])
    assert [w.category for w in caught] == [sklearn.exceptions.DataConversionWarning]
    assert str(caught[0].message).startswith("A column-vector y was passed when a 1d array "
                                             "was expected")
    flat = clone(model).fit(SMALL_X, y)
    assert fitted.classes_.tolist() == [0, 1]
    np.testing.assert_array_equal(fitted.predict_log_proba(SMALL_X), flat.predict_log_proba(SMALL_X))


def run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_importing_streamnb_imports_neither_sklearn_nor_redis():
    """scikit-learn is imported when the first NotFittedError is made (where it is
    installed), not when streamnb or its models are imported: that costs about a second."""
    out = run_python(
        "import sys, streamnb, streamnb.exceptions, streamnb.models, streamnb.models.validation\n"
        "print(sorted(m for m in ('sklearn', 'redis') if m in sys.modules))\n"
        "streamnb.exceptions.NotFittedError('x')\n"
        "print('sklearn' in sys.modules)\n")
    assert out.split("\n")[:2] == ["[]", "True"]


def test_without_sklearn_the_error_and_the_warning_are_streamnbs_own():
    out = run_python(
        "import sys, warnings\n"
        "sys.modules['sklearn'] = None  # import sklearn raises ImportError\n"
        "import numpy as np\n"
        "from streamnb.exceptions import DataConversionWarning, NotFittedError\n"
        "from streamnb.models import GaussianNB\n"
        "try:\n"
        "    GaussianNB().predict([[1.0]])\n"
        "except NotFittedError as exc:\n"
        "    print(type(exc) is NotFittedError, isinstance(exc, (ValueError, AttributeError)))\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    GaussianNB().fit([[0.0], [1.0]], np.array([[0], [1]]))\n"
        "print([(w.category is DataConversionWarning, w.category.__name__) for w in caught])\n"
        "print(issubclass(DataConversionWarning, UserWarning))\n")
    assert out.split() == ["True", "True", "[(True,", "'DataConversionWarning')]", "True"]


# ------------------------------------------------------------------ scikit-learn's tools
@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X, y


@pytest.fixture(scope="module")
def iris():
    X, y = load_iris(return_X_y=True)
    return X, y


@pytest.mark.parametrize("model", ESTIMATORS, ids=lambda m: type(m).__name__)
def test_clone_get_and_set_params(model):
    assert is_classifier(model)
    params = model.get_params(deep=True)
    assert params == model.get_params(deep=False)
    twin = clone(model)
    assert type(twin) is type(model) and twin.get_params() == params
    name = sorted(params)[0]
    assert twin.set_params(**{name: params[name]}) is twin
    with pytest.raises(ValueError, match="Invalid parameter 'nope'"):
        twin.set_params(nope=1)


def test_clone_of_a_fitted_model_is_unfitted(digits):
    X, y = digits
    model = MultinomialNB(alpha=0.5).fit(X, y)
    twin = clone(model)
    assert twin.get_params() == model.get_params()
    assert not twin.__sklearn_is_fitted__() and model.__sklearn_is_fitted__()


@pytest.mark.parametrize("ours, theirs", [
    (MultinomialNB(), skl.MultinomialNB()),
    (BernoulliNB(binarize=4.0), skl.BernoulliNB(binarize=4.0)),
    (GaussianNB(), skl.GaussianNB()),
], ids=["multinomial", "bernoulli", "gaussian"])
@pytest.mark.parametrize("scoring", [None, "accuracy", "neg_log_loss"])
def test_cross_val_score_equals_sklearn(ours, theirs, scoring, digits):
    X, y = digits
    cv = StratifiedKFold(5, shuffle=True, random_state=0)
    a = cross_val_score(ours, X, y, cv=cv, scoring=scoring)
    b = cross_val_score(theirs, X, y, cv=cv, scoring=scoring)
    np.testing.assert_allclose(a, b, rtol=1e-9)


def test_grid_search_over_alpha_equals_sklearn(digits):
    X, y = digits
    grid, cv = {"alpha": [0.01, 0.1, 0.5, 1.0, 3.0]}, KFold(4, shuffle=True, random_state=1)
    a = GridSearchCV(MultinomialNB(), grid, cv=cv).fit(X, y)
    b = GridSearchCV(skl.MultinomialNB(), grid, cv=cv).fit(X, y)
    np.testing.assert_allclose(a.cv_results_["mean_test_score"], b.cv_results_["mean_test_score"],
                               rtol=1e-12)
    assert a.best_params_ == b.best_params_
    assert isinstance(a.best_estimator_, MultinomialNB)
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), rtol=1e-9, atol=1e-12)


def test_grid_search_over_var_smoothing_equals_sklearn(iris):
    X, y = iris
    grid = {"var_smoothing": [1e-9, 1e-5, 1e-2, 1e-1, 0.5]}
    cv = StratifiedKFold(5, shuffle=True, random_state=2)
    a = GridSearchCV(GaussianNB(), grid, cv=cv, scoring="neg_log_loss").fit(X, y)
    b = GridSearchCV(skl.GaussianNB(), grid, cv=cv, scoring="neg_log_loss").fit(X, y)
    np.testing.assert_allclose(a.cv_results_["mean_test_score"], b.cv_results_["mean_test_score"],
                               rtol=1e-9)
    assert a.best_params_ == b.best_params_


def documents(n: int, seed: int) -> tuple[list[str], list[str]]:
    """Short texts of two classes drawn from overlapping vocabularies."""
    rng = np.random.default_rng(seed)
    common = "the a of to and in is it for on with as".split()
    topic = {"spam": "free offer money win prize click cash deal credit now".split(),
             "ham": "meeting project report lunch code review team notes plan week".split()}
    y = rng.choice(["spam", "ham"], size=n).tolist()
    docs = [" ".join(rng.choice(common + topic[c] * 2, size=int(rng.integers(5, 25))))
            for c in y]
    return docs, y


def test_pipeline_with_a_vectorizer_equals_sklearn():
    docs, y = documents(300, seed=4)
    ours = make_pipeline(CountVectorizer(), MultinomialNB(alpha=0.3)).fit(docs[:200], y[:200])
    theirs = make_pipeline(CountVectorizer(), skl.MultinomialNB(alpha=0.3)).fit(docs[:200], y[:200])
    assert ours.classes_.tolist() == theirs.classes_.tolist() == ["ham", "spam"]
    np.testing.assert_allclose(ours.predict_proba(docs[200:]), theirs.predict_proba(docs[200:]),
                               rtol=1e-10)
    assert ours.score(docs[200:], y[200:]) == theirs.score(docs[200:], y[200:])


# ----------------------------------------------------------------- fitted attributes
@pytest.mark.parametrize("fit_prior, class_prior", [(True, None), (False, None),
                                                    (True, [0.1] * 10), (False, [0.3] + [0.7 / 9] * 9)])
@pytest.mark.parametrize("ours, theirs", [(MultinomialNB, skl.MultinomialNB),
                                          (BernoulliNB, skl.BernoulliNB),
                                          (CategoricalNB, skl.CategoricalNB)])
def test_priors_and_fitted_attributes_equal_sklearn(ours, theirs, fit_prior, class_prior, digits):
    X, y = digits
    if ours is CategoricalNB:
        X = (X // 4).astype(int)
    a = ours(fit_prior=fit_prior, class_prior=class_prior).fit(X, y)
    b = theirs(fit_prior=fit_prior, class_prior=class_prior).fit(X, y)
    np.testing.assert_array_equal(a.classes_, b.classes_)
    np.testing.assert_allclose(a.class_log_prior_, b.class_log_prior_, rtol=1e-12)
    np.testing.assert_array_equal(a.class_count_, b.class_count_)
    if ours is CategoricalNB:
        for ca, cb in zip(a.category_count_, b.category_count_, strict=True):
            np.testing.assert_array_equal(ca, cb)
    else:
        np.testing.assert_array_equal(a.feature_count_, b.feature_count_)
        np.testing.assert_allclose(a.feature_log_prob_, b.feature_log_prob_, rtol=1e-12)
    np.testing.assert_allclose(a.predict_log_proba(X[:50]), b.predict_log_proba(X[:50]),
                               rtol=1e-9, atol=1e-9)


def test_gaussian_fitted_attributes_equal_sklearn(iris):
    X, y = iris
    a, b = GaussianNB().fit(X, y), skl.GaussianNB().fit(X, y)
    for name in ("classes_", "class_count_", "class_prior_", "theta_", "var_", "epsilon_"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-12, err_msg=name)
    np.testing.assert_allclose(a.class_log_prior_, np.log(b.class_prior_), rtol=1e-12)


def test_class_prior_by_label_in_a_stream():
    """A map label -> prior follows the classes as they arrive (a list must match them)."""
    X = np.array([[3, 0], [0, 3], [1, 1]])
    model = MultinomialNB(class_prior={"a": 0.2, "b": 0.3, "c": 0.5})
    model.partial_fit(X[:1], ["b"]).partial_fit(X[1:2], ["a"])
    np.testing.assert_allclose(model.class_log_prior_, np.log([0.2, 0.3]))
    model.partial_fit(X[2:], ["c"])
    np.testing.assert_allclose(model.class_log_prior_, np.log([0.2, 0.3, 0.5]))
    with pytest.raises(ValueError, match="Number of priors must match number of classes"):
        MultinomialNB(class_prior=[0.5, 0.5]).fit(X, ["a", "b", "c"])


# --------------------------------------------------------------------- sorted classes
def test_classes_arriving_one_at_a_time_are_sorted_and_merges_stay_exact(digits):
    """Classes sorted whatever order they arrive in; predict_proba's columns then line up
    with scikit-learn's, and two models that saw the classes in different orders hold
    the same statistics, bit for bit."""
    X, y = digits
    order = np.argsort(-y, kind="stable")  # classes 9, 8, ..., 0: the reverse of sorted
    stream = MultinomialNB()
    for i in order:
        stream.partial_fit(X[i:i + 1], y[i:i + 1])
    assert stream.classes_.tolist() == list(range(10))
    whole = skl.MultinomialNB().fit(X, y)
    np.testing.assert_allclose(stream.predict_proba(X[:40]), whole.predict_proba(X[:40]),
                               rtol=1e-9, atol=1e-12)
    a = MultinomialNB().partial_fit(X[order[:900]], y[order[:900]])
    b = MultinomialNB().partial_fit(X[:900], y[:900])
    a.merge(MultinomialNB().partial_fit(X[order[900:]], y[order[900:]]))
    b.merge(MultinomialNB().partial_fit(X[900:], y[900:]))
    assert a.stats["classes"].labels == b.stats["classes"].labels == list(range(10))
    np.testing.assert_array_equal(a.stats["classes"].counts, b.stats["classes"].counts)
    np.testing.assert_allclose(a.feature_count_, b.feature_count_, rtol=1e-15)


@pytest.mark.parametrize("bad", [
    [[1 + 1j, 2.0]], np.array([[1 + 0j, 2.0]]),
])
@pytest.mark.parametrize("model", [MultinomialNB(), GaussianNB()], ids=["multinomial", "gaussian"])
def test_complex_input_is_refused(model, bad):
    with pytest.raises(ValueError, match="Complex data not supported"):
        model.fit(bad, [0])


@pytest.mark.parametrize("model", [MultinomialNB(), GaussianNB(), HybridNB(n_meta=1)],
                         ids=["multinomial", "gaussian", "hybrid"])
def test_continuous_labels_are_refused_whole_numbers_are_ints(model):
    X = np.array([[1.0, 2.0], [2.0, 1.0], [0.0, 3.0]])
    with pytest.raises(ValueError, match="Unknown label type"):
        clone(model).fit(X, [0.5, 1.0, 2.0])
    assert clone(model).fit(X, np.array([1.0, 0.0, 1.0])).classes_.tolist() == [0, 1]


def test_score_is_accuracy_with_weights(digits):
    X, y = digits
    model = MultinomialNB().fit(X[:1000], y[:1000])
    right = model.predict(X[1000:]) == y[1000:]
    assert model.score(X[1000:], y[1000:]) == pytest.approx(right.mean())
    w = np.linspace(0.1, 2.0, right.size)
    assert model.score(X[1000:], y[1000:], sample_weight=w) == pytest.approx(np.average(right, weights=w))


def test_set_params_on_a_fitted_model_takes_effect_at_the_next_prediction(digits):
    """The fitted state is the statistics: a new alpha needs no refit."""
    X, y = digits
    model = MultinomialNB(alpha=1.0).fit(X, y)
    model.predict(X[:5])
    model.set_params(alpha=0.1)
    np.testing.assert_allclose(model.predict_log_proba(X[:20]),
                               skl.MultinomialNB(alpha=0.1).fit(X, y).predict_log_proba(X[:20]),
                               rtol=1e-9, atol=1e-12)


def test_sparse_input_of_the_count_models_equals_dense(digits):
    X, y = digits
    a = MultinomialNB().fit(sp.csr_matrix(X), y)
    b = MultinomialNB().fit(X, y)
    np.testing.assert_array_equal(a.predict_log_proba(X[:30]), b.predict_log_proba(X[:30]))
