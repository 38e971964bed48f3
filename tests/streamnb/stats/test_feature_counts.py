"""FeatureCounts and CategoryCounts against numpy on random partitions."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb.encoding import dumps, loads
from streamnb.exceptions import FormatError
from streamnb.stats import CategoryCounts, FeatureCounts, Statistic
from streamnb.stats import feature_counts as feature_counts_module

LABELS = np.array(["a", "b", "c"], dtype=object)


def numpy_counts(X: np.ndarray, y: np.ndarray, w: np.ndarray, labels) -> np.ndarray:
    """Reference F[c, j] = sum_i w_i X_ij [y_i = c], rows in ``labels`` order."""
    out = np.zeros((len(labels), X.shape[1]))
    for r, lab in enumerate(labels):
        mask = y == lab
        out[r] = (w[mask, None] * X[mask]).sum(axis=0)
    return out


def as_array(f: FeatureCounts, labels) -> np.ndarray:
    """f's counts in ``labels`` order (zero rows for labels it does not have)."""
    dense = f.toarray()
    out = np.zeros((len(labels), f.n_features))
    for r, lab in enumerate(labels):
        if lab in f.index:
            out[r] = dense[f.index.row(lab)]
    return out


@st.composite
def count_data(draw):
    n = draw(st.integers(1, 30))
    d = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    X = rng.poisson(0.7, size=(n, d)).astype(np.float64)
    X[:, rng.random(d) < 0.3] = 0.0  # some never-seen columns
    y = rng.choice(LABELS, size=n)
    w = rng.choice([0.5, 1.0, 2.0], size=n)
    n_parts = draw(st.integers(1, 5))
    part = rng.integers(0, n_parts, size=n)
    return X, y, w, part, n_parts, draw(st.booleans())


def check_invariants(f: FeatureCounts) -> None:
    dense = f.toarray()
    np.testing.assert_allclose(f.totals, dense.sum(axis=1), atol=1e-9)
    assert f.n_seen == np.count_nonzero(dense.any(axis=0))


