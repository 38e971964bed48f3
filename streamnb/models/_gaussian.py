"""What the Gaussian models share: Cholesky with jitter, log-det, Mahalanobis, priors,
and the base class that turns (ClassCounts, GaussianMoments) into a classifier.

The bundle part names ``"classes"`` and ``"moments"`` are a contract: a hybrid model
reuses them.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
from scipy.linalg.lapack import dpotrf, dpotrs, dtrtrs

from streamnb.bounds import BhattacharyyaPair, bhattacharyya_distance
from streamnb.exceptions import SingularCovarianceWarning
from streamnb.models.base import GenerativeClassifier
from streamnb.models.logspace import log_class_prior
from streamnb.stats.base import Label, normalize_labels
from streamnb.stats.bundle import StatsBundle
from streamnb.stats.class_counts import ClassCounts
from streamnb.stats.moments import GaussianMoments

#: First Cholesky jitter, as a fraction of each diagonal entry; multiplied by 10 per retry.
CHOLESKY_JITTER_INITIAL = 1e-10

#: Retries before falling back to the diagonal alone (jitter up to 1e-10 * 10**(n-1)).
CHOLESKY_JITTER_MAX_TRIES = 12

#: A Cholesky pivot with L_ii**2 below this fraction of S_ii (the variance of feature i
#: left unexplained by the previous features) is treated as singular.
CHOLESKY_PIVOT_RTOL = 1e-12

LOG_2PI = float(np.log(2.0 * np.pi))


# ------------------------------------------------------------------- linear algebra
def _try_cholesky(cov: np.ndarray) -> np.ndarray | None:
    """Lower Cholesky factor of ``cov`` (LAPACK's dpotrf, its lower triangle read), or
    None where it fails or a pivot keeps a fraction <= CHOLESKY_PIVOT_RTOL of its
    feature's variance. (A NaN anywhere in a row of the factor reaches that row's pivot,
    so the pivots alone are checked; a finite ``cov`` has a finite factor.)"""
    L, info = dpotrf(cov, lower=1, clean=1)
    if info != 0:
        return None
    piv = L.diagonal()
    return L if (piv * piv > CHOLESKY_PIVOT_RTOL * cov.diagonal()).all() else None


def cholesky_with_jitter(
    cov: np.ndarray, what: str, fallback_scale: np.ndarray | Callable[[], np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Lower Cholesky factor of ``cov``, regularised if it is singular.

    When ``cov`` is not (numerically) positive definite, ``j * scale`` is added to its
    diagonal, ``scale`` being the diagonal itself (entries that are 0 take
    ``fallback_scale``, or what it returns when it is a function, called only then;
    else the mean positive diagonal, else 1), with ``j`` growing tenfold from
    CHOLESKY_JITTER_INITIAL until the factorisation succeeds; a
    :class:`SingularCovarianceWarning` names ``what`` and the jitter. Returns
    ``(L, cov_used)``.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     L, used = cholesky_with_jitter(np.ones((2, 2)), "covariance of class 'a'")
    >>> bool(np.allclose(L @ L.T, used)), bool(used[0, 0] > 1.0), len(caught)
    (True, True, 1)
    """
    cov = np.asarray(cov, dtype=np.float64)
    L = _try_cholesky(cov)
    if L is not None:
        return L, cov
    diag = np.diag(cov).copy()
    positive = diag[np.isfinite(diag) & (diag > 0)]
    default = float(positive.mean()) if positive.size else 1.0
    scale = np.where(np.isfinite(diag) & (diag > 0), diag, np.nan)
    if callable(fallback_scale):
        fallback_scale = fallback_scale()
    if fallback_scale is not None:
        fb = np.asarray(fallback_scale, dtype=np.float64)
        scale = np.where(np.isnan(scale) & (fb > 0), fb, scale)
    scale = np.where(np.isnan(scale), default, scale)
    jitter = CHOLESKY_JITTER_INITIAL
    for _ in range(CHOLESKY_JITTER_MAX_TRIES):
        used = cov + np.diag(jitter * scale)
        L = _try_cholesky(used)
        if L is not None:
            action = f"added {jitter:.1e} x its diagonal scale to the diagonal"
            break
        jitter *= 10.0
    else:
        used = np.diag(scale)
        L = np.diag(np.sqrt(scale))
        action = "replaced it by its diagonal"
    warnings.warn(
        f"{what} is singular or not positive definite (a constant feature, fewer samples "
        f"than features, or a one-sample class?); {action}",
        SingularCovarianceWarning,
        stacklevel=3,
    )
    return L, used


