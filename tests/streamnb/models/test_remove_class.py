"""``remove_class``: a model that drops a class equals, statistic for statistic and
prediction for prediction, the model that never saw the class (same batches, that class's
samples left out), for every kind; and equals scikit-learn fitted on the data left."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis as SkLDA
from sklearn.discriminant_analysis import QuadraticDiscriminantAnalysis as SkQDA
from sklearn.naive_bayes import CategoricalNB as SkCategorical
from sklearn.naive_bayes import GaussianNB as SkGaussian
from sklearn.naive_bayes import MultinomialNB as SkMultinomial

from streamnb import (
    BernoulliNB,
    CategoricalNB,
    GaussianNB,
    HybridNB,
    LinearDiscriminantAnalysis,
    MultinomialNB,
    QuadraticDiscriminantAnalysis,
)

LABELS = np.array(["ham", "spam", "Spam"])


def data(kind: str, n: int = 240, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Samples of three classes; ``Spam`` (the typo) sits between the two others and
    reaches categories and columns no other class uses."""
    rng = np.random.default_rng(seed)
    y = LABELS[rng.integers(0, 3, n)]
    c = np.select([y == "ham", y == "spam"], [0, 2], 1)
    if kind == "counts":
        X = rng.poisson(1.0 + c[:, None] * np.linspace(0, 1, 12), (n, 12)).astype(float)
        X[:, -1] = np.where(y == "Spam", X[:, -1] + 1, 0)  # a column only Spam uses
        return X, y
    if kind == "categories":
        X = rng.integers(0, 3, (n, 4)) + (y == "Spam")[:, None] * 2  # categories 3, 4: Spam's
        return X.astype(float), y
    X = rng.normal(c[:, None] * 1.5, 1.0 + 0.3 * c[:, None], (n, 4))
    X[:, 1] += 0.5 * X[:, 0]
    if kind == "hybrid":
        counts = rng.poisson(1.0 + c[:, None], (n, 6)).astype(float)
        return np.hstack([counts, X[:, :2]]), y
    return X, y


MODELS = [
    (lambda: MultinomialNB(alpha=0.5), "counts"),
    (lambda: BernoulliNB(alpha=0.5), "counts"),
    (lambda: CategoricalNB(alpha=0.5), "categories"),
    (lambda: GaussianNB(), "gaussian"),
    (lambda: LinearDiscriminantAnalysis(), "gaussian"),
    (lambda: LinearDiscriminantAnalysis(shrinkage=0.1), "gaussian"),
    (lambda: QuadraticDiscriminantAnalysis(reg_param=0.01), "gaussian"),
    (lambda: HybridNB(n_meta=2), "hybrid"),
]


def in_batches(model, X, y, keep=None, size=37):
    """Learn ``X, y`` in batches of ``size``, only the samples ``keep`` (default: all)."""
    keep = np.ones(len(y), bool) if keep is None else keep
    for a in range(0, len(y), size):
        part = slice(a, a + size)
        if keep[part].any():
            model.partial_fit(X[part][keep[part]], y[part][keep[part]])
    return model


def stats_arrays(model) -> dict[str, np.ndarray]:
    out = {}
    for name, part in model.stats.parts.items():
        out[f"{name}.labels"] = np.array(part.labels)
        for attr in ("counts", "values", "totals", "n_seen", "n", "mean", "m2"):
            value = getattr(part, attr, None)
            if isinstance(value, list):  # category counts: one array a feature
                for j, a in enumerate(value):
                    out[f"{name}.{attr}[{j}]"] = a
            elif value is not None:
                out[f"{name}.{attr}"] = np.asarray(value)
    return out


@pytest.mark.parametrize("make,kind", MODELS, ids=lambda v: getattr(v, "__name__", v))
def test_removing_a_class_gives_the_model_that_never_saw_it(make, kind):
    X, y = data(kind)
    dropped = in_batches(make(), X, y)
    assert dropped.remove_class("Spam")
    never = in_batches(make(), X, y, keep=y != "Spam")
    got, want = stats_arrays(dropped), stats_arrays(never)
    assert got.keys() == want.keys()
    for name in want:  # the same arithmetic on the same rows: equal to the last bit
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    Xt, _ = data(kind, n=60, seed=9)
    assert dropped.classes_.tolist() == ["ham", "spam"]
    np.testing.assert_array_equal(dropped.predict(Xt), never.predict(Xt))
    np.testing.assert_allclose(dropped.predict_log_proba(Xt), never.predict_log_proba(Xt),
                               rtol=0, atol=1e-12)
    assert not dropped.remove_class("Spam")  # once: a second removal changes nothing
    np.testing.assert_array_equal(dropped.predict_log_proba(Xt), never.predict_log_proba(Xt))


def test_a_removed_class_is_gone_from_the_bytes_of_the_model():
    """The encoded statistics (what a snapshot holds) are those of the model that never saw it."""
    X, y = data("counts")
    dropped = in_batches(MultinomialNB(), X, y)
    dropped.remove_class("Spam")
    never = in_batches(MultinomialNB(), X, y, keep=y != "Spam")
    assert dropped.stats.to_bytes() == never.stats.to_bytes()


@pytest.mark.parametrize("ours,theirs,kind", [
    (lambda: MultinomialNB(alpha=0.5), lambda: SkMultinomial(alpha=0.5), "counts"),
    (lambda: CategoricalNB(alpha=0.5), lambda: SkCategorical(alpha=0.5), "categories"),
    (lambda: GaussianNB(), lambda: SkGaussian(), "gaussian"),
    (lambda: LinearDiscriminantAnalysis(), lambda: SkLDA(solver="lsqr"), "gaussian"),
    (lambda: QuadraticDiscriminantAnalysis(reg_param=0.01),
     lambda: SkQDA(reg_param=0.01), "gaussian"),
])
def test_removing_a_class_agrees_with_scikit_learn_on_the_data_left(ours, theirs, kind):
    X, y = data(kind)
    model = in_batches(ours(), X, y)
    model.remove_class("Spam")
    keep = y != "Spam"
    sk = theirs().fit(X[keep], y[keep])
    Xt, _ = data(kind, n=60, seed=9)
    if kind == "categories":  # (scikit-learn knows no category beyond those it saw)
        Xt = np.minimum(Xt, 2)
    np.testing.assert_array_equal(model.classes_, sk.classes_)
    np.testing.assert_allclose(model.predict_log_proba(Xt), sk.predict_log_proba(Xt),
                               rtol=1e-7, atol=1e-7)
    np.testing.assert_array_equal(model.predict(Xt), sk.predict(Xt))


def test_lda_shared_covariance_is_that_of_the_classes_left():
    """The pooled within-class covariance, merged (Chan) from the rows left, is the one of
    the data left, computed directly."""
    X, y = data("gaussian")
    lda = in_batches(LinearDiscriminantAnalysis(), X, y)
    lda.remove_class("Spam")
    keep = y != "Spam"
    within = sum(np.cov(X[keep & (y == c)].T, bias=True) * np.sum(keep & (y == c))
                 for c in ("ham", "spam")) / keep.sum()
    np.testing.assert_allclose(lda.covariance_, within, rtol=1e-12, atol=1e-12)


def test_removing_an_unknown_class_changes_nothing():
    X, y = data("counts")
    model = in_batches(MultinomialNB(), X, y)
    before = model.stats.to_bytes()
    assert not model.remove_class("eggs") and not model.remove_class(7)
    assert model.stats.to_bytes() == before