@settings(max_examples=60, deadline=None)
@given(count_data())
def test_merge_of_parts_equals_whole(data):
    X, y, w, part, n_parts, use_csr = data
    whole = numpy_counts(X, y, w, LABELS)
    model = FeatureCounts(X.shape[1])
    sparse_sum = FeatureCounts.sparse(X.shape[1])
    for p in range(n_parts):
        m = part == p
        if not m.any():
            continue
        Xp = sp.csr_matrix(X[m]) if use_csr else X[m]
        delta = FeatureCounts.sparse(X.shape[1]).update(Xp, y[m], w[m])
        model.merge(delta)
        sparse_sum.merge(delta)
    np.testing.assert_allclose(as_array(model, LABELS), whole, atol=1e-9)
    np.testing.assert_allclose(as_array(sparse_sum, LABELS), whole, atol=1e-9)
    assert not model.is_sparse and sparse_sum.is_sparse
    check_invariants(model)
    check_invariants(sparse_sum)
    # dense + dense merge gives the same
    other = FeatureCounts(X.shape[1]).update(X, y, w)
    np.testing.assert_allclose(as_array(other, LABELS), whole, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(count_data())
def test_subtract_part_leaves_rest(data):
    X, y, w, part, _, use_csr = data
    m = part == 0
    f = FeatureCounts(X.shape[1]).update(X, y, w)
    Xp = sp.csr_matrix(X[m]) if use_csr else X[m]
    f.subtract(FeatureCounts.sparse(X.shape[1]).update(Xp, y[m], w[m]))
    np.testing.assert_allclose(as_array(f, LABELS), numpy_counts(X[~m], y[~m], w[~m], LABELS), atol=1e-9)
    assert (f.toarray() >= 0).all()
    check_invariants(f)
    # dense subtract of a dense statistic too
    g = FeatureCounts(X.shape[1]).update(X, y, w).subtract(FeatureCounts(X.shape[1]).update(X, y, w))
    assert g.is_empty() and g.n_seen == 0


@settings(max_examples=40, deadline=None)
@given(count_data(), st.floats(0.01, 1.0))
def test_scale_equals_scaled_weights(data, g):
    X, y, w, _, _, _ = data
    f = FeatureCounts(X.shape[1]).update(X, y, w).scale(g)
    np.testing.assert_allclose(as_array(f, LABELS), numpy_counts(X, y, w * g, LABELS), rtol=1e-12, atol=1e-12)
    check_invariants(f)


@settings(max_examples=40, deadline=None)
@given(count_data())
def test_empty_is_identity_and_round_trip_exact(data):
    X, y, w, _, _, use_csr = data
    f = FeatureCounts(X.shape[1]).update(X, y, w)
    before = f.toarray()
    f.merge(FeatureCounts()).subtract(FeatureCounts.sparse(X.shape[1]))
    assert np.array_equal(f.toarray(), before)
    for stat in (f, FeatureCounts.sparse(X.shape[1]).update(sp.csr_matrix(X), y, w)):
        back = Statistic.from_bytes(stat.to_bytes())
        assert isinstance(back, FeatureCounts) and back.is_sparse == stat.is_sparse
        assert back.labels == stat.labels and back.n_features == stat.n_features
        assert back.toarray().tobytes() == stat.toarray().tobytes()
        assert back.n_seen == stat.n_seen


def test_merge_widens_and_aligns_by_label():
    a = FeatureCounts(2).update(np.array([[1.0, 2.0]]), ["x"])
    b = FeatureCounts.sparse(5).update(sp.csr_matrix(np.array([[0.0, 0, 0, 0, 3.0], [1.0, 0, 0, 0, 0]])), ["y", "x"])
    a.merge(b)
    assert a.n_features == 5 and a.labels == ["x", "y"]
    assert a.toarray().tolist() == [[2.0, 2.0, 0, 0, 0], [0, 0, 0, 0, 3.0]]
    assert a.totals.tolist() == [4.0, 3.0] and a.n_seen == 3


def test_wide_sparse_delta_stays_small():
    """A hashed batch over 2**20 columns must not allocate or encode O(n_features)."""
    n_features = 2**20
    rng = np.random.default_rng(0)
    n, nnz_per_row = 100, 50
    cols = rng.integers(0, n_features, size=(n, nnz_per_row)).ravel()
    rows = np.repeat(np.arange(n), nnz_per_row)
    X = sp.csr_matrix((np.ones(cols.size), (rows, cols)), shape=(n, n_features))
    y = rng.choice(["spam", "ham"], size=n)
    tracemalloc.start()
    try:
        delta = FeatureCounts.sparse(n_features).update(X, y)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    touched = np.unique(cols).size
    assert delta.touched_columns.size == touched
    assert delta.nbytes <= touched * (8 + 2 * 8)
    assert len(delta.to_bytes()) < touched * 24 + 1000
    dense_row_bytes = n_features * 8
    assert peak < dense_row_bytes / 4, f"peak {peak} bytes while building a sparse delta"
    # merging into a dense model touches only those columns and matches a dense count
    model = FeatureCounts(n_features)
    model.merge(delta)
    np.testing.assert_array_equal(model.toarray()[:, delta.touched_columns], delta.values)
    assert model.n_seen == touched and model.totals.sum() == X.sum()


def test_corrupted_and_newer_payloads_raise_format_error():
    f = FeatureCounts(4).update(np.array([[1.0, 0, 2, 0], [0, 1, 0, 0]]), ["a", "b"])
    good = loads(f.to_bytes())

    def broken(**changes):
        enc = dict(good, **changes)
        return dumps(enc)

    cols = good["columns"]
    bad_payloads = [
        f.to_bytes()[:-5],
        b"\xc1garbage",
        broken(v=FeatureCounts.VERSION + 1),
        broken(type="class_counts"),
        broken(n_features=1),  # columns out of range
        broken(n_features=-3),
        broken(storage="weird"),
        broken(labels=["a"]),  # shape mismatch
        broken(labels=["a", "a"]),
        broken(columns=dict(cols, dtype="<i8", data=np.array([2, 0, 1], "<i8").tobytes())),  # unsorted
        broken(columns=dict(cols, data=np.array([2, 0, 1], "<u4").tobytes())),  # unsorted
        broken(columns=dict(cols, dtype="<f8")),
        broken(values=dict(good["values"], data=good["values"]["data"][:-8])),
        broken(values=dict(good["values"], dtype="<f8", data=np.full(6, -1.0).tobytes())),
        broken(values=dict(good["values"], dtype="<i4", data=np.full(6, -1, "<i4").tobytes())),
    ]
    for payload in bad_payloads:
        with pytest.raises(FormatError):
            FeatureCounts.from_bytes(payload)


def test_counts_are_encoded_in_the_smallest_exact_type_and_read_back_exactly():
    rng = np.random.default_rng(4)
    X = sp.csr_matrix((np.ones(600), (np.repeat(np.arange(100), 6), rng.integers(0, 2**20, 600))),
                      shape=(100, 2**20))
    y = rng.choice(["spam", "ham"], size=100)
    for w, values_dtype in [(np.ones(100), "|u1"), (np.full(100, 300.0), "<u2"),
                            (np.full(100, 1e6), "<u4"), (np.full(100, 0.5), "<f8"),
                            (np.full(100, 1e10), "<f8")]:  # above 2**32: float64
        delta = FeatureCounts.sparse(2**20).update(X, y, w)
        enc = loads(delta.to_bytes())
        assert enc["v"] == 2 and enc["columns"]["dtype"] == "<u4"
        assert enc["values"]["dtype"] == values_dtype, w[0]
        back = FeatureCounts.from_bytes(delta.to_bytes())
        assert back.values.dtype == np.float64 and back.touched_columns.dtype == np.int64
        np.testing.assert_array_equal(back.values, delta.values)
        np.testing.assert_array_equal(back.touched_columns, delta.touched_columns)


def test_unit_counts_take_a_quarter_of_the_bytes_and_version_1_is_refused():
    from streamnb.encoding import pack_array

    rng = np.random.default_rng(5)
    X = sp.csr_matrix((np.ones(18_300), (np.repeat(np.arange(100), 183),
                                         rng.integers(0, 2**20, 18_300))), shape=(100, 2**20))
    delta = FeatureCounts.sparse(2**20).update(X, rng.choice(["spam", "ham"], size=100))
    v2 = loads(delta.to_bytes())
    cols = np.frombuffer(v2["columns"]["data"], "<u4").astype(np.int64)
    vals = np.frombuffer(v2["values"]["data"], "|u1").reshape(2, -1).astype(np.float64)
    wide = dumps(dict(v2, columns=pack_array(cols), values=pack_array(vals)))  # int64, float64
    np.testing.assert_array_equal(FeatureCounts.from_bytes(wide).values, delta.values)
    assert len(delta.to_bytes()) * 3.5 < len(wide)  # 4 + 2 x 1 bytes per column instead of 8 + 2 x 8
    with pytest.raises(FormatError, match=r"^feature_counts format version 1 is not 2, the one "
                                          r"this streamnb reads$"):
        FeatureCounts.from_bytes(dumps(dict(v2, v=1)))


# ------------------------------------------------------------------ categories
def numpy_category_counts(X, y, w, labels, n_categories):
    return [
        np.array([[w[(y == lab) & (X[:, j] == v)].sum() for v in range(n_categories[j])] for lab in labels])
        for j in range(X.shape[1])
    ]


def cat_as_list(n: CategoryCounts, labels):
    rows = [n.index.row(lab) if lab in n.index else None for lab in labels]
    return [np.array([c[r] if r is not None else np.zeros(c.shape[1]) for r in rows]) for c in n.counts]


@st.composite
def category_data(draw):
    n = draw(st.integers(1, 30))
    d = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    X = rng.integers(0, rng.integers(1, 6, size=d), size=(n, d))
    y = rng.choice(LABELS, size=n)
    w = rng.choice([0.5, 1.0, 3.0], size=n)
    return X, y, w, rng.integers(0, draw(st.integers(1, 5)), size=n)


@settings(max_examples=60, deadline=None)
@given(category_data(), st.floats(0.05, 1.0))
def test_category_counts_properties(data, g):
    X, y, w, part = data
    K = X.max(axis=0) + 1
    whole = numpy_category_counts(X, y, w, LABELS, K)
    merged = CategoryCounts()
    for p in np.unique(part):
        m = part == p
        merged.merge(CategoryCounts().update(X[m], y[m], w[m]))
    assert merged.n_categories.tolist() == K.tolist()
    for got, want in zip(cat_as_list(merged, LABELS), whole, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-9)
    # subtract a part
    m = part == part[0]
    rest = CategoryCounts().update(X, y, w).subtract(CategoryCounts().update(X[m], y[m], w[m]))
    # K_j shrinks to the largest category still holding weight + 1
    K_rest = [int(X[~m & (w > 0), j].max()) + 1 if (~m & (w > 0)).any() else 0 for j in range(X.shape[1])]
    assert rest.n_categories.tolist() == K_rest
    for got, want in zip(
        cat_as_list(rest, LABELS), numpy_category_counts(X[~m], y[~m], w[~m], LABELS, K_rest), strict=True
    ):
        np.testing.assert_allclose(got, want, atol=1e-9)
    # scale, identity, round trip
    scaled = merged.copy().scale(g)
    for got, want in zip(cat_as_list(scaled, LABELS), whole, strict=True):
        np.testing.assert_allclose(got, want * g, rtol=1e-12, atol=1e-12)
    same = merged.copy().merge(CategoryCounts()).subtract(CategoryCounts())
    assert all(np.array_equal(a, b) for a, b in zip(same.counts, merged.counts, strict=True))
    back = Statistic.from_bytes(merged.to_bytes())
    assert isinstance(back, CategoryCounts) and back.labels == merged.labels
    assert all(a.tobytes() == b.tobytes() for a, b in zip(back.counts, merged.counts, strict=True))


def test_category_counts_refuses_bad_categories_and_payloads():
    n = CategoryCounts().update(np.array([[0, 1]]), ["a"])
    with pytest.raises(ValueError, match="non-negative integer"):
        n.update(np.array([[0.5, 1]]), ["a"])
    with pytest.raises(ValueError, match="non-negative integer"):
        n.update(np.array([[-1, 1]]), ["a"])
    good = loads(n.to_bytes())
    for enc in (
        dict(good, v=CategoryCounts.VERSION + 1),
        dict(good, n_categories=dict(good["n_categories"], data=np.array([5, 5], "<i8").tobytes())),
        dict(good, labels=["a", "b"]),
    ):
        with pytest.raises(FormatError):
            CategoryCounts.from_bytes(dumps(enc))


@pytest.mark.parametrize("seed", range(25))
def test_the_class_sums_of_a_batch(seed):
    """The batch's distinct columns and the per-class weighted sums over them, on random
    sparse batches: duplicate entries, explicit zeros, unsorted indices, empty rows, int32
    and int64 indices, wide and narrow widths; against a dense sum."""
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 40)), int(rng.choice([7, 300, 2 ** 20]))
    nnz = int(rng.integers(0, 6 * n))
    rows = np.sort(rng.integers(0, n, nnz))
    X = sp.csr_matrix((np.floor(rng.uniform(0, 4, nnz)) * rng.uniform(0.5, 2, nnz),
                       (rows, rng.integers(0, d, nnz))), shape=(n, d))
    if rng.random() < 0.5:  # not canonical: each entry twice, each row's entries reversed
        ptr, idx, dat = X.indptr * 2, X.indices.repeat(2), X.data.repeat(2) / 2
        for i in range(n):
            idx[ptr[i]:ptr[i + 1]] = idx[ptr[i]:ptr[i + 1]][::-1].copy()
            dat[ptr[i]:ptr[i + 1]] = dat[ptr[i]:ptr[i + 1]][::-1].copy()
        X = sp.csr_matrix((dat, idx, ptr), shape=(n, d))
        assert X.nnz == 0 or not X.has_canonical_format
    if rng.random() < 0.5:
        X.indices = X.indices.astype(np.int64)
    K = int(rng.integers(1, 4))
    classes = rng.integers(0, K, n)
    w = rng.uniform(0, 3, n)
    cols, sums = feature_counts_module._class_sums(X, classes, w, K)
    # one row per class, each contiguous (a Fortran-ordered result made the row sums of the
    # merge and the copies behind it several times slower)
    assert sums.flags.c_contiguous
    np.testing.assert_array_equal(cols, np.unique(X.indices))
    dense = np.zeros((K, d))
    np.add.at(dense, (classes[np.repeat(np.arange(n), np.diff(X.indptr))], X.indices),
              np.repeat(w, np.diff(X.indptr)) * X.data)
    np.testing.assert_allclose(sums, dense[:, cols], rtol=1e-12)


