"""Quadratic discriminant analysis: one full-covariance Gaussian per class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from streamnb.models._gaussian import (
    LOG_2PI,
    GaussianClassifier,
    cholesky_with_jitter,
    log_det_from_cholesky,
    mahalanobis_sq,
    safe_log,
)
from streamnb.stats.base import Label


class QuadraticDiscriminantAnalysis(GaussianClassifier):
    """Gaussian classes with their own covariance: a quadratic decision boundary.

    ``S_c = (1 - reg_param) M2_c / (n_c - ddof) + reg_param I`` (scikit-learn's
    regularisation). Each class keeps its Cholesky factor; after a batch only the
    classes it touched are refactorised (O(d^3) each), and scoring is one triangular
    solve per class, O(d^2) per sample. A class with ``n_c <= ddof`` uses ``M2_c / n_c``.

    >>> import numpy as np
    >>> X = np.array([[0.0, 0.0], [1.0, 0.2], [0.1, 1.0], [3.0, 3.0], [5.0, 4.0], [3.0, 6.0]])
    >>> model = QuadraticDiscriminantAnalysis(ddof=1).fit(X, ["a", "a", "a", "b", "b", "b"])
    >>> model.predict([[0.3, 0.3], [4.0, 5.0]]).tolist()
    ['a', 'b']
    >>> bool(np.allclose(model.covariance_[1], np.cov(X[3:].T)))
    True
    """

    kind = "qda"
    diagonal = False
    per_class_refresh = True

    def __init__(self, reg_param: float = 0.0, priors: Any = None, ddof: float = 0) -> None:
        super().__init__(priors)
        self.reg_param = reg_param
        self.ddof = ddof
        self._factors: dict[Label, tuple[np.ndarray, np.ndarray, np.ndarray, float]] = {}

    def _check_params(self) -> None:
        super()._check_params()
        try:
            reg_param, ddof = float(self.reg_param), float(self.ddof)
        except (TypeError, ValueError):
            raise ValueError(
                f"reg_param and ddof must be numbers, got {self.reg_param!r} and {self.ddof!r}"
            ) from None
        if not 0.0 <= reg_param <= 1.0:
            raise ValueError(f"reg_param must be in [0, 1], got {reg_param}")
        if not (np.isfinite(ddof) and ddof >= 0):
            raise ValueError(f"ddof must be a finite number >= 0, got {ddof}")

    # --------------------------------------------------------------- derived
    def _class_factor(
        self, row: int, label: Label, fallback_scale: Callable[[], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """``(mean, covariance, Cholesky factor, log det)`` of one class."""
        m = self.moments
        n = m.n[row]
        ddof, reg = float(self.ddof), float(self.reg_param)
        denom = n - ddof if n - ddof > 0 else n
        cov = m.m2[row] / denom
        if reg:
            cov = (1.0 - reg) * cov + reg * np.eye(cov.shape[0])
        L, cov = cholesky_with_jitter(cov, f"the covariance of class {label!r}", fallback_scale)
        return m.mean[row].copy(), cov, L, log_det_from_cholesky(L)

    def _refresh(self) -> None:
        """Refactorise only the classes whose moments changed since the last call."""
        if not self._dirty:
            return
        stale = self._take_stale()
        labels, rows, n, priors = self._class_view()
        if stale is None:
            self._factors = {}
        for label, row, n_c in zip(labels, rows, n, strict=True):
            if n_c <= 0:
                self._factors.pop(label, None)
            elif stale is None or label in stale or label not in self._factors:
                self._factors[label] = self._class_factor(int(row), label, self._pooled_variance)
        self._labels, self._log_prior = labels, safe_log(priors)

    def _score(self, X: np.ndarray) -> np.ndarray:
        d = X.shape[1]
        jll = np.full((X.shape[0], len(self._labels)), -np.inf)
        for c, label in enumerate(self._labels):
            factor = self._factors.get(label)
            if factor is None or not np.isfinite(self._log_prior[c]):
                continue
            mean, _, L, log_det = factor
            jll[:, c] = self._log_prior[c] - 0.5 * (
                d * LOG_2PI + log_det + mahalanobis_sq(L, X, mean)
            )
        return jll

    def _class_covariances(self) -> tuple[list[Label], np.ndarray, np.ndarray, np.ndarray]:
        labels, _, _, priors = self._class_view()
        keep = [i for i, lab in enumerate(labels) if lab in self._factors]
        means = np.array([self._factors[labels[i]][0] for i in keep])
        covs = np.array([self._factors[labels[i]][1] for i in keep])
        return [labels[i] for i in keep], means, covs, priors[keep]

    @property
    def covariance_(self) -> np.ndarray:
        """Per-class covariances as used (regularised), shape (n_classes, d, d);
        zeros for a class with no data."""
        self._check_fitted()
        self._refresh()
        d = self.n_features_in_
        out = np.zeros((len(self._labels), d, d))
        for c, label in enumerate(self._labels):
            if label in self._factors:
                out[c] = self._factors[label][1]
        return out
