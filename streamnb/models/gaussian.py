"""Gaussian naive Bayes: one diagonal Gaussian per class, with a variance floor."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from streamnb.exceptions import SingularCovarianceWarning
from streamnb.models._gaussian import LOG_2PI, GaussianClassifier, safe_log
from streamnb.stats.base import Label

#: GaussianNB variance used when the var_smoothing floor is zero (constant data or
#: var_smoothing=0), relative to the data's scale (largest variance or squared mean, else 1).
GAUSSIAN_FALLBACK_VARIANCE = 1e-9


class GaussianNB(GaussianClassifier):
    """Gaussian naive Bayes: log P(x | c) = sum_j log N(x_j; theta_cj, var_cj).

    ``var_cj = M2_cj / n_c + epsilon_`` where the floor ``epsilon_ = var_smoothing *``
    the largest per-feature variance of *all data seen so far* (the pooled moments of
    every class). scikit-learn's ``partial_fit`` keeps the floor of its first batch;
    here mini-batches, merges and one ``fit`` give the same model. A class with one
    sample has variance ``epsilon_`` alone.

    >>> import numpy as np
    >>> X = np.array([[-1.0], [1.0], [0.0], [6.0]])     # A ~ N(0, 1), B ~ N(3, 9)
    >>> model = GaussianNB().fit(X, ["A", "A", "B", "B"])
    >>> model.theta_.ravel().tolist(), model.var_.ravel().round(6).tolist()
    ([0.0, 3.0], [1.0, 9.0])
    >>> model.predict([[-3.0], [0.5]]).tolist()
    ['B', 'A']
    """

    kind = "gaussian"
    diagonal = True

    def __init__(self, var_smoothing: float = 1e-9, priors: Any = None) -> None:
        super().__init__(priors)
        self.var_smoothing = var_smoothing

    def _check_params(self) -> None:
        super()._check_params()
        try:
            var_smoothing = float(self.var_smoothing)
        except (TypeError, ValueError):
            raise ValueError(
                f"var_smoothing must be a number, got {self.var_smoothing!r}"
            ) from None
        if not np.isfinite(var_smoothing) or var_smoothing < 0:
            raise ValueError(f"var_smoothing must be a finite number >= 0, got {var_smoothing}")

    # --------------------------------------------------------------- derived
    def _refresh(self) -> None:
        """O(k d): the floor follows all data, so every class's variance moves with it."""
        if not self._dirty:
            return
        self._take_stale()
        labels, rows, n, priors = self._class_view()
        active = n > 0
        d = self.n_features_in_
        theta = np.zeros((len(labels), d))
        raw = np.zeros((len(labels), d))
        theta[active] = self.moments.mean[rows[active]]
        raw[active] = self.moments.m2[rows[active]] / n[active, None]
        pooled_var = self._pooled_variance()
        epsilon = float(self.var_smoothing) * float(pooled_var.max(initial=0.0))
        var = raw + epsilon
        bad = active[:, None] & ~(var > 0)
        if bad.any():
            var = np.where(bad, self._fallback_variance(pooled_var), var)
            names = [labels[i] for i in np.flatnonzero(bad.any(axis=1))]
            warnings.warn(
                f"zero variance in classes {names!r} and a zero variance floor "
                f"(var_smoothing={self.var_smoothing}, constant data?); used "
                f"{GAUSSIAN_FALLBACK_VARIANCE:g} x the data's scale instead",
                SingularCovarianceWarning,
                stacklevel=4,
            )
        var[~active] = 1.0  # never scored: those classes get -inf
        self._theta, self._var, self._epsilon = theta, var, epsilon
        self._log_prior = safe_log(priors)
        self._log_norm = -0.5 * (d * LOG_2PI + np.log(var).sum(axis=1))
        self._active = active

    def _fallback_variance(self, pooled_var: np.ndarray) -> float:
        """A positive variance on the data's scale when the floor is zero."""
        scale = float(pooled_var.max(initial=0.0))
        if scale <= 0:
            scale = float(np.square(self.moments.mean).max(initial=0.0))
        return GAUSSIAN_FALLBACK_VARIANCE * (scale if scale > 0 else 1.0)

    def _score(self, X: np.ndarray) -> np.ndarray:
        jll = np.full((X.shape[0], len(self._active)), -np.inf)
        for c in np.flatnonzero(self._active & np.isfinite(self._log_prior)):
            dev = X - self._theta[c]
            jll[:, c] = (
                self._log_prior[c] + self._log_norm[c] - 0.5 * (dev * dev / self._var[c]).sum(1)
            )
        return jll

    def _class_covariances(self) -> tuple[list[Label], np.ndarray, np.ndarray, np.ndarray]:
        labels, _, _, priors = self._class_view()
        keep = np.flatnonzero(self._active)
        return [labels[i] for i in keep], self._theta[keep], self._var[keep], priors[keep]

    def _log_odds_terms(
        self, X: Any, a: int, b: int
    ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Per feature j: ``log N(x_j; theta_bj, var_bj) - log N(x_j; theta_aj, var_aj)``
        (the 2 pi terms cancel); the bias is the log prior ratio."""
        self._refresh()
        X = np.asarray(X, dtype=np.float64)
        n, d = X.shape
        dev_a, dev_b = X - self._theta[a], X - self._theta[b]
        terms = -0.5 * (np.log(self._var[b]) - np.log(self._var[a])) - 0.5 * (
            dev_b * dev_b / self._var[b] - dev_a * dev_a / self._var[a]
        )
        features = np.tile(np.arange(d, dtype=np.int64), n)
        return (
            float(self._log_prior[b] - self._log_prior[a]),
            np.arange(n + 1) * d,
            features,
            terms.ravel(),
        )

    @property
    def theta_(self) -> np.ndarray:
        """Class means, shape (n_classes, n_features)."""
        return self._derived("_theta")

    @property
    def var_(self) -> np.ndarray:
        """Class variances including the floor ``epsilon_`` (1.0 for a class with no data)."""
        return self._derived("_var")

    @property
    def epsilon_(self) -> float:
        """The variance floor: var_smoothing x the largest variance of all data seen."""
        return self._derived("_epsilon")

    @property
    def class_prior_(self) -> np.ndarray:
        """Alias of ``priors_`` (scikit-learn's name for GaussianNB)."""
        return self.priors_
