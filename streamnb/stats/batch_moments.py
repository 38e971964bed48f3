"""The Gaussian moments of one batch, per class (what ``GaussianMoments`` merges), and
the checks of a batch.

For each class c of the batch, with samples x_i and weights w_i::

    n_c    = sum_i w_i                                  (summed in sample order)
    mean_c = sum_i w_i x_i / n_c
    M2_c   = sum_i w_i (x_i - mean_c)(x_i - mean_c)^T  (the diagonal only if diagonal)

The samples are grouped by class with one stable sort (a class's samples keep their
order), and each class's sums (``np.add.reduceat``) and M2 come from its own block
alone: they do not depend on the other classes of the batch (a model that removes a class equals, to the last bit,
one that never saw it). A class's weight is summed in sample order, as
:class:`~streamnb.stats.class_counts.ClassCounts` sums it.

>>> labels, n, mean, m2 = batch_moments(np.array([[1.0], [3.0], [5.0]]), ["b", "a", "b"],
...                                     np.ones(3), diagonal=True)
>>> labels, n.tolist(), mean.tolist(), m2.tolist()
(['a', 'b'], [1.0, 2.0], [[3.0], [3.0]], [[0.0], [8.0]])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from streamnb.stats.base import Label, normalize_labels


def batch_moments(
    X: np.ndarray, labels: list[Label], w: np.ndarray, diagonal: bool
) -> tuple[list[Label], np.ndarray, np.ndarray, np.ndarray]:
    """``(classes sorted, n, mean, M2)`` of a checked batch: X a finite float64 2-d
    array, ``labels`` normalised (all str or all int), one per row, ``w`` finite float64
    weights >= 0; a class whose weight is 0 has mean 0 and M2 0."""
    distinct = sorted(set(labels))  # type: ignore[type-var]
    k, d = len(distinct), X.shape[1]
    if k > 1:
        code = {lab: i for i, lab in enumerate(distinct)}
        codes = np.fromiter(map(code.__getitem__, labels), dtype=np.intp, count=len(labels))
    else:
        codes = np.zeros(len(labels), dtype=np.intp)
    n = np.bincount(codes, weights=w, minlength=k)
    if k > 1:
        order = np.argsort(codes, kind="stable")
        X, w = X[order], w[order]
        sizes = np.bincount(codes, minlength=k)
    else:
        X, sizes = np.ascontiguousarray(X), np.array([len(labels)])
    starts = np.concatenate(([0], np.cumsum(sizes[:-1])))
    unit = not (w != 1.0).any()  # (x * 1.0 is x: the products are left out)
    Xw = X if unit else X * w[:, None]
    # Each block summed row after row: a class's sums see its own samples alone.
    mean = np.add.reduceat(Xw, starts, axis=0) / np.where(n > 0, n, 1.0)[:, None]
    dev = X - np.repeat(mean, sizes, axis=0)
    if diagonal:
        sq = dev * dev if unit else dev * dev * w[:, None]
        return distinct, n, mean, np.add.reduceat(sq, starts, axis=0)
    m2 = np.zeros((k, d, d))
    for j, (a, b) in enumerate(zip(starts.tolist(), (starts + sizes).tolist(), strict=True)):
        dj = dev[a:b]
        np.matmul((dj if unit else dj * w[a:b, None]).T, dj, out=m2[j])
    return distinct, n, mean, m2


def check_batch(X: Any, labels: Iterable[Any], weights: Any, n_features: int | None) -> tuple:
    """``(X, labels, weights)`` of a batch for ``GaussianMoments``, checked: X a finite
    float64 2-d array (of ``n_features`` columns unless None), one normalised label and
    one finite weight >= 0 (default 1) per row; ValueError otherwise."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-d (n_samples, n_features), got shape {X.shape}")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"X has {X.shape[1]} features, but these moments have {n_features}")
    if X.shape[1] == 0:
        raise ValueError("X has 0 features, expected at least 1")
    if not np.isfinite(X).all():
        raise ValueError("X contains NaN or infinity")
    labels = normalize_labels(labels)
    if len(labels) != X.shape[0]:
        raise ValueError(f"{len(labels)} labels for {X.shape[0]} samples")
    w = np.ones(X.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    if w.shape != (X.shape[0],):
        raise ValueError(f"{w.size} weights for {X.shape[0]} samples")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights must be finite and >= 0")
    return X, labels, w
