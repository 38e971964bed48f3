"""Explanations: a message's log-odds split into a bias and one term per feature.

For a naive Bayes model the log-odds of class ``b`` against class ``a`` is a sum:
``log P(b, x) - log P(a, x) = bias + sum_j term_j(x_j)``, one term per feature of the
message (the features it lacks are folded into the bias). :class:`Explanation` keeps the
``k`` terms that move the log-odds most, and the sum of all the others in ``other``, so
``bias + contributions.sum() + other`` is the model's decision function for the message.

>>> import numpy as np
>>> e = top_terms(0.5, np.array([3, 7, 9]), np.array([0.25, -2.0, 1.0]), 2, ("ham", "spam"))
>>> e.features.tolist(), e.contributions.tolist(), e.other, e.log_odds
([7, 9], [-2.0, 1.0], 0.25, -0.25)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from streamnb.models.validation import check_labels

__all__ = ["Explanation", "class_pair", "top_terms"]


@dataclass(frozen=True)
class Explanation:
    """Why a model gave a message its log-odds.

    Attributes
    ----------
    classes : tuple
        ``(negative, positive)``: the log-odds are those of ``positive`` against
        ``negative``.
    bias : float
        The part that does not depend on which features the message holds: the log prior
        ratio, plus for BernoulliNB every feature's absent term, plus for the count models
        with ``smoothing_m="columns"`` nothing else.
    features : numpy.ndarray
        Column indices of the (at most ``k``) features whose terms are largest in absolute
        value, largest first (int64).
    contributions : numpy.ndarray
        Their signed terms (float64): positive favours ``positive``.
    other : float
        The sum of the terms of the message's other features.
    """

    classes: tuple[Any, Any]
    bias: float
    features: np.ndarray
    contributions: np.ndarray
    other: float

    @property
    def log_odds(self) -> float:
        """``bias + contributions.sum() + other``: the decision function's value."""
        return float(self.bias + self.contributions.sum() + self.other)

    def as_pairs(self) -> list[tuple[int, float]]:
        """``[(feature, contribution), ...]``, largest first (plain Python numbers)."""
        return list(zip(self.features.tolist(), self.contributions.tolist(), strict=True))


def top_terms(bias: float, features: np.ndarray, terms: np.ndarray, k: int,
              classes: tuple[Any, Any]) -> Explanation:
    """The :class:`Explanation` of one message from all its terms.

    Parameters
    ----------
    bias : float
        The message-independent part of the log-odds.
    features, terms : numpy.ndarray
        The message's feature columns and their terms (same length; a column appears once).
    k : int
        How many terms to keep (>= 0); terms of exactly 0 are never kept.
    classes : tuple
        ``(negative, positive)``.

    Returns
    -------
    Explanation
        Ties in absolute value are broken by the lower column first.
    """
    features = np.asarray(features, dtype=np.int64)
    terms = np.asarray(terms, dtype=np.float64)
    magnitude = np.abs(terms)
    n = magnitude.size
    kth = np.partition(magnitude, n - k)[n - k] if 0 < k < n else 0.0
    # only the terms at least as large as the k-th are sorted (never a zero term)
    candidates = np.flatnonzero(magnitude >= kth) if kth > 0 else np.flatnonzero(magnitude)
    top = candidates[np.lexsort((features[candidates], -magnitude[candidates]))][:k]
    other = 0.0
    if top.size < np.count_nonzero(magnitude):  # summed apart, not as total - kept: a
        rest = np.ones(n, dtype=bool)  # large kept term would cancel the rest's digits
        rest[top] = False
        other = float(terms[rest].sum())
    return Explanation(classes, float(bias), features[top], terms[top], other)


def check_k(k: Any) -> int:
    """``k`` as an int >= 0 (ValueError otherwise)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    return int(k)


def class_pair(labels: list, weights: np.ndarray, classes: Any,
               model: str) -> tuple[int, int, tuple[Any, Any]]:
    """The rows (in ``labels``, a model's classes) of the negative and positive class whose
    log-odds are explained, and the pair as labels: ``classes`` as given, or the model's
    two classes; a class without weight has infinite log-odds and is refused.

    >>> class_pair(["ham", "spam"], np.array([2.0, 1.0]), None, "BernoulliNB")
    (0, 1, ('ham', 'spam'))
    """
    if classes is None:
        if len(labels) != 2:
            raise ValueError(f"the model has the classes {labels!r}: give classes=(negative, "
                             "positive) to say which log-odds to explain")
        classes = labels
    pair = tuple(check_labels(list(classes), model))
    if len(pair) != 2 or pair[0] == pair[1]:
        raise ValueError(f"classes must be two different labels, got {classes!r}")
    missing = [c for c in pair if c not in labels]
    if missing:
        raise ValueError(f"the model has not learnt the classes {missing!r} (it has {labels!r})")
    rows = [labels.index(c) for c in pair]
    empty = [pair[i] for i in (0, 1) if not weights[rows[i]] > 0]
    if empty:
        raise ValueError(f"the classes {empty!r} hold no weight: their log-odds are infinite")
    return rows[0], rows[1], (pair[0], pair[1])