def log_det_from_cholesky(L: np.ndarray) -> float:
    """``log det(L L^T) = 2 sum log diag(L)``.

    >>> log_det_from_cholesky(np.diag([2.0, 3.0])) == float(np.log(36.0))
    True
    """
    return float(2.0 * np.log(L.diagonal()).sum())


def solve_lower(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``L^-1 B`` for a lower triangular L (LAPACK's dtrtrs; B of shape (d, m)).

    >>> solve_lower(np.array([[2.0, 0.0], [1.0, 1.0]]), np.array([[2.0], [3.0]])).tolist()
    [[1.0], [2.0]]
    """
    return dtrtrs(L, B, lower=1)[0]


def cholesky_solve(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``(L L^T)^-1 B`` from the lower Cholesky factor L (LAPACK's dpotrs; B (d, m)).

    >>> cholesky_solve(np.array([[2.0, 0.0], [1.0, 1.0]]), np.array([[4.0], [3.0]])).tolist()
    [[0.5], [1.0]]
    """
    return dpotrs(L, B, lower=1)[0]


def mahalanobis_sq(L: np.ndarray, X: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """``(x - mean)^T (L L^T)^{-1} (x - mean)`` per row of X: one triangular solve, O(d^2).

    >>> mahalanobis_sq(np.diag([2.0, 1.0]), np.array([[2.0, 1.0]]), np.zeros(2)).tolist()
    [2.0]
    """
    Z = solve_lower(L, (X - mean).T)
    return np.einsum("ij,ij->j", Z, Z)


# --------------------------------------------------------------------------- priors
Priors = list[float] | dict[Label, float] | None


def check_priors(priors: Any) -> Priors:
    """Validate user priors and return a copy the caller cannot change.

    Parameters
    ----------
    priors : None, sequence of float or mapping label -> float
        A sequence is in ``classes_`` order; values finite, >= 0, summing to 1
        (within 1e-8).

    Returns
    -------
    None, list of float or dict label -> float
        A new list or dict of Python floats (labels normalised), never ``priors`` itself.

    Raises
    ------
    ValueError
        For priors that are not numbers, not 1-d, negative, not finite or not summing to 1.

    Examples
    --------
    >>> import numpy as np
    >>> given = np.array([0.25, 0.75])
    >>> kept = check_priors(given)
    >>> given[0] = 0.5
    >>> kept
    [0.25, 0.75]
    """
    if priors is None:
        return None
    if isinstance(priors, Mapping):
        keys = normalize_labels(list(priors))
        values = np.array([float(v) for v in priors.values()], dtype=np.float64)
    else:
        keys = None
        try:
            values = np.asarray(priors, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"priors must be numbers, got {priors!r}") from None
        if values.ndim != 1 or values.size == 0:
            raise ValueError(f"priors must be a non-empty 1-d sequence, got shape {values.shape}")
    if not np.isfinite(values).all() or (values < 0).any():
        raise ValueError(f"priors must be finite and >= 0, got {values.tolist()}")
    if abs(values.sum() - 1.0) > 1e-8:
        raise ValueError(f"priors must sum to 1, got {values.tolist()} (sum {values.sum()!r})")
    if keys is None:
        return values.tolist()
    return dict(zip(keys, values.tolist(), strict=True))


def resolve_priors(priors: Priors, labels: list[Label], counts: np.ndarray) -> np.ndarray:
    """Prior of each class in ``labels``: the user's, else the class's share of the weight."""
    if priors is None:
        total = counts.sum()
        return counts / total if total > 0 else np.zeros_like(counts)
    if isinstance(priors, dict):
        missing = [lab for lab in labels if lab not in priors]
        if missing:
            raise ValueError(f"priors give no value for the classes {missing!r}")
        return np.array([priors[lab] for lab in labels], dtype=np.float64)
    if len(priors) != len(labels):
        raise ValueError(
            f"priors has {len(priors)} values, but the model has {len(labels)} classes {labels!r}"
        )
    return np.asarray(priors, dtype=np.float64)


def safe_log(p: np.ndarray) -> np.ndarray:
    """``log p`` with ``-inf`` for zeros, without a divide-by-zero warning."""
    out = np.full(p.shape, -np.inf)
    np.log(p, out=out, where=p > 0)
    return out


# ----------------------------------------------------------------------- base model
class GaussianClassifier(GenerativeClassifier):
    """Base of GaussianNB, LDA and QDA: statistics ``classes`` (ClassCounts) and
    ``moments`` (GaussianMoments); dense input only.

    Subclasses derive parameters in :meth:`_refresh` from the classes whose moments
    changed since the last call (``self._stale``: a set of labels, or None for all;
    recorded only by the subclasses that set ``per_class_refresh``).
    """

    #: Whether the moments keep only the diagonal of M2.
    diagonal: ClassVar[bool]
    #: Whether :meth:`_refresh` re-derives only the classes a batch changed (QDA): the
    #: others re-derive every class, and need no record of the changed ones.
    per_class_refresh: ClassVar[bool] = False

    def __init__(self, priors: Any = None) -> None:
        super().__init__()
        self.priors = priors
        self._priors: Priors = None
        self._stale: set[Label] | None = None
        self._dirty = True

    def _check_params(self) -> None:
        # A validated copy, taken by fit, the first partial_fit and set_params: priors_
        # and the predictions keep it whatever then happens to the caller's array.
        self._priors = check_priors(self.priors)

    def _fitted_priors(self) -> Priors:
        """The user's priors as validated (None: estimated from the class weights)."""
        self.validate_params()
        return self._priors

    def _params_in_use(self) -> dict[str, Any]:
        return {**super()._params_in_use(), "priors": self._fitted_priors()}

    # ----------------------------------------------------------- statistics
    def _empty_stats(self) -> StatsBundle:
        return StatsBundle(classes=ClassCounts(), moments=GaussianMoments(diagonal=self.diagonal))

    def _batch_stats(self, X: Any, y: list, sample_weight: np.ndarray) -> StatsBundle:
        moments = GaussianMoments(X.shape[1], diagonal=self.diagonal)
        moments.add_checked(X, y, sample_weight)  # (X, y and the weights checked above)
        # A batch's class weights are its moments' n (summed as ClassCounts.update sums).
        classes = ClassCounts(moments.labels, moments.n.copy())
        return StatsBundle(classes=classes, moments=moments)

    @property
    def moments(self) -> GaussianMoments:
        return self.stats["moments"]  # type: ignore[return-value]

    def _n_features(self) -> int | None:
        return self.moments.n_features

    def _register_classes(self, labels: list) -> None:
        self.stats["classes"].add_classes(labels)  # type: ignore[attr-defined]
        self.moments.add_classes(labels)
        self._on_stats_changed(None)

    def _on_stats_changed(self, delta: StatsBundle | None) -> None:
        self._dirty = True
        if delta is None or "moments" not in delta:
            self._stale = None
        elif self._stale is not None and self.per_class_refresh:
            self._stale.update(delta["moments"].touched_labels())  # type: ignore[attr-defined]

    def _take_stale(self) -> set[Label] | None:
        """The labels to re-derive (None: all), and reset the record."""
        stale, self._stale, self._dirty = self._stale, set(), False
        return stale

    # --------------------------------------------------------------- views
    def _class_view(self) -> tuple[list[Label], np.ndarray, np.ndarray, np.ndarray]:
        """``(labels, moment rows (-1: none), class weights, priors)`` in classes_ order."""
        labels = list(self.stats["classes"].labels)  # type: ignore[attr-defined]
        counts = self.stats["classes"].counts  # type: ignore[attr-defined]
        index = self.moments.index
        if labels == index.labels:  # (the common case: every class has a moments row)
            rows, n = np.arange(len(labels)), self.moments.n.copy()
        else:
            rows = np.array([index.row(lab) if lab in index else -1 for lab in labels], np.intp)
            n = np.where(rows >= 0, self.moments.n[rows], 0.0)
        priors = resolve_priors(self._fitted_priors(), labels, counts)
        # A class with no data has no likelihood, whatever its prior.
        return labels, rows, n, np.where(n > 0, priors, 0.0)

    @property
    def priors_(self) -> np.ndarray:
        """Class priors in ``classes_`` order: the user's as validated when the model
        started learning (or at ``set_params``), else estimated from the weights."""
        self._check_fitted()
        labels = list(self.stats["classes"].labels)  # type: ignore[attr-defined]
        return resolve_priors(self._fitted_priors(), labels, self.stats["classes"].counts)  # type: ignore[attr-defined]

    @property
    def class_log_prior_(self) -> np.ndarray:
        """``log priors_`` (-inf for a prior of 0): with ``priors=None``, ``log N_c - log
        N`` (as the count models', to the last bit)."""
        self._check_fitted()
        if self._fitted_priors() is None:
            return log_class_prior(self.stats["classes"].counts)  # type: ignore[attr-defined]
        return safe_log(self.priors_)

    @property
    def means_(self) -> np.ndarray:
        """Class means, shape (n_classes, n_features); zeros for a class with no data."""
        self._check_fitted()
        _, rows, n, _ = self._class_view()
        out = np.zeros((len(rows), self.n_features_in_))
        out[rows >= 0] = self.moments.mean[rows[rows >= 0]]
        return out

    def _pooled_variance(self) -> np.ndarray:
        """Per-feature (biased) variance of all data seen, from the pooled moments."""
        n, _, m2 = self.moments.pooled()
        diag = m2 if m2.ndim == 1 else np.diag(m2)
        return diag / n if n > 0 else np.zeros_like(diag)

    # ----------------------------------------------------------- scoring
    @abstractmethod
    def _refresh(self) -> None:
        """Re-derive what the stale classes changed (no-op when nothing changed)."""

    def _derive(self) -> None:
        self._refresh()

    def _derived(self, name: str) -> Any:
        """A derived parameter (an attribute set by ``_refresh``), brought up to date."""
        self._check_fitted()
        self._refresh()
        return getattr(self, name)

    @abstractmethod
    def _class_covariances(self) -> tuple[list[Label], np.ndarray, np.ndarray, np.ndarray]:
        """``(labels, means, covariances, priors)`` of the classes with data, as scored
        (regularised); covariances are (k, d) diagonals or (k, d, d) matrices."""

    def _joint_log_likelihood(self, X: Any) -> np.ndarray:
        self._refresh()
        return self._score(X)

    @abstractmethod
    def _score(self, X: np.ndarray) -> np.ndarray:
        """Joint log-likelihood from up-to-date derived parameters."""

    def bhattacharyya(self) -> list[BhattacharyyaPair]:
        """Separability of every pair of classes with data, as scored by this model.

        Returns a list of ``BhattacharyyaPair(class_a, class_b, distance, bound)`` in
        ``classes_`` order: ``distance`` is D_B = 1/8 dmu^T S^-1 dmu + 1/2 ln(det S /
        sqrt(det S_a det S_b)) with S = (S_a + S_b)/2, and ``bound`` is
        sqrt(pi_a pi_b) exp(-D_B), an upper bound on the Bayes error of telling a from b.
        """
        self._check_fitted()
        self._refresh()
        labels, means, covs, priors = self._class_covariances()
        out = []
        for i in range(len(labels)):
            for j in range(i + 1, len(labels)):
                dist = bhattacharyya_distance(means[i], covs[i], means[j], covs[j])
                bound = float(np.sqrt(priors[i] * priors[j]) * np.exp(-dist))
                out.append(BhattacharyyaPair(labels[i], labels[j], dist, bound))
        return out
