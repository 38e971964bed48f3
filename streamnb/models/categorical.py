"""Categorical Naive Bayes: each feature takes one of K_j integer categories."""

from __future__ import annotations

from typing import Any

import numpy as np

from streamnb.models._discrete import (
    ClassPrior,
    ClassPriorParam,
    check_alpha,
    check_class_prior,
    fixed_log_prior,
    log_class_prior,
)
from streamnb.models.base import GenerativeClassifier
from streamnb.stats.bundle import StatsBundle
from streamnb.stats.category_counts import DEFAULT_MAX_CATEGORIES, CategoryCounts, check_categories
from streamnb.stats.class_counts import ClassCounts


class CategoricalNB(ClassPriorParam, GenerativeClassifier):
    """Categorical Naive Bayes over non-negative integer categories, learnt online.

    ``P(v | c, j) = (N_cjv + alpha) / (N_cj + alpha * K_j)``, K_j = largest category of
    feature j seen so far + 1 (as scikit-learn). A category never seen in training
    gets the count 0 (probability ``alpha / (N_cj + alpha * K_j)``) instead of an error.

    Categories are bounded: a value at or beyond ``max_categories`` is refused with a
    ValueError (learning and predicting alike), since a feature's table grows to the
    largest category learnt.

    >>> import numpy as np
    >>> X = np.array([[0, 1], [0, 2], [1, 2]])
    >>> model = CategoricalNB().fit(X, ["a", "a", "b"])
    >>> # a: 2/3 * (3/4)(2/5), b: 1/3 * (1/3)(1/4) = 0.2 : 0.0278 -> 0.878 : 0.122
    >>> model.predict_proba(np.array([[0, 1]])).round(3).tolist()
    [[0.878, 0.122]]
    """

    kind = "categorical"
    positive_only = True
    poor_score = True

    def __init__(self, alpha: float = 1.0, fit_prior: bool = True, class_prior: Any = None,
                 max_categories: int = DEFAULT_MAX_CATEGORIES) -> None:
        super().__init__()
        self.alpha = alpha
        self.fit_prior = fit_prior
        self.class_prior = class_prior
        self.max_categories = max_categories
        self._class_prior: ClassPrior = None
        self._stale = True

    def _check_params(self) -> None:
        check_alpha(self.alpha)
        if not isinstance(self.fit_prior, (bool, np.bool_)):
            raise ValueError(f"fit_prior must be True or False, got {self.fit_prior!r}")
        m = self.max_categories
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise ValueError(f"max_categories must be an int >= 1, got {m!r}")
        # A validated copy (see DiscreteNB._check_params).
        self._class_prior = check_class_prior(self.class_prior)


    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.categorical = True
        return tags

    # -------------------------------------------------------------- statistics
    def _empty_stats(self) -> StatsBundle:
        return StatsBundle(classes=ClassCounts(), categories=CategoryCounts())

    def _parts(self) -> tuple[ClassCounts, CategoryCounts]:
        cc, cat = self.stats.parts.get("classes"), self.stats.parts.get("categories")
        if not isinstance(cc, ClassCounts) or not isinstance(cat, CategoryCounts) or len(self.stats.parts) != 2:
            raise ValueError(
                "CategoricalNB needs statistics with parts classes (ClassCounts) and "
                f"categories (CategoryCounts), got {self.stats!r}"
            )
        return cc, cat

    def _n_features(self) -> int | None:
        n = self._stats["categories"].n_features if self._stats is not None else 0  # type: ignore[attr-defined]
        return n or None

    def _validate_X(self, X: Any, predicting: bool = False) -> Any:
        X = super()._validate_X(X, predicting)
        self.check_categories(X)
        return X.astype(np.int64)

    def check_categories(self, X: Any) -> None:
        """Raise ValueError unless every value of ``X`` is a category this model takes: an
        integer from 0 to ``max_categories - 1``.

        >>> CategoricalNB(max_categories=8).check_categories(np.array([[1, 9]]))
        Traceback (most recent call last):
        ...
        ValueError: category 9 of feature 1 is beyond the limit: categories are 0 .. 7 (max_categories=8)
        """
        self.validate_params()
        X = np.asarray(X)
        if (X < 0).any():
            raise ValueError(f"Negative values in data passed to CategoricalNB (input X): it "
                             f"expects non-negative integer categories, got {X[X < 0][0]}")
        if (X != np.floor(X)).any():
            bad = X[X != np.floor(X)][0]
            raise ValueError(f"CategoricalNB expects non-negative integer categories, got {bad}")
        check_categories(X, int(self.max_categories))

    def _batch_stats(self, X: Any, y: list, sample_weight: np.ndarray) -> StatsBundle:
        return StatsBundle(
            classes=ClassCounts().update(y, sample_weight),
            categories=CategoryCounts().update(X, y, sample_weight, int(self.max_categories)),
        )

    def _on_stats_changed(self, delta: StatsBundle | None) -> None:
        cc, cat = self._parts()
        cc.add_classes(cat.labels)  # (both sorted: the same labels are the same rows)
        cat.add_classes(cc.labels)
        self._stale = True

    # ---------------------------------------------------------------- derived
    def _refresh(self) -> None:
        """Re-derive the log-probability tables: O(classes x sum_j K_j), once per change.

        ``_tables[j]`` has K_j + 1 columns; the last one is for unseen categories."""
        if not self._stale:
            return
        cc, cat = self._parts()
        class_prior = self._fitted_class_prior()
        if class_prior is not None:
            self._log_prior = fixed_log_prior(class_prior, cc.labels)
        elif self.fit_prior:
            self._log_prior = log_class_prior(cc.counts)
        else:
            self._log_prior = np.full(cc.counts.shape, -np.log(max(cc.counts.size, 1)))
        tables = []
        for counts in cat.counts:
            k_j = counts.shape[1]
            # max(K_j, 1): a feature whose every category was unlearnt contributes 0.
            log_den = np.log(counts.sum(axis=1) + self.alpha * max(k_j, 1))[:, None]
            padded = np.hstack([counts, np.zeros((counts.shape[0], 1))])
            tables.append(np.log(padded + self.alpha) - log_den)
        self._tables = tables
        self._stale = False

    @property
    def feature_log_prob_(self) -> list[np.ndarray]:
        """``log P(v | c, j)`` per feature j, arrays of shape (n_classes, K_j)."""
        self._check_fitted()
        self._refresh()
        return [t[:, :-1].copy() for t in self._tables]

    @property
    def n_categories_(self) -> np.ndarray:
        """K_j per feature."""
        self._check_fitted()
        return self._parts()[1].n_categories

    @property
    def category_count_(self) -> list[np.ndarray]:
        """Weighted count of each category per class: one (n_classes, K_j) array per feature."""
        self._check_fitted()
        return [c.copy() for c in self._parts()[1].counts]

    @property
    def class_log_prior_(self) -> np.ndarray:
        """``log P(c)``: ``log class_prior`` if given, else the weight shares
        (``fit_prior``), else uniform."""
        self._check_fitted()
        self._refresh()
        return self._log_prior.copy()

    def _derive(self) -> None:
        self._refresh()

    def _on_params_changed(self) -> None:
        self._stale = True

    def _joint_log_likelihood(self, X: Any) -> np.ndarray:
        self._refresh()
        jll = np.zeros((X.shape[0], self._log_prior.size)) + self._log_prior
        for j, table in enumerate(self._tables):
            jll += table[:, np.minimum(X[:, j], table.shape[1] - 1)].T
        return jll

    def _log_odds_terms(self, X: Any, a: int, b: int) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Per feature j of value v: ``log P(v | b, j) - log P(v | a, j)``; the bias is the
        log prior ratio. Every feature of a row has a term."""
        self._refresh()
        n, d = X.shape
        terms = np.empty((n, d))
        for j, table in enumerate(self._tables):
            v = np.minimum(X[:, j], table.shape[1] - 1)
            terms[:, j] = table[b, v] - table[a, v]
        features = np.tile(np.arange(d, dtype=np.int64), n)
        return (float(self._log_prior[b] - self._log_prior[a]), np.arange(n + 1) * d, features,
                terms.ravel())
