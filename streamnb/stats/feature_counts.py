"""Per-class feature counts ``F[c, j]``: the statistic behind multinomial and Bernoulli NB.

Two storages share one type:

* **dense** (a model's own statistics): a float64 array ``(n_classes, n_features)``;
* **sparse** (a batch's delta): sorted column indices plus ``(n_classes, n_touched)``
  values. A sparse statistic never allocates anything of size ``n_features``, so a
  delta of a batch of hashed messages (``n_features = 2**20``) stays small.

Merging or subtracting a sparse delta into a dense statistic touches only the delta's
columns. Per-class totals ``sum_j F[c, j]`` and the number of distinct features seen
(columns with a nonzero count in any class) are maintained incrementally.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import scipy.sparse as sp

from streamnb._cmodules import optional_c_module
from streamnb.arrays import sorted_unique, unique_inverse
from streamnb.encoding import pack_counts, pack_index, unpack_counts, unpack_index
from streamnb.exceptions import FormatError
from streamnb.stats.base import (
    ClassIndex,
    Label,
    Statistic,
    check_finite,
    check_removable,
    check_scale_factor,
    normalize_labels,
    spread_rows,
)

#: ``streamnb._kernels.class_sums`` (the C form of :func:`_class_sums` for a CSR batch of
#: float64 values), or None: not built, or ``STREAMNB_PURE_PYTHON`` set; then numpy does
#: the same (tests/streamnb/stats/test_class_sums.py compares both with a dense product).
CLASS_SUMS = getattr(optional_c_module("streamnb._kernels"), "class_sums", None)
#: ``streamnb._kernels.column_ranks`` (a batch's distinct columns and each nonzero's rank
#: among them, for :class:`BatchColumns`), or None.
COLUMN_RANKS = getattr(optional_c_module("streamnb._kernels"), "column_ranks", None)


@dataclass(frozen=True)
class BatchColumns:
    """A CSR batch's distinct columns, found once for both its prequential prediction
    (streamnb.models.prequential) and its class sums: ``cols`` ascending (int64) and
    ``rank``, each nonzero's position in ``cols`` (int32), made of the column indices
    ``indices`` and used only with them: an array of X's over the same memory (scipy's
    matrices made of X hold arrays of their own over it), which this one keeps alive."""

    indices: np.ndarray
    cols: np.ndarray
    rank: np.ndarray

    def fits(self, X: sp.csr_matrix) -> bool:
        """Whether these are the columns of ``X`` (its indices are those they were made of)."""
        own, other = self.indices, X.indices
        return other is own or (
            other.dtype == own.dtype and other.size == own.size and other.flags.c_contiguous
            and other.__array_interface__["data"][0] == own.__array_interface__["data"][0])


def batch_columns(X: Any) -> BatchColumns | None:
    """The :class:`BatchColumns` of a CSR matrix ``X``; None without the C module or for
    any other X.

    >>> X = sp.csr_matrix(np.array([[0.0, 2.0, 1.0], [3.0, 2.0, 0.0]]))
    >>> c = batch_columns(X)
    >>> c is None or (c.cols.tolist(), c.rank.tolist()) == ([0, 1, 2], [1, 2, 0, 1])
    True
    """
    if COLUMN_RANKS is None or not sp.issparse(X) or X.format != "csr":
        return None
    cols = np.empty(X.indices.size, dtype=np.int64)
    rank = np.empty(X.indices.size, dtype=np.int32)
    m = COLUMN_RANKS(X.indices, cols, rank)
    return BatchColumns(X.indices, cols[:m].copy(), rank)


class FeatureCounts(Statistic):
    """Weighted per-class feature counts, aligned by label, dense or sparse.

    >>> import numpy as np
    >>> X = np.array([[2.0, 0.0, 1.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    >>> f = FeatureCounts(n_features=3).update(X, ["a", "b", "a"])
    >>> f.toarray().tolist()
    [[3.0, 0.0, 1.0], [0.0, 0.0, 3.0]]
    >>> f.totals.tolist(), f.n_seen
    ([4.0, 3.0], 2)
    >>> delta = FeatureCounts.sparse(n_features=3).update(X[:1], ["b"])
    >>> delta.touched_columns.tolist()
    [0, 2]
    >>> f.merge(delta).toarray().tolist()
    [[3.0, 0.0, 1.0], [2.0, 0.0, 4.0]]
    """

    TYPE = "feature_counts"
    #: 2: columns as uint32 when they fit (streamnb.encoding.pack_index) and whole-number
    #: counts as the smallest unsigned type that holds them (pack_counts).
    VERSION = 2

    def __init__(
        self,
        n_features: int = 0,
        labels: Sequence[Label] = (),
        counts: Any = None,
        *,
        columns: Any = None,
    ) -> None:
        """Dense storage unless ``columns`` (sorted column indices) is given; the rows of
        ``counts`` in the order of ``labels`` (which may be in any order)."""
        self.index, order = ClassIndex.of(labels)
        self.n_features = _check_width(n_features)
        k = len(self.index)
        if columns is None:
            self.columns: np.ndarray | None = None
            shape = (k, self.n_features)
        else:
            self.columns = np.asarray(columns, dtype=np.int64)
            _check_columns(self.columns, self.n_features)
            shape = (k, self.columns.size)
        self.values = (
            np.zeros(shape, dtype=np.float64)
            if counts is None
            else np.array(counts, dtype=np.float64, ndmin=2).reshape(shape)
        )
        if order is not None:
            self.values = np.take(self.values, order, axis=0)
        self.totals = self.values.sum(axis=1)
        self.n_seen = int(np.count_nonzero(self.values.any(axis=0)))

    @classmethod
    def sparse(
        cls, n_features: int = 0, labels: Sequence[Label] = (), columns: Any = (), counts: Any = None
    ) -> Self:
        """A statistic in sparse storage (only the touched columns are held)."""
        return cls(n_features, labels, counts, columns=np.asarray(columns, dtype=np.int64))

    # ------------------------------------------------------------------ access
    @property
    def labels(self) -> list[Label]:
        return self.index.labels

    @property
    def is_sparse(self) -> bool:
        return self.columns is not None

    @property
    def touched_columns(self) -> np.ndarray:
        """Columns this statistic may hold nonzero counts in (all columns when dense)."""
        if self.columns is not None:
            return self.columns
        return np.arange(self.n_features, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        """Memory held by the count arrays."""
        return self.values.nbytes + (0 if self.columns is None else self.columns.nbytes)

    def column_counts(self, columns: Any) -> np.ndarray:
        """Counts of the given columns, shape ``(n_classes, len(columns))``."""
        cols = np.asarray(columns, dtype=np.int64)
        if self.columns is None:
            return np.take(self.values, cols, axis=1)
        out = np.zeros((len(self.index), cols.size), dtype=np.float64)
        if self.columns.size:
            pos = np.minimum(np.searchsorted(self.columns, cols), self.columns.size - 1)
            hit = self.columns[pos] == cols
            out[:, hit] = np.take(self.values, pos[hit], axis=1)
        return out

    def toarray(self) -> np.ndarray:
        """All counts as a dense ``(n_classes, n_features)`` array (a copy)."""
        if self.columns is None:
            return self.values.copy()
        out = np.zeros((len(self.index), self.n_features), dtype=np.float64)
        out[:, self.columns] = self.values
        return out

    def __repr__(self) -> str:
        storage = "sparse" if self.is_sparse else "dense"
        return (
            f"FeatureCounts({storage}, n_features={self.n_features}, classes={self.labels!r}, "
            f"n_seen={self.n_seen})"
        )

    # ------------------------------------------------------------ class rows
    def add_classes(self, labels: Iterable[Any]) -> np.ndarray:
        """Register labels (zero rows if new); return their rows."""
        rows, moved = self.index.rows_adding(labels)
        if moved is not None:  # zero rows from calloc: only the earlier rows are written
            self.values = spread_rows(self.values, moved, len(self.index))
            self.totals = spread_rows(self.totals, moved, len(self.index))
        return rows

    def densify(self) -> Self:
        """Switch to dense storage in place (allocates ``n_classes * n_features``)."""
        if self.columns is not None:
            self.values = self.toarray()
            self.columns = None
        return self

    def _widen(self, n_features: int) -> None:
        if n_features <= self.n_features:
            return
        if self.columns is None:
            extra = np.zeros((self.values.shape[0], n_features - self.n_features))
            self.values = np.hstack([self.values, extra])
        self.n_features = n_features

    # ---------------------------------------------------------------- update
    def update(self, X: Any, labels: Iterable[Any], weights: Any = None,
               columns: BatchColumns | None = None) -> Self:
        """Add a batch: ``F[c, j] += sum_i w_i X[i, j]`` over the samples of class c.

        ``X`` is a dense array or a scipy.sparse matrix of non-negative values (the
        model validates it). A sparse statistic only ever touches X's nonzero columns.
        ``columns``: :func:`batch_columns` of X made before (used where it fits X).
        """
        labels = normalize_labels(labels)
        n, d = X.shape
        if len(labels) != n:
            raise ValueError(f"{len(labels)} labels for {n} samples")
        if self.n_features and d != self.n_features:
            raise ValueError(f"X has {d} features, but these counts have {self.n_features}")
        w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
        rows = self.add_classes(labels)
        self._widen(d)
        cols, per_class = _class_sums(X, rows, w, len(self.index), columns)
        self._add(np.arange(len(self.index)), cols, per_class, 1.0)
        return self

    def _add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, sign: float) -> None:
        """``self[rows, cols] += sign * vals`` for sorted unique ``cols``; keep totals/n_seen."""
        if cols.size == 0:
            return
        if self.columns is None:
            block = np.take(self.values, cols, axis=1)  # C-ordered (k, t)
            before = np.count_nonzero(block.any(axis=0))
            block[rows] += sign * vals
            if sign < 0:
                np.maximum(block, 0.0, out=block)
            for r, row in enumerate(block):  # row by row: 2x faster than values[:, cols] = block
                self.values[r, cols] = row
            self.n_seen += int(np.count_nonzero(block.any(axis=0))) - int(before)
        elif self.columns.size == 0 and sign > 0:  # a fresh delta: the batch's columns as is
            fresh = np.zeros((self.values.shape[0], cols.size))
            fresh[rows] = vals
            self.columns, self.values = np.array(cols, dtype=np.int64), fresh
            self.n_seen = int(np.count_nonzero(fresh.any(axis=0)))
        else:
            union = sorted_unique(np.concatenate([self.columns, cols]), runs=True)
            merged = np.zeros((self.values.shape[0], union.size))
            merged[:, np.searchsorted(union, self.columns)] = self.values
            sub = merged[:, np.searchsorted(union, cols)]
            sub[rows] += sign * vals
            if sign < 0:
                np.maximum(sub, 0.0, out=sub)
            merged[:, np.searchsorted(union, cols)] = sub
            self.columns, self.values = union, merged
            self.n_seen = int(np.count_nonzero(merged.any(axis=0)))
        self.totals[rows] += sign * vals.sum(axis=1)
        if sign < 0:
            np.maximum(self.totals, 0.0, out=self.totals)

    # --------------------------------------------------------- combination
    def check_mergeable(self, other: Any) -> None:
        """(The width of a model's counts is fixed once it is not 0.)"""
        self._check_type(other)
        if self.n_features and other.n_features != self.n_features:
            raise FormatError(f"feature_counts of {other.n_features} features do not fit "
                              f"{self.n_features}")
        check_finite("feature_counts", other.values)

    def check_subtractable(self, other: FeatureCounts) -> None:
        self._check_type(other)
        cols = other.touched_columns
        inside = cols < self.n_features
        mine = self.column_counts(cols[inside])
        for r, lab in enumerate(other.labels):
            held = np.zeros(cols.size)
            if lab in self.index:
                held[inside] = mine[self.index.row(lab)]
            check_removable(held, other.values[r], f"the feature counts of class {lab!r}")

    def _combine(self, other: FeatureCounts, sign: float) -> Self:
        self._check_type(other)
        rows = self.add_classes(other.labels)
        self._widen(other.n_features)
        if other.columns is not None:
            self._add(rows, other.columns, other.values, sign)
            return self
        self.densify()
        width = other.n_features
        block = self.values[:, :width]
        block[rows] += sign * other.values
        if sign < 0:
            np.maximum(block, 0.0, out=block)
        self.totals[rows] += sign * other.totals
        if sign < 0:
            np.maximum(self.totals, 0.0, out=self.totals)
        self.n_seen = int(np.count_nonzero(self.values.any(axis=0)))
        return self

    def merge(self, other: FeatureCounts) -> Self:
        return self._combine(other, 1.0)

    def subtract(self, other: FeatureCounts, clip: bool = False) -> Self:
        if not clip:
            self.check_subtractable(other)
        return self._combine(other, -1.0)

    def remove_class(self, label: Any) -> bool:
        """(The features seen, ``n_seen``, are counted again over the classes left.)"""
        row = self.index.remove(label)
        if row is None:
            return False
        self.values = np.delete(self.values, row, axis=0)
        self.totals = np.delete(self.totals, row)
        self.n_seen = int(np.count_nonzero(self.values.any(axis=0)))
        return True

    def scale(self, g: float) -> Self:
        g = check_scale_factor(g)
        self.values *= g
        self.totals *= g
        return self

    def copy(self) -> Self:
        out = type(self).__new__(type(self))
        out.index = self.index.copy()
        out.n_features = self.n_features
        out.columns = None if self.columns is None else self.columns.copy()
        out.values = self.values.copy()
        out.totals = self.totals.copy()
        out.n_seen = self.n_seen
        return out

    def is_empty(self) -> bool:
        return not self.values.any()

    # ------------------------------------------------------------- encoding
    def to_dict(self) -> dict[str, Any]:
        """Only columns with a nonzero count are written, whatever the storage."""
        if self.columns is None:
            cols = np.flatnonzero(self.values.any(axis=0)).astype(np.int64)
            vals = np.take(self.values, cols, axis=1)
        else:  # (np.take and np.compress keep rows C-ordered, unlike [:, cols])
            keep = self.values.any(axis=0)
            cols, vals = self.columns[keep], np.compress(keep, self.values, axis=1)
        return {
            "storage": "sparse" if self.is_sparse else "dense",
            "n_features": self.n_features,
            "labels": list(self.labels),
            "columns": pack_index(cols),
            "values": pack_counts(vals),
        }

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Self:
        storage, n_features, labels = body["storage"], body["n_features"], body["labels"]
        if storage not in ("dense", "sparse"):
            raise FormatError(f"feature_counts storage must be dense or sparse, got {storage!r}")
        if not isinstance(n_features, int) or n_features < 0:
            raise FormatError(f"feature_counts n_features must be an int >= 0, got {n_features!r}")
        if not isinstance(labels, list) or len(set(labels)) != len(labels):
            raise FormatError("feature_counts labels must be a list of distinct labels")
        cols = unpack_index(body["columns"], ndim=1)
        vals = unpack_counts(body["values"], ndim=2)
        if vals.shape != (len(labels), cols.size):
            raise FormatError(
                f"feature_counts values have shape {vals.shape}, expected {(len(labels), cols.size)}"
            )
        try:
            _check_columns(cols, n_features)
        except ValueError as exc:
            raise FormatError(f"feature_counts: {exc}") from None
        if not np.isfinite(vals).all() or (vals < 0).any():
            raise FormatError("feature_counts values must be finite and >= 0")
        out = cls.sparse(n_features, normalize_labels(labels), cols, vals)
        return out.densify() if storage == "dense" else out


def _check_width(n_features: Any) -> int:
    if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) or n_features < 0:
        raise ValueError(f"n_features must be an int >= 0, got {n_features!r}")
    return int(n_features)


def _check_columns(cols: np.ndarray, n_features: int) -> None:
    if cols.ndim != 1:
        raise ValueError(f"columns must be 1-d, got shape {cols.shape}")
    if cols.size and (cols[0] < 0 or cols[-1] >= n_features or (np.diff(cols) <= 0).any()):
        raise ValueError(f"columns must be strictly increasing indices in [0, {n_features})")


def _class_sums(
    X: Any, rows: np.ndarray, w: np.ndarray, n_classes: int, columns: BatchColumns | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Touched columns of X and the per-class weighted sums over them, ``(n_classes, t)``.

    Sparse X is compacted to its touched columns first, so nothing of size n_features
    is ever allocated (scipy's sparse product would allocate a work array that wide).
    ``columns``: X's :class:`BatchColumns`, if made before (C only).
    """
    n = X.shape[0]
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        if CLASS_SUMS is not None and X.data.dtype == np.float64 and n_classes > 0 and \
                columns is not None and columns.fits(X):
            sums = np.empty(n_classes * columns.cols.size)
            CLASS_SUMS(X.indptr, X.indices, X.data, np.ascontiguousarray(rows, dtype=np.int64),
                       np.ascontiguousarray(w, dtype=np.float64), n_classes, columns.cols, sums,
                       columns.rank)
            return columns.cols.copy(), sums.reshape(n_classes, columns.cols.size)
        if CLASS_SUMS is not None and X.data.dtype == np.float64 and n_classes > 0:
            # a hash table of the columns and a sort of the distinct ones only
            cols = np.empty(X.indices.size, dtype=np.int64)
            sums = np.empty(n_classes * X.indices.size)
            t = CLASS_SUMS(X.indptr, X.indices, X.data,
                           np.ascontiguousarray(rows, dtype=np.int64),
                           np.ascontiguousarray(w, dtype=np.float64), n_classes, cols, sums)
            return cols[:t].copy(), sums[:n_classes * t].reshape(n_classes, t).copy()
        # one sort of the nonzeros and one bincount over (class row, column position)
        cols, pos = unique_inverse(X.indices, X.shape[1])
        per_row = np.diff(X.indptr)
        cell = np.repeat(np.asarray(rows, dtype=np.int64) * cols.size, per_row) + pos.ravel()
        weighted = np.repeat(np.asarray(w, dtype=np.float64), per_row) * X.data
        sums = np.bincount(cell, weights=weighted, minlength=n_classes * cols.size)
        return cols, sums.reshape(n_classes, cols.size)
    onehot = sp.csr_matrix((w, (rows, np.arange(n))), shape=(n_classes, n))
    X = np.asarray(X, dtype=np.float64)
    cols = np.flatnonzero(X.any(axis=0)).astype(np.int64)
    sums = np.asarray(onehot @ X[:, cols], dtype=np.float64)
    return cols, sums.reshape(n_classes, cols.size)
