"""Statistics check what they are given: unlearning what was never learnt raises and
changes nothing; a delta that does not fit raises FormatError before any change. And
what is derived from the statistics lives with the model (class_log_prior_,
unseen_share), equal to what the daemon computed from the statistics itself."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from streamnb.exceptions import FormatError
from streamnb.models import (
    CategoricalNB,
    GaussianNB,
    HybridNB,
    LinearDiscriminantAnalysis,
    MultinomialNB,
    QuadraticDiscriminantAnalysis,
)
from streamnb.stats import (
    CategoryCounts,
    ClassCounts,
    FeatureCounts,
    GaussianMoments,
    StatsBundle,
)


def encoded(model) -> bytes:
    return model.stats.to_bytes()


# ------------------------------------------------------------------- unlearning
def test_the_issue_s_bogus_gaussian_unlearn_is_refused():
    """One bogus unlearn used to leave a class with mean -23.5 and variance 2.9e-7."""
    rng = np.random.default_rng(0)
    X = rng.normal(0.0, 1.0, size=(10, 1))
    model = GaussianNB().fit(X, ["a"] * 10)
    before = encoded(model)
    with pytest.raises(ValueError, match="cannot unlearn this data from class 'a'"):
        model.unlearn([[-250.0]], ["a"])
    assert encoded(model) == before
    np.testing.assert_allclose(model.var_[0, 0], X.var(), rtol=1e-6)


@pytest.mark.parametrize("make", [GaussianNB, LinearDiscriminantAnalysis,
                                  lambda: QuadraticDiscriminantAnalysis(reg_param=0.1)])
def test_gaussian_unlearn_refusals_change_nothing(make):
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(40, 3)), ["a"] * 20 + ["b"] * 20
    model = make().fit(X, y)
    before, lp = encoded(model), model.predict_log_proba(X)
    for bad_X, bad_y, why in [
        (X[:25], ["a"] * 25, "weight of class 'a'"),           # more weight than it holds
        (X[:1], ["c"], "weight of class 'c'"),                 # a class it never learnt
        (X[:20] + 5.0, ["a"] * 20, "from class 'a'"),          # all of a class, other data
        (np.array([[40.0, -40.0, 40.0]]), ["b"], "from class 'b'"),  # a negative variance
    ]:
        with pytest.raises(ValueError, match=why):
            model.unlearn(bad_X, bad_y)
        assert encoded(model) == before
    np.testing.assert_array_equal(model.predict_log_proba(X), lp)
    model.unlearn(X[:20], y[:20])  # what was learnt goes, exactly
    assert model.stats["classes"].as_dict() == {"a": 0.0, "b": 20.0}


def test_count_unlearn_refusals_change_nothing():
    X = np.array([[2, 0, 1], [0, 3, 0], [1, 1, 0]])
    model = MultinomialNB().fit(X, ["a", "b", "a"])
    before = encoded(model)
    for bad_X, bad_y, why in [
        ([[0, 0, 1]], ["b"], "feature counts of class 'b'"),   # a count b never had
        ([[4, 0, 0]], ["a"], "feature counts of class 'a'"),   # more than a holds
        ([[1, 0, 0]], ["z"], "class 'z'"),
    ]:
        with pytest.raises(ValueError, match=why):
            model.unlearn(bad_X, bad_y)
        assert encoded(model) == before
    with pytest.raises(ValueError, match="weight of class 'a'"):
        model.unlearn(X[[0, 2, 0]], ["a", "a", "a"], sample_weight=[0.0, 0.0, 2.5])
    assert encoded(model) == before
    cat = CategoricalNB().fit(X, ["a", "b", "a"])
    with pytest.raises(ValueError, match="category counts of feature 1"):
        cat.unlearn([[2, 3, 1]], ["a"])


def test_rounding_is_not_a_refusal():
    """Learnt in one grouping, unlearnt in another: sums differ in the last bits."""
    rng = np.random.default_rng(3)
    X, w = rng.poisson(2.0, size=(60, 8)), rng.uniform(0.1, 1.0, size=60)
    y = ["a", "b", "c"] * 20
    model = MultinomialNB()
    for i in range(0, 60, 7):
        model.partial_fit(X[i:i + 7], y[i:i + 7], sample_weight=w[i:i + 7])
    model.unlearn(X, y, sample_weight=w)
    assert np.abs(model.feature_count_).max() < 1e-12
    g = GaussianNB()
    for i in range(0, 60, 7):
        g.partial_fit(X[i:i + 7] * 1e3 + 1e6, y[i:i + 7], sample_weight=w[i:i + 7])
    g.unlearn(X[:30] * 1e3 + 1e6, y[:30], sample_weight=w[:30])
    assert g.class_count_.sum() == pytest.approx(w[30:].sum())


def test_a_bundle_subtracts_all_its_parts_or_none():
    model = MultinomialNB().fit(np.array([[1, 0], [0, 1]]), ["a", "b"])
    delta = StatsBundle(classes=ClassCounts(["a"], [1.0]),  # this part alone would go
                        features=FeatureCounts.sparse(2, ["a"], [1], [[1.0]]))
    before = encoded(model)
    with pytest.raises(ValueError, match="feature counts of class 'a'"):
        model.subtract_stats(delta)
    assert encoded(model) == before


@pytest.mark.parametrize("make", [lambda: MultinomialNB(), GaussianNB, CategoricalNB])
def test_clip_removes_at_most_what_is_held_after_a_decay(make):
    """A label correction of a message learnt before a decay: the model holds a shrunk
    share of it. Checked, the removal is refused; with clip (what a worker applies) a
    count goes to 0 at most, a Gaussian class empties, as the statistics always did."""
    X = np.array([[3, 0, 1], [0, 2, 1], [1, 1, 0]])
    model = make().fit(X, ["a", "b", "b"])
    model.decay(0.25)
    correction = model.batch_stats(X[:1], ["a"])
    with pytest.raises(ValueError, match="class 'a'"):
        model.subtract_stats(correction)
    model.subtract_stats(correction, clip=True)
    assert model.stats["classes"].as_dict() == {"a": 0.0, "b": 0.5}
    assert all(np.isfinite(a).all() and (a >= 0).all() for a in (model.class_count_,))
    assert model.predict(X).tolist() == ["b"] * 3


# ------------------------------------------------------------------- mergeability
@pytest.mark.parametrize("model, delta, message", [
    (ClassCounts(["a"], [1.0]), FeatureCounts(3), "cannot combine a ClassCounts with a FeatureCounts"),
    (ClassCounts(["a"], [1.0]), ClassCounts(["a"], [np.nan]), "NaN or infinity"),
    (ClassCounts(["a"], [1.0]), ClassCounts(["a"], [-1.0]), "negative weight"),
    (FeatureCounts(4), FeatureCounts.sparse(5), "5 features do not fit 4"),
    (FeatureCounts(4), FeatureCounts.sparse(4, ["a"], [1], [[np.inf]]), "NaN or infinity"),
    (CategoryCounts(2), CategoryCounts(3), "3 features do not fit 2"),
    (GaussianMoments(2), GaussianMoments(2, diagonal=False), "diagonal"),
    (GaussianMoments(2), GaussianMoments(3), "3 features do not fit 2"),
    (GaussianMoments(2), GaussianMoments(2, labels=["a"], n=[1.0], mean=[[np.nan, 0.0]],
                                         m2=[[0.0, 0.0]]), "NaN or infinity"),
])
def test_check_mergeable_refuses_what_does_not_fit(model, delta, message):
    with pytest.raises(FormatError, match=message):
        model.check_mergeable(delta)


def test_check_mergeable_accepts_a_first_width_and_a_batch_delta():
    FeatureCounts(0).check_mergeable(FeatureCounts.sparse(7))       # width not fixed yet
    GaussianMoments().check_mergeable(GaussianMoments(3))
    model = MultinomialNB(n_features=8).fit(np.eye(8), list("abcdabcd"))
    model.stats.check_mergeable(model.batch_stats(np.eye(8)[:2], ["e", "a"]))
    with pytest.raises(FormatError, match="expected a statistics bundle"):
        model.stats.check_mergeable(ClassCounts())
    with pytest.raises(FormatError, match="parts"):
        model.stats.check_mergeable(StatsBundle(classes=ClassCounts()))


def test_a_delta_of_another_width_is_refused_before_any_change():
    """What a worker checks of every log entry before it merges it (the bundle's
    ``check_mergeable``); a new class in the delta is fine."""
    model = GaussianNB().fit(np.eye(3), ["a", "b", "c"])
    with pytest.raises(FormatError, match="part 'moments': gaussian_moments of 2 features"):
        model.stats.check_mergeable(GaussianNB().batch_stats(np.eye(2), ["a", "b"]))
    model.stats.check_mergeable(GaussianNB().batch_stats(np.eye(3), ["a", "b", "d"]))


# -------------------------------------------------------------- derived quantities
def daemon_log_prior(counts: np.ndarray) -> np.ndarray:
    """What the daemon's non-prequential path computed from the class counts."""
    with np.errstate(divide="ignore"):
        return np.log(counts) - math.log(counts.sum())


