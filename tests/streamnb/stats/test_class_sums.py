"""The class sums of a CSR batch (``feature_counts._class_sums``), by the C function
``streamnb._kernels.class_sums`` and by its numpy reference, against a dense numpy
product: exactly on integer values (any order of addition gives them), and the two forms
bit for bit on real weights (both add in row order: the daemon's digests rest on it)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb.stats import feature_counts as feature_counts_module
from tests.helpers.c_steps import c_or_reference


@pytest.fixture(params=["C", "numpy"])
def sums_path(request, monkeypatch):
    """The class sums by the C function (when built) or by numpy (its reference)."""
    return c_or_reference(request, monkeypatch, feature_counts_module, "CLASS_SUMS")


def dense_oracle(X: sp.csr_matrix, rows: np.ndarray, w: np.ndarray, k: int):
    """Columns with a stored entry (``np.unique``), and ``onehot(rows) * w @ X`` over them
    (X made dense over those columns only, entry by entry)."""
    cols = np.unique(X.indices).astype(np.int64)
    D = np.zeros((X.shape[0], cols.size))
    for i in range(X.shape[0]):
        for p in range(X.indptr[i], X.indptr[i + 1]):
            D[i, np.searchsorted(cols, X.indices[p])] += X.data[p]
    onehot = np.zeros((k, X.shape[0]))
    onehot[rows, np.arange(X.shape[0])] = w
    return cols, onehot @ D


@st.composite
def batches(draw, integer: bool):
    n = draw(st.integers(1, 12))
    width = draw(st.sampled_from([1, 7, 300, 2**20, 2**32 - 2]))
    k = draw(st.integers(1, 4))
    indptr, indices = [0], []
    for _ in range(n):
        row = sorted(draw(st.sets(st.integers(0, width - 1), max_size=min(width, 9))))
        indices += row
        indptr.append(len(indices))
    values = st.integers(1, 5).map(float) if integer else \
        st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False)
    data = np.array([draw(values) for _ in indices], dtype=np.float64)
    weights = np.array([draw(values) for _ in range(n)], dtype=np.float64)
    rows = np.array([draw(st.integers(0, k - 1)) for _ in range(n)], dtype=np.int64)
    index_type = draw(st.sampled_from([np.int32, np.int64])) if width < 2**31 else np.int64
    X = sp.csr_matrix((data, np.array(indices, dtype=index_type), np.array(indptr)), shape=(n, width))
    return X, rows, weights, k


@pytest.mark.parametrize("path", ["C", "numpy"])
@settings(max_examples=150, deadline=None)
@given(batch=batches(integer=True))
def test_class_sums_equal_a_dense_product_on_integer_values(path, batch):
    if path == "C" and feature_counts_module.CLASS_SUMS is None:
        pytest.skip("streamnb._kernels is not built")
    X, rows, w, k = batch
    with pytest.MonkeyPatch.context() as m:
        if path != "C":
            m.setattr(feature_counts_module, "CLASS_SUMS", None)
        cols, sums = feature_counts_module._class_sums(X, rows, w, k)
    want_cols, want = dense_oracle(X, rows, w, k)
    assert cols.dtype == np.int64 and cols.tolist() == want_cols.tolist()
    assert sums.shape == (k, cols.size) and sums.flags.c_contiguous
    assert np.array_equal(sums, want)


@settings(max_examples=100, deadline=None)
@given(batch=batches(integer=False))
def test_c_and_numpy_class_sums_agree_bit_for_bit(batch):
    if feature_counts_module.CLASS_SUMS is None:
        pytest.skip("streamnb._kernels is not built")
    X, rows, w, k = batch
    c_cols, c_sums = feature_counts_module._class_sums(X, rows, w, k)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(feature_counts_module, "CLASS_SUMS", None)
        cols, sums = feature_counts_module._class_sums(X, rows, w, k)
    assert np.array_equal(c_cols, cols)
    assert c_sums.tobytes() == sums.tobytes()
    np.testing.assert_allclose(c_sums, dense_oracle(X, rows, w, k)[1], rtol=1e-12)


def test_repeated_columns_in_a_row_add_up(sums_path):
    # (a row that is not canonical: its column twice, as scipy allows)
    X = sp.csr_matrix((np.array([1.0, 2.0, 4.0]), np.array([5, 5, 2]), np.array([0, 2, 3])),
                      shape=(2, 8))
    cols, sums = feature_counts_module._class_sums(X, np.array([1, 0]), np.array([1.0, 0.5]), 2)
    assert cols.tolist() == [2, 5] and sums.tolist() == [[2.0, 0.0], [0.0, 3.0]]


def test_an_empty_batch_has_no_columns(sums_path):
    X = sp.csr_matrix((3, 16))
    cols, sums = feature_counts_module._class_sums(X, np.array([0, 1, 0]), np.ones(3), 2)
    assert cols.size == 0 and sums.shape == (2, 0)


def test_c_class_sums_refuse_a_bad_batch():
    fn = feature_counts_module.CLASS_SUMS
    if fn is None:
        pytest.skip("streamnb._kernels is not built")
    indptr, indices, data = np.array([0, 1]), np.array([3]), np.array([1.0])
    cols, sums = np.empty(1, dtype=np.int64), np.empty(2)
    with pytest.raises(ValueError, match="class code"):
        fn(indptr, indices, data, np.array([2]), np.ones(1), 2, cols, sums)
    with pytest.raises(ValueError, match="column"):
        fn(indptr, np.array([-1]), data, np.array([0]), np.ones(1), 2, cols, sums)
    with pytest.raises(ValueError, match="n_classes x nnz"):
        fn(indptr, indices, data, np.array([0]), np.ones(1), 2, cols, np.empty(1))


@settings(max_examples=100, deadline=None)
@given(batch=batches(integer=False))
def test_columns_found_once_give_the_same_class_sums(batch):
    """``batch_columns`` (the sorted distinct columns and each nonzero's rank, against
    ``np.unique``), and the C class sums given them: bit for bit those of the numpy form."""
    X, rows, w, k = batch
    columns = feature_counts_module.batch_columns(X)
    if columns is None:
        pytest.skip("streamnb._kernels is not built")
    cols, inverse = np.unique(X.indices, return_inverse=True)
    assert columns.cols.tolist() == cols.tolist() and columns.rank.tolist() == inverse.tolist()
    got_cols, got = feature_counts_module._class_sums(X, rows, w, k, columns)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(feature_counts_module, "CLASS_SUMS", None)
        want_cols, want = feature_counts_module._class_sums(X, rows, w, k)
    assert got_cols.tolist() == want_cols.tolist() and got.tobytes() == want.tobytes()


def test_columns_of_another_batch_are_not_used():
    X = sp.csr_matrix(np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]))
    other = feature_counts_module.batch_columns(sp.csr_matrix(np.array([[1.0, 0.0, 0.0]])))
    if other is None:
        pytest.skip("streamnb._kernels is not built")
    cols, sums = feature_counts_module._class_sums(X, np.array([0, 1]), np.ones(2), 2, other)
    assert cols.tolist() == [0, 1, 2] and sums.tolist() == [[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]


def test_c_class_sums_refuse_columns_that_do_not_fit():
    fn = feature_counts_module.CLASS_SUMS
    if fn is None:
        pytest.skip("streamnb._kernels is not built")
    indptr, indices, data = np.array([0, 2]), np.array([3, 5]), np.array([1.0, 2.0])
    batch = (indptr, indices, data, np.array([0]), np.ones(1), 2)
    cols = np.array([3, 5], dtype=np.int64)
    for rank, match in [(np.array([0, 2], np.int32), "rank is not in"),
                        (np.array([0], np.int32), "rank takes nnz"),
                        (np.array([0, 1], np.int64), "rank takes nnz")]:
        with pytest.raises(ValueError, match=match):
            fn(*batch, cols, np.empty(4), rank)
    assert fn(*batch, cols, sums := np.empty(4), np.array([0, 1], np.int32)) == 2
    assert sums.tolist() == [1.0, 2.0, 0.0, 0.0]


def test_columns_fit_the_matrices_made_of_their_batch_only():
    X = sp.csr_matrix(np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]))
    columns = feature_counts_module.batch_columns(X)
    if columns is None:
        pytest.skip("streamnb._kernels is not built")
    assert columns.fits(X) and columns.fits(sp.csr_matrix(X, dtype=np.float64))
    assert not columns.fits(X.copy()) and not columns.fits(X[:1])
