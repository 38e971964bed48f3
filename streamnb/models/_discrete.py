"""Shared machinery of the count models (multinomial and Bernoulli Naive Bayes).

Both keep ``StatsBundle(classes=ClassCounts, features=FeatureCounts)`` and score with
the linear form ``score_c = b_c + x . w_c``. Derived parameters are refreshed lazily,
at the next prediction: after ``merge_stats(delta)`` only the delta's touched columns
are re-derived (plus O(classes) per-class terms); ``None`` (fit, decay, new class,
wider feature space) re-derives everything once.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

import numpy as np
import scipy.sparse as sp

from streamnb.arrays import sorted_unique
from streamnb.models.base import GenerativeClassifier
from streamnb.stats.bundle import StatsBundle
from streamnb.stats.class_counts import ClassCounts
from streamnb.stats.feature_counts import FeatureCounts

#: Values of ``smoothing_m``: m = number of columns (scikit-learn) or of features seen.
SMOOTHING_M_CHOICES = ("columns", "seen")


def check_alpha(alpha: Any) -> float:
    """Return ``alpha`` as a float > 0 (alpha = 0 would take log(0) for unseen features)."""
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a positive number, got {alpha!r}") from None
    if not (math.isfinite(a) and a > 0):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    return a


def log_class_prior(counts: np.ndarray) -> np.ndarray:
    """``log(N_c / N)``; ``-inf`` for zero-weight classes, without ``log(0)`` warnings.

    With no weight at all (every class registered but empty), the prior is uniform.

    >>> log_class_prior(np.array([3.0, 0.0, 1.0])).round(4).tolist()
    [-0.2877, -inf, -1.3863]
    """
    total = float(counts.sum())
    if total <= 0.0:
        return np.full(counts.shape, -math.log(max(counts.size, 1)))
    out = np.full(counts.shape, -np.inf)
    pos = counts > 0
    out[pos] = np.log(counts[pos]) - math.log(total)
    return out


class DiscreteNB(GenerativeClassifier):
    """Base of MultinomialNB and BernoulliNB: parameters, statistics, lazy refresh, linear form."""

    accepts_sparse = True

    def __init__(
        self, alpha: float = 1.0, n_features: int | None = None, smoothing_m: str = "columns"
    ) -> None:
        super().__init__()
        self.alpha = check_alpha(alpha)
        if n_features is not None and (
            isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) or n_features < 1
        ):
            raise ValueError(f"n_features must be None or an int >= 1, got {n_features!r}")
        self.n_features = None if n_features is None else int(n_features)
        if smoothing_m not in SMOOTHING_M_CHOICES:
            raise ValueError(f"smoothing_m must be one of {SMOOTHING_M_CHOICES}, got {smoothing_m!r}")
        self.smoothing_m = smoothing_m
        self._reset_derived()

    def get_params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "n_features": self.n_features, "smoothing_m": self.smoothing_m}

    # -------------------------------------------------------------- statistics
    def _empty_stats(self) -> StatsBundle:
        return StatsBundle(classes=ClassCounts(), features=FeatureCounts(self.n_features or 0))

    def _parts(self) -> tuple[ClassCounts, FeatureCounts]:
        cc, fc = self.stats.parts.get("classes"), self.stats.parts.get("features")
        if not isinstance(cc, ClassCounts) or not isinstance(fc, FeatureCounts) or len(self.stats.parts) != 2:
            raise ValueError(
                f"{type(self).__name__} needs statistics with parts classes (ClassCounts) and "
                f"features (FeatureCounts), got {self.stats!r}"
            )
        return cc, fc

    def _n_features(self) -> int | None:
        width = self._stats["features"].n_features if self._stats is not None else 0  # type: ignore[attr-defined]
        n = max(self.n_features or 0, width)
        return n or None

    def _count_matrix(self, X: Any) -> Any:
        """What is counted for validated X (identity; Bernoulli binarizes)."""
        return X

    def _batch_stats(self, X: Any, y: list, sample_weight: np.ndarray) -> StatsBundle:
        width = self._n_features() or X.shape[1]
        features = FeatureCounts.sparse(width).update(self._count_matrix(X), y, sample_weight)
        return StatsBundle(classes=ClassCounts().update(y, sample_weight), features=features)

    def _validate_X(self, X: Any, predicting: bool = False) -> Any:
        X = super()._validate_X(X, predicting)
        if X.shape[1] == 0:
            raise ValueError("X has 0 features; expected at least 1")
        values = X.data if sp.issparse(X) else X
        if values.size and values.min() < 0:
            raise ValueError(
                f"{type(self).__name__} expects non-negative feature values (counts), "
                f"got a minimum of {values.min()}"
            )
        return X

    # ------------------------------------------------------------ lazy refresh
    def _reset_derived(self) -> None:
        self._full_refresh = True
        self._pending: list[np.ndarray] = []
        self._coef_cache: tuple[np.ndarray, np.ndarray] | None = None
        self._shape = (0, 0)
        self._classes_stale = True

    def _on_stats_changed(self, delta: StatsBundle | None) -> None:
        cc, fc = self._parts()
        if fc.labels != cc.labels:
            cc.add_classes(fc.labels)
            fc.add_classes(cc.labels)
            fc.reorder(cc.labels)
        fc.densify()
        self._coef_cache = None
        shape = (len(cc.labels), fc.n_features)
        delta_fc = None if delta is None else delta.parts.get("features")
        if shape != self._shape or not isinstance(delta_fc, FeatureCounts) or not delta_fc.is_sparse:
            self._full_refresh = True
            self._pending = []
        elif not self._full_refresh:
            self._pending.append(delta_fc.columns)  # type: ignore[arg-type]
            # Deltas pile up while nothing refreshes (e.g. a worker predicting labelled
            # batches prequentially, from the statistics): past 1/8 of the columns, sorting
            # them costs about what one full derivation does.
            if sum(p.size for p in self._pending) > fc.n_features // 8:
                self._full_refresh, self._pending = True, []
        self._shape = shape
        self._classes_stale = True

    def _refresh(self) -> tuple[ClassCounts, FeatureCounts]:
        """Bring derived parameters up to date with the statistics; return the parts."""
        cc, fc = self._parts()
        if self._full_refresh:
            self._derive_all(cc, fc)
            self._full_refresh, self._pending = False, []
            self._classes_stale = True
        elif self._pending:
            # one delta's columns are sorted and distinct already
            cols = self._pending[0] if len(self._pending) == 1 else \
                sorted_unique(np.concatenate(self._pending), runs=True)
            self._pending = []
            self._derive_columns(cc, fc, cols)
        if self._classes_stale:
            self._derive_classes(cc, fc)
            self._classes_stale = False
        return cc, fc

    @abstractmethod
    def _derive_all(self, cc: ClassCounts, fc: FeatureCounts) -> None:
        """Re-derive every per-feature parameter."""

    @abstractmethod
    def _derive_columns(self, cc: ClassCounts, fc: FeatureCounts, cols: np.ndarray) -> None:
        """Re-derive the per-feature parameters of columns ``cols`` only."""

    @abstractmethod
    def _derive_classes(self, cc: ClassCounts, fc: FeatureCounts) -> None:
        """Re-derive the per-class terms (priors, denominators, constants)."""

    @abstractmethod
    def _linear_form(self) -> tuple[np.ndarray, np.ndarray]:
        """Full ``(W, b)``: ``log P(x, c) = b_c + x . W[c]``, W of shape (n_classes, n_features)."""

    def _m(self, fc: FeatureCounts) -> int:
        """The smoothing width m: number of columns, or of distinct features seen."""
        return fc.n_features if self.smoothing_m == "columns" else fc.n_seen

    # ------------------------------------------------------------ linear form
    def _coef_intercept(self) -> tuple[np.ndarray, np.ndarray]:
        self._check_fitted()
        if self._coef_cache is None:
            self._refresh()
            W, b = self._linear_form()
            if W.shape[0] == 2:
                with np.errstate(invalid="ignore"):
                    W, b = (W[1] - W[0])[None, :], np.array([b[1] - b[0]])
            self._coef_cache = (W, b)
        return self._coef_cache

    @property
    def coef_(self) -> np.ndarray:
        """Linear log-odds weights: ``(1, n_features)`` for two classes (class 1 vs 0),
        else the per-class weights ``(n_classes, n_features)``."""
        return self._coef_intercept()[0]

    @property
    def intercept_(self) -> np.ndarray:
        """Intercepts matching :attr:`coef_`."""
        return self._coef_intercept()[1]

    def decision_function(self, X: Any) -> np.ndarray:
        """``X . coef_ + intercept_``; for two classes the log-odds of ``classes_[1]``
        (predict it when >= 0), shape (n_samples,)."""
        W, b = self._coef_intercept()
        Xc = self._count_matrix(self._validate_X(X, predicting=True))
        scores = np.asarray(Xc @ W.T) + b
        return scores.ravel() if W.shape[0] == 1 else scores