@pytest.mark.parametrize("model", [MultinomialNB(), CategoricalNB(), GaussianNB(),
                                   QuadraticDiscriminantAnalysis(reg_param=0.5),
                                   HybridNB(n_meta=1)], ids=lambda m: type(m).__name__)
def test_class_log_prior_is_the_daemon_s(model):
    X = np.array([[1, 0, 2], [0, 1, 1], [2, 2, 0], [1, 1, 1], [0, 3, 2]])
    model.fit(X, ["b", "a", "b", "c", "b"])
    model.partial_fit(X[:1], ["d"], classes=["e"])  # a zero-weight class too
    np.testing.assert_array_equal(model.class_log_prior_,
                                  daemon_log_prior(model.stats["classes"].counts))


def daemon_oov_share(model, rows: list[np.ndarray]) -> np.ndarray:
    """The daemon's Worker._oov_share, from the rows' column indices."""
    out = np.zeros(len(rows))
    fc = model.stats.parts.get("features")
    if fc is None:
        return out
    sizes = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    if not sizes.any():
        return out
    idx = np.concatenate(rows)
    unseen = ~fc.column_counts(idx).any(axis=0) if len(fc.labels) else np.ones(idx.size, bool)
    n_unseen = np.bincount(np.repeat(np.arange(len(rows)), sizes), weights=unseen,
                           minlength=len(rows))
    has = sizes > 0
    out[has] = 1.0 - (sizes[has] - n_unseen[has]) / sizes[has]
    return out


