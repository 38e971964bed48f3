"""Weighted class counts: the statistic behind the class priors."""

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


class ClassCounts(Statistic):
    """Weighted number of samples per class, in sorted label order, aligned by label
    when merged.

    >>> a = ClassCounts().update(["spam", "ham", "ham"])
    >>> b = ClassCounts().update(["eggs", "spam"], weights=[2.0, 1.0])
    >>> a.merge(b)
    ClassCounts(eggs=2.0, ham=2.0, spam=2.0)
    >>> a.subtract(b).total
    3.0
    >>> a.subtract(b)
    Traceback (most recent call last):
    ValueError: cannot unlearn the weight of class 'eggs': 2 to remove where 0 was learnt (data that was never learnt?); nothing changed
    """

    TYPE = "class_counts"

    def __init__(self, labels: Sequence[Label] = (), counts: Any = None) -> None:
        """``counts`` in the order of ``labels`` (which may be in any order)."""
        self.index, order = ClassIndex.of(labels)
        n = len(self.index)
        self.counts = (
            np.zeros(n, dtype=np.float64) if counts is None else np.array(counts, dtype=np.float64)
        )
        if self.counts.shape != (n,):
            raise ValueError(f"{n} labels but {self.counts.shape} counts")
        if order is not None:
            self.counts = self.counts[order]

    # -- access
    @property
    def labels(self) -> list[Label]:
        return self.index.labels

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    def __repr__(self) -> str:
        body = ", ".join(f"{lab}={c!r}" for lab, c in zip(self.labels, self.counts.tolist(), strict=True))
        return f"ClassCounts({body})"

    def as_dict(self) -> dict[Label, float]:
        return dict(zip(self.labels, self.counts.tolist(), strict=True))

    # -- updates
    def add_classes(self, labels: Iterable[Any]) -> np.ndarray:
        """Register labels (zero weight if new); return their rows."""
        rows, moved = self.index.rows_adding(labels)
        if moved is not None:
            self.counts = spread_rows(self.counts, moved, len(self.index))
        return rows

    def update(self, labels: Iterable[Any], weights: Any = None) -> Self:
        """Count a batch of labels (with optional per-sample weights)."""
        labels = normalize_labels(labels)
        rows = self.add_classes(labels)
        w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=np.float64)
        np.add.at(self.counts, rows, w)
        return self

    def check_mergeable(self, other: Any) -> None:
        self._check_type(other)
        check_finite("class_counts", other.counts)

    def held(self, labels: Sequence[Label]) -> np.ndarray:
        """The weight of each of ``labels`` (0 for a label not known)."""
        return np.array([self.counts[self.index.row(lab)] if lab in self.index else 0.0
                         for lab in labels], dtype=np.float64)

    def check_subtractable(self, other: ClassCounts) -> None:
        self._check_type(other)
        held = self.held(other.labels)
        for lab, h, r in zip(other.labels, held, other.counts, strict=True):
            check_removable(np.array([h]), np.array([r]), f"the weight of class {lab!r}")

    def merge(self, other: ClassCounts) -> Self:
        self._check_type(other)
        rows = self.add_classes(other.labels)
        self.counts[rows] += other.counts
        return self

    def subtract(self, other: ClassCounts, clip: bool = False) -> Self:
        if not clip:
            self.check_subtractable(other)
        self._check_type(other)
        rows = self.add_classes(other.labels)
        self.counts[rows] -= other.counts
        # Unlearning exactly what was learnt gives 0 up to rounding; never leave -1e-17.
        np.maximum(self.counts, 0.0, out=self.counts)
        return self

    def remove_class(self, label: Any) -> bool:
        row = self.index.remove(label)
        if row is None:
            return False
        self.counts = np.delete(self.counts, row)
        return True

    def scale(self, g: float) -> Self:
        self.counts *= check_scale_factor(g)
        return self

    def copy(self) -> Self:
        return type(self)(self.labels, self.counts.copy())

    def is_empty(self) -> bool:
        return not self.counts.any()

    # -- encoding
    def to_dict(self) -> dict[str, Any]:
        return {"labels": list(self.labels), "counts": pack_array(self.counts)}

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Self:
        labels = body["labels"]
        if not isinstance(labels, list):
            raise FormatError("class_counts labels must be a list")
        counts = unpack_array(body["counts"], dtype="<f8", ndim=1)
        if counts.shape[0] != len(labels) or len(set(labels)) != len(labels):
            raise FormatError("class_counts: labels and counts do not match")
        return cls(normalize_labels(labels), counts)
