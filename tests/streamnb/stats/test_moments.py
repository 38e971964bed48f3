"""GaussianMoments against numpy: merge, subtract, Welford, weights, scale, encoding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb.encoding import dumps, loads
from streamnb.exceptions import FormatError
from streamnb.stats import GaussianMoments, Statistic, StatsBundle

LABELS = ["a", "b", "c"]


def reference(X, y, w, label, diagonal):
    """(n, mean, M2) of one class straight from numpy."""
    sel = np.asarray(y) == label
    Xc, wc = X[sel], w[sel]
    n = wc.sum()
    if n == 0:
        d = X.shape[1]
        return 0.0, np.zeros(d), np.zeros(d if diagonal else (d, d))
    mean = np.average(Xc, axis=0, weights=wc)
    if diagonal:
        return n, mean, np.average((Xc - mean) ** 2, axis=0, weights=wc) * n
    cov = np.cov(Xc.T, aweights=wc, bias=True).reshape(X.shape[1], X.shape[1])
    return n, mean, cov * n


def assert_matches(m, X, y, w, diagonal, atol=1e-9):
    for label in set(y):
        n, mean, m2 = reference(X, y, w, label, diagonal)
        r = m.index.row(label)
        scale = max(1.0, float(np.abs(X).max()) ** 2 * max(n, 1.0))
        assert m.n[r] == pytest.approx(n, rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(m.mean[r], mean, atol=atol * max(1.0, np.abs(X).max()))
        np.testing.assert_allclose(m.m2[r], m2, atol=atol * scale)


def random_batch(seed, n, d=3, weighted=True, labels=LABELS):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 20, size=d) + rng.normal(size=d) * 10
    y = rng.choice(labels, size=n).tolist()
    w = rng.uniform(0.1, 3.0, size=n) if weighted else np.ones(n)
    return X, y, w


def split(seed, n, parts):
    rng = np.random.default_rng(seed + 1)
    cuts = np.sort(rng.choice(np.arange(1, n), size=parts - 1, replace=False)) if parts > 1 else []
    return np.split(rng.permutation(n), cuts)


partitions = st.tuples(
    st.integers(0, 2**32 - 1),      # seed
    st.integers(6, 60),             # samples
    st.integers(1, 5),              # parts
    st.booleans(),                  # diagonal
    st.booleans(),                  # weighted
)


@settings(max_examples=40, deadline=None)
@given(partitions)
def test_merge_of_parts_equals_moments_of_whole(case):
    seed, n, parts, diagonal, weighted = case
    X, y, w = random_batch(seed, n, weighted=weighted)
    merged = GaussianMoments(diagonal=diagonal)
    for idx in split(seed, n, parts):
        part = GaussianMoments(diagonal=diagonal).update(X[idx], [y[i] for i in idx], w[idx])
        merged.merge(part)
    assert_matches(merged, X, y, w, diagonal)
    whole = GaussianMoments(diagonal=diagonal).update(X, y, w)
    assert_matches(whole, X, y, w, diagonal)


@settings(max_examples=40, deadline=None)
@given(partitions)
def test_subtract_part_leaves_the_rest(case):
    seed, n, parts, diagonal, weighted = case
    X, y, w = random_batch(seed, n, weighted=weighted)
    whole = GaussianMoments(diagonal=diagonal).update(X, y, w)
    idx = split(seed, n, max(parts, 2))[0]
    rest = np.setdiff1d(np.arange(n), idx)
    part = GaussianMoments(diagonal=diagonal).update(X[idx], [y[i] for i in idx], w[idx])
    whole.subtract(part)
    assert_matches(whole, X[rest], [y[i] for i in rest], w[rest], diagonal, atol=1e-8)
    for label in set(y) - {y[i] for i in rest}:  # classes only in the part: exactly empty
        r = whole.index.row(label)
        assert whole.n[r] == 0.0 and not whole.mean[r].any() and not whole.m2[r].any()


@pytest.mark.parametrize("diagonal", [True, False])
def test_welford_per_sample_equals_batch(diagonal):
    X, y, w = random_batch(7, 80)
    one = GaussianMoments(diagonal=diagonal)
    for xi, yi, wi in zip(X, y, w, strict=True):
        one.update_one(xi, yi, wi)
    batch = GaussianMoments(diagonal=diagonal).update(X, y, w)
    assert one.labels == batch.labels
    np.testing.assert_allclose(one.n, batch.n, rtol=1e-12)
    np.testing.assert_allclose(one.mean, batch.mean, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(one.m2, batch.m2, rtol=1e-9, atol=1e-8)
    assert_matches(one, X, y, w, diagonal)


@pytest.mark.parametrize("diagonal", [True, False])
def test_integer_weights_equal_repeated_samples(diagonal):
    X, y, _ = random_batch(11, 30)
    reps = np.random.default_rng(2).integers(0, 4, size=30)
    weighted = GaussianMoments(diagonal=diagonal).update(X, y, reps.astype(float))
    repeated = GaussianMoments(diagonal=diagonal).update(
        np.repeat(X, reps, axis=0), [lab for lab, k in zip(y, reps, strict=True) for _ in range(k)])
    for label in repeated.labels:
        a, b = weighted.index.row(label), repeated.index.row(label)
        assert weighted.n[a] == repeated.n[b]
        np.testing.assert_allclose(weighted.mean[a], repeated.mean[b], atol=1e-10)
        np.testing.assert_allclose(weighted.m2[a], repeated.m2[b], rtol=1e-10, atol=1e-8)


def test_scale_multiplies_weights_and_keeps_means():
    X, y, w = random_batch(5, 40)
    m = GaussianMoments(diagonal=False).update(X, y, w)
    before = m.copy()
    m.scale(0.25)
    np.testing.assert_array_equal(m.n, before.n * 0.25)
    np.testing.assert_array_equal(m.mean, before.mean)
    np.testing.assert_array_equal(m.m2, before.m2 * 0.25)
    # Scaling is the same as scaling every weight.
    assert_matches(m, X, y, w * 0.25, diagonal=False)
    for g in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError):
            m.scale(g)


@pytest.mark.parametrize("diagonal", [True, False])
def test_empty_statistic_is_the_identity(diagonal):
    X, y, w = random_batch(9, 25)
    m = GaussianMoments(diagonal=diagonal).update(X, y, w)
    ref = m.copy()
    for op in (m.merge, m.subtract):
        op(GaussianMoments(diagonal=diagonal))
        op(GaussianMoments(3, diagonal=diagonal, labels=["a", "b"]))  # empty rows
        np.testing.assert_array_equal(m.n, ref.n)
        np.testing.assert_array_equal(m.mean, ref.mean)
        np.testing.assert_array_equal(m.m2, ref.m2)
    e = GaussianMoments(diagonal=diagonal).merge(ref)
    np.testing.assert_array_equal(e.mean, ref.mean)
    np.testing.assert_array_equal(e.m2, ref.m2)
    assert GaussianMoments().is_empty() and not ref.is_empty()


@pytest.mark.parametrize("diagonal", [True, False])
def test_one_sample_and_empty_classes_never_divide_by_zero(diagonal):
    with np.errstate(all="raise"):
        m = GaussianMoments(diagonal=diagonal).update([[1.0, 2.0]], ["x"])
        m.add_classes(["empty"])  # (sorted before "x": x's row moves to 1)
        x = m.index.row("x")
        np.testing.assert_array_equal(m.mean[x], [1.0, 2.0])
        assert not m.m2.any()
        assert not m.covariances(ddof=1).any()
        assert not m.covariances().any()
        m.merge(GaussianMoments(diagonal=diagonal).update([[3.0, 2.0]], ["x"]))
        np.testing.assert_array_equal(m.mean[x], [2.0, 2.0])
        assert m.m2[x].ravel()[0] == 2.0           # (1-2)^2 + (3-2)^2
        n, mean, _ = GaussianMoments(diagonal=diagonal).pooled()
        assert n == 0.0


@pytest.mark.parametrize("diagonal", [True, False])
def test_subtracting_everything_leaves_an_exactly_empty_class(diagonal):
    X, y, w = random_batch(13, 40)
    m = GaussianMoments(diagonal=diagonal)
    parts = [GaussianMoments(diagonal=diagonal).update(X[i], [y[j] for j in i], w[i])
             for i in split(13, 40, 4)]
    for p in parts:
        m.merge(p)
    for p in reversed(parts):
        m.subtract(p)
    assert m.is_empty()
    assert not m.n.any() and not m.mean.any() and not m.m2.any()


def test_merge_aligns_rows_by_label():
    X, y, w = random_batch(17, 50)
    a = GaussianMoments(diagonal=False).update(X[:25], y[:25], w[:25])
    b = GaussianMoments(diagonal=False, labels=["c", "b", "a"]).update(X[25:], y[25:], w[25:])
    assert_matches(a.merge(b), X, y, w, diagonal=False)


def test_pooled_matches_numpy_over_all_classes():
    X, y, w = random_batch(19, 60)
    n, mean, m2 = GaussianMoments(diagonal=False).update(X, y, w).pooled()
    assert n == pytest.approx(w.sum())
    np.testing.assert_allclose(mean, np.average(X, axis=0, weights=w))
    np.testing.assert_allclose(m2 / n, np.cov(X.T, aweights=w, bias=True), rtol=1e-10)
    _, _, d2 = GaussianMoments().update(X, y, w).pooled()
    np.testing.assert_allclose(d2 / n, np.average((X - mean) ** 2, axis=0, weights=w), rtol=1e-10)


def test_touched_labels_are_the_classes_with_data():
    m = GaussianMoments().update([[1.0], [2.0]], ["a", "b"], [1.0, 0.0])
    m.add_classes(["c"])
    assert m.touched_labels() == ["a"]


@pytest.mark.parametrize("diagonal", [True, False])
def test_round_trip_is_exact(diagonal):
    X, y, w = random_batch(23, 30)
    m = GaussianMoments(diagonal=diagonal).update(X, y, w)
    back = Statistic.from_bytes(m.to_bytes())
    assert isinstance(back, GaussianMoments)
    assert back.labels == m.labels and back.diagonal == diagonal and back.n_features == 3
    for name in ("n", "mean", "m2"):
        assert getattr(back, name).tobytes() == getattr(m, name).tobytes()
    bundle = StatsBundle.from_bytes(StatsBundle(moments=m).to_bytes())
    assert bundle["moments"].m2.tobytes() == m.m2.tobytes()
    empty = GaussianMoments.from_bytes(GaussianMoments(diagonal=diagonal).to_bytes())
    assert empty.is_empty() and empty.n_features is None


def _corrupt(payload: dict, **changes) -> bytes:
    return dumps({**payload, **changes})


def test_corrupted_payloads_raise_format_error():
    m = GaussianMoments(diagonal=False).update([[1.0, 2.0], [3.0, 1.0]], ["a", "b"])
    good = loads(m.to_bytes())
    nan_mean = m.mean.copy()
    nan_mean[0, 0] = np.nan
    from streamnb.encoding import pack_array
    bad = [
        _corrupt(good, n_features=3),
        _corrupt(good, n_features="2"),
        _corrupt(good, diagonal=True),
        _corrupt(good, labels=["a"]),
        _corrupt(good, labels=["a", "a"]),
        _corrupt(good, labels=[1.5, 2.5]),
        _corrupt(good, mean=pack_array(nan_mean)),
        _corrupt(good, n=pack_array(np.array([1.0, -1.0]))),
        _corrupt(good, n=pack_array(np.array([0.0, 1.0]))),   # empty class with a mean
        _corrupt(good, m2=pack_array(np.zeros((2, 2)))),
        _corrupt(good, m2={**good["m2"], "data": good["m2"]["data"][:-8]}),
        _corrupt(good, v=99),
        dumps({k: v for k, v in good.items() if k != "mean"}),
        m.to_bytes()[:-5],
    ]
    for payload in bad:
        with pytest.raises(FormatError):
            GaussianMoments.from_bytes(payload)


def test_bad_batches_raise_and_change_nothing():
    m = GaussianMoments(diagonal=False).update([[1.0, 2.0], [3.0, 1.0]], ["a", "b"])
    snapshot = m.to_bytes()
    calls = [
        lambda: m.update([[1.0, 2.0, 3.0]], ["a"]),
        lambda: m.update([[np.nan, 2.0]], ["a"]),
        lambda: m.update([[np.inf, 2.0]], ["a"]),
        lambda: m.update([[1.0, 2.0]], ["a", "b"]),
        lambda: m.update([[1.0, 2.0]], [1]),
        lambda: m.update([[1.0, 2.0]], ["a"], [np.nan]),
        lambda: m.update([[1.0, 2.0]], ["a"], [-1.0]),
        lambda: m.update_one([1.0], "a"),
        lambda: m.merge(GaussianMoments(diagonal=True)),
        lambda: m.merge(GaussianMoments(3, diagonal=False)),
    ]
    for call in calls:
        with pytest.raises(ValueError):
            call()
        assert m.to_bytes() == snapshot
