"""Linear discriminant analysis: Gaussian classes sharing one covariance."""

from __future__ import annotations

from typing import Any

import numpy as np

from streamnb.models._gaussian import (
    LOG_2PI,
    GaussianClassifier,
    cholesky_solve,
    cholesky_with_jitter,
    log_det_from_cholesky,
    safe_log,
    solve_lower,
)
from streamnb.stats.base import Label


class LinearDiscriminantAnalysis(GaussianClassifier):
    """Gaussian classes with a shared covariance S: a linear decision boundary.

    S is the priors-weighted sum of the classes' biased covariances (what
    scikit-learn's ``solver="lsqr"`` computes), optionally shrunk toward the scaled
    identity: ``(1 - s) S + s tr(S)/d I``. Scores use the linear form
    ``w_c = S^-1 mu_c``, ``b_c = -1/2 mu_c^T S^-1 mu_c + log pi_c`` (a Cholesky solve,
    one factorisation per batch). ``shrinkage="auto"`` (Ledoit-Wolf) is not offered:
    it needs fourth moments, which the mergeable statistics do not keep.

    >>> import numpy as np
    >>> X = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [3.0, 3.0], [4.0, 4.0], [3.0, 4.0]])
    >>> model = LinearDiscriminantAnalysis().fit(X, [0, 0, 0, 1, 1, 1])
    >>> model.predict([[0.5, 0.5], [3.5, 3.0]]).tolist()
    [0, 1]
    >>> float(model.decision_function([[2.0, 2.0]])[0]) == float(model.coef_[0] @ [2, 2] + model.intercept_[0])
    True
    """

    kind = "lda"
    diagonal = False

    def __init__(self, shrinkage: float | None = None, priors: Any = None) -> None:
        super().__init__(priors)
        self.shrinkage = shrinkage

    def _check_params(self) -> None:
        super()._check_params()
        shrinkage = self.shrinkage
        if shrinkage is None:
            return
        if isinstance(shrinkage, str):
            raise ValueError(
                f"shrinkage must be None or a float in [0, 1], got {shrinkage!r} "
                "(Ledoit-Wolf 'auto' needs fourth moments, which are not kept)"
            )
        try:
            shrinkage = float(shrinkage)
        except (TypeError, ValueError):
            raise ValueError(
                f"shrinkage must be None or a float in [0, 1], got {shrinkage!r}"
            ) from None
        if not 0.0 <= shrinkage <= 1.0:
            raise ValueError(f"shrinkage must be in [0, 1], got {shrinkage}")

    # --------------------------------------------------------------- derived
    def _refresh(self) -> None:
        """The shared covariance depends on every class (and the priors): one O(k d^2 + d^3)
        re-derivation per batch, whatever the batch touched (a few dozen numpy steps;
        the factorisation and the solve, LAPACK's dpotrf and dpotrs, are a small part)."""
        if not self._dirty:
            return
        self._take_stale()
        labels, rows, n, priors = self._class_view()
        active = n > 0
        moments = self.moments
        d = moments.n_features
        if active.all():
            means, m2, n_used, p_used = moments.mean[rows], moments.m2[rows], n, priors
        else:
            means = np.zeros((len(labels), d))
            means[active] = moments.mean[rows[active]]
            m2, n_used, p_used = moments.m2[rows[active]], n[active], priors[active]
        weights = p_used if p_used.sum() > 0 else n_used
        # S = sum_c weight_c M2_c / n_c: one (k,) x (k, d*d) product.
        cov = ((weights / (weights.sum() * n_used)) @ m2.reshape(-1, d * d)).reshape(d, d)
        if self.shrinkage:
            s = float(self.shrinkage)
            cov = (1.0 - s) * cov + s * np.trace(cov) / d * np.eye(d)
        L, cov = cholesky_with_jitter(cov, "the shared covariance", self._pooled_variance)
        coef = cholesky_solve(L, means.T).T
        # (A class without data has mean 0, so w_c = 0, and prior 0: b_c = -inf.)
        intercept = -0.5 * (means * coef).sum(axis=1) + safe_log(priors)
        self._means, self._covariance, self._chol = means, cov, L
        self._coef_all, self._intercept_all, self._active = coef, intercept, active
        if len(labels) == 2:  # the binary form, w_1 - w_0 and b_1 - b_0 (inf - inf: nan)
            b0, b1 = intercept.tolist()
            self._coef_binary, self._intercept_binary = coef[1:2] - coef[0:1], np.array([b1 - b0])
        self._priors_used = priors

    def _score(self, X: np.ndarray) -> np.ndarray:
        # log N(x; mu_c, S) = w_c.x - 1/2 mu_c^T w_c - 1/2 x^T S^-1 x - 1/2 log det(2 pi S)
        Z = solve_lower(self._chol, X.T)
        log_norm = -0.5 * (X.shape[1] * LOG_2PI + log_det_from_cholesky(self._chol))
        common = log_norm - 0.5 * np.einsum("ij,ij->j", Z, Z)
        return X @ self._coef_all.T + self._intercept_all + common[:, None]

    def _class_covariances(self) -> tuple[list[Label], np.ndarray, np.ndarray, np.ndarray]:
        labels, _, _, priors = self._class_view()
        keep = np.flatnonzero(self._active)
        covs = np.broadcast_to(self._covariance, (len(keep),) + self._covariance.shape)
        return [labels[i] for i in keep], self._means[keep], covs, priors[keep]

    # ------------------------------------------------------------ linear form
    @property
    def covariance_(self) -> np.ndarray:
        """The shared covariance as used (shrunk, and regularised if it was singular)."""
        return self._derived("_covariance")

    @property
    def coef_(self) -> np.ndarray:
        """``w_c = S^-1 mu_c`` per class, or for two classes the single row w_1 - w_0."""
        coef = self._derived("_coef_all")
        return self._coef_binary.copy() if coef.shape[0] == 2 else coef.copy()

    @property
    def intercept_(self) -> np.ndarray:
        """``b_c``; for two classes b_1 - b_0 (-inf/+inf when a class has no data)."""
        b = self._derived("_intercept_all")
        return self._intercept_binary.copy() if b.shape[0] == 2 else b.copy()

    def _decision(self, X: np.ndarray) -> np.ndarray:
        """``X @ coef_.T + intercept_`` of validated X, shape (n, 1) or (n, n_classes)."""
        self._refresh()
        if len(self._coef_all) == 2:
            return X @ self._coef_binary.T + self._intercept_binary
        return X @ self._coef_all.T + self._intercept_all

    def decision_function(self, X: Any) -> np.ndarray:
        """``X @ coef_.T + intercept_``: shape (n,) for two classes (the log-odds of
        ``classes_[1]``), else (n, n_classes)."""
        self._check_fitted()
        scores = self._decision(self._validate_X(X, predicting=True))
        return scores.ravel() if scores.shape[1] == 1 else scores

    def predict(self, X: Any) -> np.ndarray:
        """The class with the highest posterior, from :meth:`decision_function` (the
        terms all classes share left out, as scikit-learn's): for two classes
        ``classes_[1]`` exactly when ``w^T x + b >= 0``."""
        classes = self.classes_
        scores = self._decision(self._validate_X(X, predicting=True))
        if len(classes) == 2:
            return classes[(scores[:, 0] >= 0).astype(np.intp)]
        return classes[np.argmax(scores, axis=1)]