def test_unseen_share_is_the_daemon_s():
    rng = np.random.default_rng(4)
    X = sp.random(50, 300, density=0.05, format="csr", random_state=5)
    X.data[:] = 1.0
    model = MultinomialNB(n_features=300, smoothing_m="seen").fit(X[:30], rng.choice(["a", "b"], 30))
    test = sp.vstack([X[30:], sp.csr_matrix((1, 300))], format="csr")
    rows = [test.indices[test.indptr[i]:test.indptr[i + 1]] for i in range(test.shape[0])]
    got = model.unseen_share(test)
    np.testing.assert_array_equal(got, daemon_oov_share(model, rows))
    assert got[-1] == 0.0 and 0.0 < got.max() <= 1.0
    assert not GaussianNB().fit(np.eye(3), [0, 1, 1]).unseen_share(np.eye(3)).any()
    hybrid = HybridNB(n_meta=1).fit(np.array([[1, 0, 0.5], [0, 0, 1.5]]), ["a", "b"])
    assert hybrid.unseen_share(np.array([[1, 1, 0.0], [0, 0, 2.0]])).tolist() == [0.5, 0.0]


def test_the_import_cycle_is_gone():
    """models.prequential imports no model module (the models import it)."""
    import ast
    from pathlib import Path

    import streamnb.models.prequential as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"streamnb.models.base", "streamnb.models.multinomial"}
