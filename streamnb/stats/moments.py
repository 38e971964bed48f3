"""Per-class Gaussian moments: weighted n, mean and co-moment M2, mergeable exactly.

For class c with samples x_i and weights w_i::

    n_c    = sum_i w_i
    mean_c = sum_i w_i x_i / n_c
    M2_c   = sum_i w_i (x_i - mean_c)(x_i - mean_c)^T     (the diagonal only if diagonal=True)

Two summaries a and b of disjoint data combine by Chan et al.'s parallel formula::

    n    = n_a + n_b
    mean = mean_a + (mean_b - mean_a) n_b / n
    M2   = M2_a + M2_b + (n_a n_b / n) (mean_b - mean_a)(mean_b - mean_a)^T

and ``subtract`` solves the same equations for a. A single sample is added with Welford's
recurrence (``update_one``). Rows with n = 0 hold exactly mean 0 and M2 0, so merging or
subtracting the empty statistic is the identity, and nothing divides by n when n is 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Self

import numpy as np

from streamnb.encoding import pack_array, unpack_array
from streamnb.exceptions import FormatError
from streamnb.stats.base import (
    UNLEARN_RTOL,
    ClassIndex,
    Label,
    Statistic,
    check_finite,
    check_removable,
    check_scale_factor,
    normalize_label,
    spread_rows,
)
from streamnb.stats.batch_moments import batch_moments, check_batch

#: A class whose weight falls below this fraction of what it held before an unlearn
#: (``GaussianMoments.subtract``) is reset to exactly empty (n = 0, mean 0, M2 0).
MOMENTS_EMPTY_RTOL = 1e-10


class GaussianMoments(Statistic):
    """Weighted n, mean and M2 per class, rows aligned by label (see the module docstring).

    ``n_features`` may be left ``None``; the first batch fixes it. ``diagonal=True`` keeps
    only the per-feature M2 (Gaussian naive Bayes); ``diagonal=False`` keeps the full
    d x d co-moment (LDA, QDA).

    >>> import numpy as np
    >>> X = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, 4.0], [7.0, 7.0]])
    >>> a = GaussianMoments(diagonal=False).update(X[:2], ["u", "u"])
    >>> b = GaussianMoments(diagonal=False).update(X[2:], ["u", "u"])
    >>> a.merge(b).mean.tolist()
    [[4.0, 4.75]]
    >>> bool(np.allclose(a.m2[0], np.cov(X.T, bias=True) * 4))
    True
    >>> a.subtract(b).mean.tolist()
    [[2.0, 4.0]]
    """

    TYPE = "gaussian_moments"

    def __init__(
        self,
        n_features: int | None = None,
        diagonal: bool = True,
        labels: Sequence[Label] = (),
        n: Any = None,
        mean: Any = None,
        m2: Any = None,
    ) -> None:
        if n_features is not None and (
            not isinstance(n_features, (int, np.integer)) or n_features < 1
        ):
            raise ValueError(f"n_features must be a positive int or None, got {n_features!r}")
        self.n_features: int | None = None if n_features is None else int(n_features)
        self.diagonal = bool(diagonal)
        self.index, order = ClassIndex.of(labels)
        k, d = len(self.index), self._d
        self.n = np.zeros(k) if n is None else np.array(n, dtype=np.float64)
        self.mean = np.zeros((k, d)) if mean is None else np.array(mean, dtype=np.float64)
        self.m2 = np.zeros(self._m2_shape(k)) if m2 is None else np.array(m2, dtype=np.float64)
        if self.n.shape != (k,) or self.mean.shape != (k, d) or self.m2.shape != self._m2_shape(k):
            raise ValueError(
                f"{k} labels and {d} features need n {(k,)}, mean {(k, d)}, M2 "
                f"{self._m2_shape(k)}; got {self.n.shape}, {self.mean.shape}, {self.m2.shape}"
            )
        if order is not None:
            self.n, self.mean, self.m2 = self.n[order], self.mean[order], self.m2[order]

    # ------------------------------------------------------------------ access
    @property
    def _d(self) -> int:
        return 0 if self.n_features is None else self.n_features

    def _m2_shape(self, k: int) -> tuple[int, ...]:
        return (k, self._d) if self.diagonal else (k, self._d, self._d)

    @property
    def labels(self) -> list[Label]:
        return self.index.labels

    def __repr__(self) -> str:
        n = ", ".join(f"{lab}={c!r}" for lab, c in zip(self.labels, self.n.tolist(), strict=True))
        return f"GaussianMoments(d={self.n_features}, diagonal={self.diagonal}, n=({n}))"

    def touched_labels(self) -> list[Label]:
        """Labels of the classes this statistic holds data for (what a delta changes)."""
        return [self.labels[r] for r in np.flatnonzero(self.n != 0.0)]

    def covariances(self, ddof: float = 0.0) -> np.ndarray:
        """Per-class ``M2 / (n - ddof)``; zero for classes with ``n <= ddof``.

        >>> m = GaussianMoments().update([[0.0], [2.0], [5.0]], ["a", "a", "b"])
        >>> m.covariances().tolist(), m.covariances(ddof=1).tolist()
        ([[1.0], [0.0]], [[2.0], [0.0]])
        """
        denom = self.n - ddof
        ok = denom > 0
        out = np.zeros_like(self.m2)
        out[ok] = self.m2[ok] / denom[ok].reshape((-1,) + (1,) * (self.m2.ndim - 1))
        return out

    def pooled(self) -> tuple[float, np.ndarray, np.ndarray]:
        """``(n, mean, M2)`` of all classes taken together (Chan's merge of the rows).

        >>> m = GaussianMoments().update([[0.0], [2.0], [4.0], [6.0]], ["a", "a", "b", "b"])
        >>> n, mean, m2 = m.pooled()
        >>> n, mean.tolist(), (m2 / n).tolist()       # np.var([0, 2, 4, 6]) == 5
        (4.0, [3.0], [5.0])
        """
        total = float(self.n.sum())
        d = self._d
        if total <= 0.0:
            return 0.0, np.zeros(d), np.zeros(d if self.diagonal else (d, d))
        mean = (self.n @ self.mean) / total
        dev = self.mean - mean
        if self.diagonal:
            m2 = self.m2.sum(axis=0) + self.n @ (dev * dev)
        else:
            m2 = self.m2.sum(axis=0) + (dev * self.n[:, None]).T @ dev
        return total, mean, m2

    # ----------------------------------------------------------------- updates
    def add_classes(self, labels: Iterable[Any]) -> np.ndarray:
        """Register labels (empty rows if new); return their rows."""
        rows, moved = self.index.rows_adding(labels)
        if moved is not None:
            k = len(self.index)
            self.n = spread_rows(self.n, moved, k)
            self.mean = spread_rows(self.mean, moved, k)
            self.m2 = spread_rows(self.m2, moved, k)
        return rows

    def _set_n_features(self, d: int) -> None:
        if self.n_features is None:
            self.n_features = d
            k = len(self.index)
            self.mean = np.zeros((k, d))
            self.m2 = np.zeros(self._m2_shape(k))
        elif d != self.n_features:
            raise ValueError(f"X has {d} features, but these moments have {self.n_features}")

    def _check_batch(self, X: Any, labels: Iterable[Any], weights: Any) -> tuple:
        return check_batch(X, labels, weights, self.n_features)

    def update(self, X: Any, labels: Iterable[Any], weights: Any = None) -> Self:
        """Add a batch: per-class weighted mean and M2 with numpy, then Chan's merge."""
        X, labels, w = self._check_batch(X, labels, weights)
        if labels:
            self.add_checked(X, labels, w)
        return self

    def add_checked(self, X: np.ndarray, labels: list[Label], w: np.ndarray) -> None:
        """:meth:`update` of a batch already checked (see
        :func:`~streamnb.stats.batch_moments.batch_moments`): what a model calls after its
        own input checks."""
        self._set_n_features(X.shape[1])
        distinct, nb, mb, m2b = batch_moments(X, labels, w, self.diagonal)
        if len(self.index):
            self._merge_rows(self.add_classes(distinct), nb, mb, m2b)
        else:  # a new statistic (a batch's own): the batch's moments are its rows
            self.index, self.n, self.mean, self.m2 = ClassIndex(distinct), nb, mb, m2b

    def update_one(self, x: Any, label: Any, weight: float = 1.0) -> Self:
        """Add one sample by Welford's recurrence (same result as ``update`` of one row)."""
        X, labels, w = self._check_batch(
            np.asarray(x, dtype=np.float64).reshape(1, -1), [label], [weight]
        )
        self._set_n_features(X.shape[1])
        r = self.add_classes(labels)[0]
        wt, x1 = float(w[0]), X[0]
        n_new = self.n[r] + wt
        if wt <= 0.0:
            return self
        delta = x1 - self.mean[r]
        self.mean[r] += delta * (wt / n_new)
        # Welford: M2 += w (x - mean_old)(x - mean_new)^T, and x - mean_new = delta n_old / n_new.
        factor = wt * self.n[r] / n_new
        self.m2[r] += factor * (delta * delta if self.diagonal else np.outer(delta, delta))
        self.n[r] = n_new
        return self

    def _outer(self, delta: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """Row-wise ``scale delta delta^T`` (or its diagonal)."""
        scaled = delta * scale[:, None]
        return scaled * delta if self.diagonal else scaled[:, :, None] * delta[:, None, :]

    def _merge_rows(
        self, rows: np.ndarray, nb: np.ndarray, mb: np.ndarray, m2b: np.ndarray
    ) -> None:
        """Chan's formula on distinct ascending ``rows`` (empty rows on either side are
        exact identities); in place when they are every row."""
        na = self.n[rows]
        if not na.any():  # every row empty: Chan's formula gives (nb, mb, m2b) exactly
            self.n[rows], self.mean[rows], self.m2[rows] = nb, mb, m2b
            return
        whole = len(rows) == len(self.n)  # (then rows is 0, 1, ..., k - 1)
        ma = self.mean if whole else self.mean[rows]
        n = na + nb
        safe = np.where(n > 0, n, 1.0)
        delta = mb - ma
        step, outer = delta * (nb / safe)[:, None], self._outer(delta, na * nb / safe)
        if whole:  # the same sums, without gathering and scattering the rows
            self.mean += step
            self.m2 += m2b
            self.m2 += outer
            mean, m2 = self.mean, self.m2
        else:
            mean, m2 = ma + step, self.m2[rows] + m2b + outer
        empty = n <= 0
        if empty.any():
            mean[empty] = 0.0
            m2[empty] = 0.0
        if whole:
            self.n[:] = n
        else:
            self.n[rows], self.mean[rows], self.m2[rows] = n, mean, m2

    def check_mergeable(self, other: Any) -> None:
        """(The number of features of a model's moments is fixed once it is not None.)"""
        self._check_type(other)
        if other.diagonal != self.diagonal:
            raise FormatError(
                f"cannot combine diagonal={self.diagonal} moments with diagonal={other.diagonal}"
            )
        if self.n_features is not None and other.n_features != self.n_features:
            raise FormatError(
                f"gaussian_moments of {other.n_features} features do not fit {self.n_features}"
            )
        check_finite("gaussian_moments", other.n)
        check_finite("gaussian_moments", other.mean, other.m2, nonnegative=False)

    def _check_combinable(self, other: GaussianMoments) -> None:
        if not isinstance(other, GaussianMoments):
            raise ValueError(f"cannot combine GaussianMoments with {type(other).__name__}")
        if other.diagonal != self.diagonal:
            raise ValueError(
                f"cannot combine diagonal={self.diagonal} moments with diagonal={other.diagonal}"
            )
        if other.n_features is not None:
            if self.n_features is not None and self.n_features != other.n_features:
                raise ValueError(
                    f"cannot combine moments of {self.n_features} features with {other.n_features}"
                )

    def _aligned(self, other: GaussianMoments) -> np.ndarray:
        self._check_combinable(other)
        if other.n_features is not None:
            self._set_n_features(other.n_features)
        return self.add_classes(other.labels)

    def merge(self, other: GaussianMoments) -> Self:
        rows = self._aligned(other)
        if other.n_features is None:  # no data: only labels to register
            return self
        self._merge_rows(rows, other.n, other.mean, other.m2)
        return self

    def _remainder(
        self, rows: np.ndarray, nb: np.ndarray, mb: np.ndarray, m2b: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What rows ``rows`` keep once ``(nb, mb, m2b)`` is removed, by Chan's formula
        solved for the remainder: ``(n, mean, M2 before clamping, emptied)``."""
        n, mean = self.n[rows], self.mean[rows]
        na = n - nb
        empty = na <= MOMENTS_EMPTY_RTOL * n
        safe_na = np.where(empty, 1.0, na)
        ma = mean + (mean - mb) * (nb / safe_na)[:, None]
        delta = mb - ma
        m2 = self.m2[rows] - m2b - self._outer(delta, na * nb / np.where(n > 0, n, 1.0))
        return na, ma, m2, empty

    def _diag(self, m2: np.ndarray) -> np.ndarray:
        return m2 if self.diagonal else np.einsum("kii->ki", m2)

    def check_subtractable(self, other: GaussianMoments) -> None:
        """ValueError if ``other`` cannot have been learnt: more weight than a class holds,
        a variance that would go negative, or a class emptied by other data than it
        holds (each beyond rounding)."""
        self._check_combinable(other)
        has = other.n > 0
        labels = [lab for lab, h in zip(other.labels, has, strict=True) if h]
        held = np.array(
            [self.n[self.index.row(lab)] if lab in self.index else 0.0 for lab in labels]
        )
        for lab, h, r in zip(labels, held, other.n[has], strict=True):
            check_removable(np.array([h]), np.array([r]), f"the weight of class {lab!r}")
        if not labels:
            return
        rows = self.index.rows_for(labels)
        mb, m2b = other.mean[has], other.m2[has]
        na, ma, m2, empty = self._remainder(rows, other.n[has], mb, m2b)
        n, mean, m2_held = self.n[rows], self.mean[rows], self.m2[rows]
        # What rounding may leave: a share of each feature's weighted sum of squares.
        tol = UNLEARN_RTOL * (self._diag(m2_held) + n[:, None] * mean * mean) + 1e-300
        wrong = ~empty[:, None] & (self._diag(m2) < -tol)
        emptied = empty[:, None] & (
            (n[:, None] * (mb - mean) ** 2 > tol)
            | (np.abs(self._diag(m2b) - self._diag(m2_held)) > tol)
        )
        bad = (wrong | emptied).any(axis=1)
        if bad.any():
            lab = labels[int(np.flatnonzero(bad)[0])]
            raise ValueError(
                f"cannot unlearn this data from class {lab!r}: its moments do not hold it "
                f"(data that was never learnt?); nothing changed"
            )

    def subtract(self, other: GaussianMoments, clip: bool = False) -> Self:
        """Remove ``other``'s data: Chan's formula solved for the remainder.

        A class left with (almost) no weight becomes exactly empty. Data that cannot have
        been learnt raises ValueError and leaves the moments unchanged; with ``clip``,
        unchecked, a class asked to give up more than it holds becomes empty and a
        negative variance is clamped to 0.
        """
        if not clip:
            self.check_subtractable(other)
        rows = self._aligned(other)
        if other.n_features is None:
            return self
        has = other.n > 0
        rows, nb, mb, m2b = rows[has], other.n[has], other.mean[has], other.m2[has]
        na, ma, m2, empty = self._remainder(rows, nb, mb, m2b)
        if self.diagonal:
            np.maximum(m2, 0.0, out=m2)
        else:
            m2 = 0.5 * (m2 + m2.transpose(0, 2, 1))
            diag = np.einsum("kii->ki", m2)
            diag[...] = np.maximum(diag, 0.0)
        na[empty] = 0.0
        ma[empty] = 0.0
        m2[empty] = 0.0
        self.n[rows], self.mean[rows], self.m2[rows] = na, ma, m2
        return self

    def remove_class(self, label: Any) -> bool:
        """(What is pooled over classes, :meth:`pooled`, is merged from the rows left.)"""
        row = self.index.remove(label)
        if row is None:
            return False
        self.n = np.delete(self.n, row)
        self.mean = np.delete(self.mean, row, axis=0)
        self.m2 = np.delete(self.m2, row, axis=0)
        return True

    def scale(self, g: float) -> Self:
        g = check_scale_factor(g)
        self.n *= g
        self.m2 *= g
        gone = self.n == 0.0  # weight decayed below the smallest float: the class is empty
        if gone.any():
            self.mean[gone] = 0.0
            self.m2[gone] = 0.0
        return self

    def copy(self) -> Self:
        return type(self)(
            self.n_features,
            self.diagonal,
            self.labels,
            self.n.copy(),
            self.mean.copy(),
            self.m2.copy(),
        )

    def is_empty(self) -> bool:
        return not self.n.any()

    # ---------------------------------------------------------------- encoding
    def to_dict(self) -> dict[str, Any]:
        return {
            "labels": list(self.labels),
            "n_features": self.n_features,
            "diagonal": self.diagonal,
            "n": pack_array(self.n),
            "mean": pack_array(self.mean),
            "m2": pack_array(self.m2),
        }

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Self:
        labels, d, diagonal = body["labels"], body["n_features"], body["diagonal"]
        if not isinstance(labels, list) or len(set(labels)) != len(labels):
            raise FormatError("gaussian_moments labels must be a list of distinct labels")
        if not isinstance(diagonal, bool):
            raise FormatError(f"gaussian_moments diagonal must be a bool, got {diagonal!r}")
        if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < 1):
            raise FormatError(f"gaussian_moments n_features must be a positive int, got {d!r}")
        labels = [normalize_label(lab) for lab in labels]
        n = unpack_array(body["n"], dtype="<f8", ndim=1)
        mean = unpack_array(body["mean"], dtype="<f8", ndim=2)
        m2 = unpack_array(body["m2"], dtype="<f8", ndim=2 if diagonal else 3)
        k, dd = len(labels), 0 if d is None else d
        want = (k, dd) if diagonal else (k, dd, dd)
        if n.shape != (k,) or mean.shape != (k, dd) or m2.shape != want:
            raise FormatError(
                f"gaussian_moments shapes do not match {k} labels and {dd} features: "
                f"n {n.shape}, mean {mean.shape}, M2 {m2.shape} (expected M2 {want})"
            )
        if not (np.isfinite(n).all() and np.isfinite(mean).all() and np.isfinite(m2).all()):
            raise FormatError("gaussian_moments holds NaN or infinity")
        if (n < 0).any():
            raise FormatError("gaussian_moments holds a negative class weight")
        empty = n == 0
        if mean[empty].any() or m2[empty].any():
            raise FormatError("gaussian_moments: a class with n = 0 must have mean 0 and M2 0")
        if d is None and n.any():
            raise FormatError("gaussian_moments: data without a number of features")
        return cls(d, diagonal, labels, n, mean, m2)
