"""Per-class category counts ``N[c, j, v]``: the statistic behind categorical Naive Bayes.

Categories are non-negative integers (as in scikit-learn); the number of categories
``K_j`` of feature ``j`` grows as new ones appear (``K_j = largest category seen + 1``),
up to a limit: a category at or beyond ``max_categories`` is refused with a ValueError
before anything is allocated, so one value cannot cost memory in proportion to itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Self

import numpy as np

from streamnb.encoding import pack_array, unpack_array
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

#: Categories a categorical feature may take (values 0 .. limit - 1): one message's
#: category cannot make a model allocate more than this many columns per feature.
DEFAULT_MAX_CATEGORIES = 1024


def check_categories(X: np.ndarray, max_categories: int) -> None:
    """Raise ValueError if a value of ``X`` (n_samples, n_features) is at or beyond
    ``max_categories`` (checked on the values as given, before any conversion).

    >>> check_categories(np.array([[0.0, 3.0]]), 4)
    >>> check_categories(np.array([[0.0, 4.0]]), 4)
    Traceback (most recent call last):
    ...
    ValueError: category 4 of feature 1 is beyond the limit: categories are 0 .. 3 (max_categories=4)
    """
    if X.size == 0:
        return
    over = np.argwhere(X >= max_categories)
    if over.size:
        i, j = over[0]
        value = X[i, j]
        shown = int(value) if np.isfinite(value) and value == np.floor(value) else value
        raise ValueError(f"category {shown} of feature {j} is beyond the limit: categories "
                         f"are 0 .. {max_categories - 1} (max_categories={max_categories})")


class CategoryCounts(Statistic):
    """Weighted count of each category of each feature per class, aligned by label.

    ``counts[j]`` is the ``(n_classes, K_j)`` array of feature ``j``.

    >>> import numpy as np
    >>> X = np.array([[0, 2], [1, 0], [0, 0]])
    >>> n = CategoryCounts().update(X, ["a", "b", "a"])
    >>> n.n_categories.tolist()
    [2, 3]
    >>> [c.tolist() for c in n.counts]
    [[[2.0, 0.0], [0.0, 1.0]], [[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]]
    """

    TYPE = "category_counts"

    def __init__(
        self, n_features: int = 0, labels: Sequence[Label] = (), counts: Sequence[Any] | None = None
    ) -> None:
        self.index, order = ClassIndex.of(labels)
        if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) or n_features < 0:
            raise ValueError(f"n_features must be an int >= 0, got {n_features!r}")
        k = len(self.index)
        if counts is None:
            self.counts: list[np.ndarray] = [np.zeros((k, 0)) for _ in range(int(n_features))]
        else:
            self.counts = [np.array(c, dtype=np.float64, ndmin=2).reshape(k, -1) for c in counts]
            if len(self.counts) != n_features:
                raise ValueError(f"{len(self.counts)} count arrays for {n_features} features")
            if order is not None:
                self.counts = [c[order] for c in self.counts]

    # ------------------------------------------------------------------ access
    @property
    def labels(self) -> list[Label]:
        return self.index.labels

    @property
    def n_features(self) -> int:
        return len(self.counts)

    @property
    def n_categories(self) -> np.ndarray:
        """``K_j`` per feature."""
        return np.array([c.shape[1] for c in self.counts], dtype=np.int64)

    def __repr__(self) -> str:
        return (
            f"CategoryCounts(n_features={self.n_features}, classes={self.labels!r}, "
            f"n_categories={self.n_categories.tolist()})"
        )

    # ----------------------------------------------------------- structure
    def add_classes(self, labels: Iterable[Any]) -> np.ndarray:
        """Register labels (zero rows if new); return their rows."""
        rows, moved = self.index.rows_adding(labels)
        if moved is not None:
            self.counts = [spread_rows(c, moved, len(self.index)) for c in self.counts]
        return rows

    def _widen(self, n_features: int, n_categories: Sequence[int]) -> None:
        k = len(self.index)
        self.counts.extend(np.zeros((k, 0)) for _ in range(n_features - self.n_features))
        for j, want in enumerate(n_categories):
            have = self.counts[j].shape[1]
            if want > have:
                self.counts[j] = np.hstack([self.counts[j], np.zeros((k, want - have))])

    # -------------------------------------------------------------- update
    def update(self, X: Any, labels: Iterable[Any], weights: Any = None,
               max_categories: int = DEFAULT_MAX_CATEGORIES) -> Self:
        """Count a batch of integer categories ``X`` (n_samples, n_features) per class;
        every category must be below ``max_categories``.

        >>> CategoryCounts().update(np.array([[0, 5000]]), ["a"])
        Traceback (most recent call last):
        ...
        ValueError: category 5000 of feature 1 is beyond the limit: categories are 0 .. 1023 (max_categories=1024)
        """
        X = np.asarray(X)
        labels = normalize_labels(labels)
        if X.ndim != 2 or len(labels) != X.shape[0]:
            raise ValueError(f"expected X (n_samples, n_features) and one label per row, got {X.shape}")
        if self.n_features and X.shape[1] != self.n_features:
            raise ValueError(f"X has {X.shape[1]} features, but these counts have {self.n_features}")
        check_categories(X, max_categories)
        Xi = X.astype(np.int64)
        if X.size and ((Xi != X).any() or (Xi < 0).any()):
            raise ValueError("categories must be non-negative integers")
        w = np.ones(X.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
        rows = self.add_classes(labels)
        k = len(self.index)
        wanted = (Xi.max(axis=0) + 1).tolist() if X.shape[0] else [0] * X.shape[1]
        self._widen(X.shape[1], wanted)
        for j, c in enumerate(self.counts):
            K = c.shape[1]
            c += np.bincount(rows * K + Xi[:, j], weights=w, minlength=k * K).reshape(k, K)
        return self

    # --------------------------------------------------------- combination
    def check_mergeable(self, other: Any) -> None:
        """(The number of features of a model's counts is fixed once it is not 0.)"""
        self._check_type(other)
        if self.n_features and other.n_features != self.n_features:
            raise FormatError(f"category_counts of {other.n_features} features do not fit "
                              f"{self.n_features}")
        check_finite("category_counts", *other.counts)

    def check_subtractable(self, other: CategoryCounts) -> None:
        self._check_type(other)
        for j, theirs in enumerate(other.counts):
            held = np.zeros(theirs.shape)
            if j < self.n_features:
                mine = self.counts[j][:, : theirs.shape[1]]
                for r, lab in enumerate(other.labels):
                    if lab in self.index:
                        held[r, : mine.shape[1]] = mine[self.index.row(lab)]
            check_removable(held, theirs, f"the category counts of feature {j}")

    def _combine(self, other: CategoryCounts, sign: float) -> Self:
        self._check_type(other)
        rows = self.add_classes(other.labels)
        self._widen(other.n_features, other.n_categories.tolist())
        for mine, theirs in zip(self.counts, other.counts, strict=False):
            block = mine[:, : theirs.shape[1]]
            block[rows] += sign * theirs
            if sign < 0:
                np.maximum(block, 0.0, out=block)
        return self

    def merge(self, other: CategoryCounts) -> Self:
        return self._combine(other, 1.0)

    def subtract(self, other: CategoryCounts, clip: bool = False) -> Self:
        """Remove ``other``; K_j shrinks to the largest category still holding weight + 1."""
        if not clip:
            self.check_subtractable(other)
        self._combine(other, -1.0)
        for j, c in enumerate(self.counts):
            held = np.flatnonzero(c.any(axis=0))
            k_j = int(held[-1]) + 1 if held.size else 0
            if k_j < c.shape[1]:
                self.counts[j] = c[:, :k_j].copy()
        return self

    def remove_class(self, label: Any) -> bool:
        """(A feature's categories end, as for data never learnt, at its highest category
        with a count left in some class: categories seen only in the class go with it.)"""
        row = self.index.remove(label)
        if row is None:
            return False
        kept = []
        for c in self.counts:
            c = np.delete(c, row, axis=0)
            used = np.flatnonzero(c.any(axis=0))
            kept.append(np.ascontiguousarray(c[:, : used[-1] + 1 if used.size else 0]))
        self.counts = kept
        return True

    def scale(self, g: float) -> Self:
        g = check_scale_factor(g)
        for c in self.counts:
            c *= g
        return self

    def copy(self) -> Self:
        return type(self)(self.n_features, self.labels, [c.copy() for c in self.counts])

    def is_empty(self) -> bool:
        return not any(c.any() for c in self.counts)

    # ------------------------------------------------------------ encoding
    def to_dict(self) -> dict[str, Any]:
        k = len(self.index)
        flat = np.hstack(self.counts) if self.counts else np.zeros((k, 0))
        return {
            "labels": list(self.labels),
            "n_categories": pack_array(self.n_categories),
            "values": pack_array(flat.reshape(k, flat.size // k if k else 0)),
        }

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Self:
        labels = body["labels"]
        if not isinstance(labels, list) or len(set(labels)) != len(labels):
            raise FormatError("category_counts labels must be a list of distinct labels")
        n_cat = unpack_array(body["n_categories"], dtype="<i8", ndim=1)
        flat = unpack_array(body["values"], dtype="<f8", ndim=2)
        if (n_cat < 0).any() or flat.shape != (len(labels), int(n_cat.sum())):
            raise FormatError(
                f"category_counts values have shape {flat.shape}, expected "
                f"{(len(labels), int(n_cat.clip(0).sum()))}"
            )
        if not np.isfinite(flat).all() or (flat < 0).any():
            raise FormatError("category_counts values must be finite and >= 0")
        counts = np.split(flat, np.cumsum(n_cat)[:-1], axis=1) if n_cat.size else []
        return cls(int(n_cat.size), normalize_labels(labels), counts)