def test_strided_weights_count_as_contiguous_ones():
    """Weights that are a strided view (every other item of an array) give the same counts,
    bit for bit, as a contiguous copy (the C class sums take them as a copy)."""
    rng = np.random.default_rng(4)
    X = sp.random(30, 50, density=0.2, random_state=rng, format="csr")
    labels = list(rng.choice(["a", "b"], size=30))
    both = rng.uniform(0.5, 2.0, 60)
    assert not both[::2].flags.c_contiguous
    strided = FeatureCounts(n_features=50).update(X, labels, both[::2])
    contiguous = FeatureCounts(n_features=50).update(X, labels, both[::2].copy())
    np.testing.assert_array_equal(strided.values, contiguous.values)
    assert strided.labels == contiguous.labels


@pytest.mark.parametrize("seed", range(30))
def test_merges_into_dense_counts_follow_a_dense_replay(seed):
    """Merges and subtractions (clamped at 0) of sparse deltas of some of the classes, in
    another class order, with zero and fractional counts, into dense counts: the same
    counts, totals and number of nonzero columns as the same steps on dense arrays."""
    rng = np.random.default_rng(seed)
    d, labels = int(rng.choice([5, 64, 4096])), list(rng.permutation(["a", "b", "c", "d"]))

    def delta(classes: list[str]) -> FeatureCounts:
        cols = np.unique(rng.integers(0, d, int(rng.integers(0, d + 1))))
        vals = rng.choice([0.0, 0.25, 1.0, 3.0, 1 / 3], size=(len(classes), cols.size))
        return FeatureCounts.sparse(d, classes, cols.astype(np.int64), vals)

    f = delta(labels[: int(rng.integers(1, 5))]).densify()
    want = {lab: row.copy() for lab, row in zip(f.labels, f.toarray(), strict=True)}
    clamped = False
    for _ in range(6):
        other = delta(list(rng.permutation(f.labels))[: int(rng.integers(1, len(f.labels) + 1))])
        subtract = bool(rng.random() < 0.4)
        # (_combine: the clamped subtraction, without the check that refuses to remove more
        # than is held)
        f._combine(other, -1.0) if subtract else f.merge(other)
        for lab, row in zip(other.labels, other.toarray(), strict=True):
            clamped |= subtract and bool((want.get(lab, 0.0) - row < 0).any())
            want[lab] = np.maximum(want.get(lab, 0.0) - row, 0.0) if subtract \
                else want.get(lab, 0.0) + row
        assert f.values.flags.c_contiguous
    got = dict(zip(f.labels, f.toarray(), strict=True))
    for lab in want:
        np.testing.assert_allclose(got[lab], want[lab], rtol=1e-12, atol=1e-12)
    if not clamped:  # (a clamp is a rounding guard: the totals keep what was subtracted)
        np.testing.assert_allclose(f.totals, [want[lab].sum() for lab in f.labels], rtol=1e-12)
    assert f.n_seen == np.count_nonzero(f.values.any(axis=0))
