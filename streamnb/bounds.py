"""Bayes decision thresholds, Bayes error and its Chernoff / Bhattacharyya bounds
for two Gaussian classes.

Gaussians are written N(mean, variance). For two classes with priors p1, p2 = priors:

* :func:`bayes_thresholds` -- the points where p1 N(x; m1, v1) = p2 N(x; m2, v2) (1-D);
* :func:`bayes_error` -- the error of the Bayes rule, from normal CDFs (1-D);
* :func:`chernoff_bound` -- min over alpha in [0, 1] of p1^a p2^(1-a) exp(-k(a)), with
  k(a) = -ln integral N1^a N2^(1-a) dx
       = a(1-a)/2 dm^T S_a^-1 dm + 1/2 ln(det S_a / (det S1^(1-a) det S2^a)),
  S_a = (1-a) S1 + a S2 (any dimension);
* :func:`bhattacharyya_distance` / :func:`bhattacharyya_bound` -- the same at a = 1/2:
  D_B = 1/8 dm^T S^-1 dm + 1/2 ln(det S / sqrt(det S1 det S2)), S = (S1 + S2)/2, and the
  bound sqrt(p1 p2) exp(-D_B) (any dimension).

A covariance may be a number (1-D), a vector (the diagonal of a diagonal covariance) or
a d x d matrix.

>>> round(float(bayes_thresholds(0, 1, 2, 1, priors=(0.8, 0.2))[0]), 4)
1.6931
>>> round(bayes_error(0, 1, 2, 1, priors=(0.8, 0.2)), 4)
0.1121
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from scipy.special import ndtr

#: log sqrt(2 pi), the normal density's constant (as scipy.stats computes it).
_LOG_SQRT_2PI = float(np.log(np.sqrt(2 * np.pi)))


class ChernoffBound(NamedTuple):
    """The Chernoff bound on the Bayes error and the alpha in [0, 1] that attains it."""

    bound: float
    alpha: float


class BhattacharyyaPair(NamedTuple):
    """Bhattacharyya distance and error bound between two classes of a model."""

    class_a: Any
    class_b: Any
    distance: float
    bound: float


# ------------------------------------------------------------------ validation
def _check_priors(priors: Any) -> tuple[float, float]:
    try:
        p1, p2 = (float(p) for p in priors)
    except (TypeError, ValueError):
        raise ValueError(f"priors must be two numbers, got {priors!r}") from None
    if not (np.isfinite(p1) and np.isfinite(p2)) or p1 < 0 or p2 < 0 or abs(p1 + p2 - 1) > 1e-8:
        raise ValueError(f"priors must be two numbers >= 0 summing to 1, got {priors!r}")
    return p1, p2


def _check_1d(mean: Any, var: Any, which: str) -> tuple[float, float]:
    m, v = float(mean), float(var)
    if not np.isfinite(m) or not np.isfinite(v) or v <= 0:
        raise ValueError(f"class {which}: expected a finite mean and a variance > 0, got {m}, {v}")
    return m, v


class _Gaussian(NamedTuple):
    mean: np.ndarray
    cov: np.ndarray  # (d,) diagonal or (d, d)

    @property
    def diagonal(self) -> bool:
        return self.cov.ndim == 1

    def full(self) -> np.ndarray:
        return np.diag(self.cov) if self.diagonal else self.cov


def _gaussian(mean: Any, cov: Any, which: str) -> _Gaussian:
    m = np.atleast_1d(np.asarray(mean, dtype=np.float64))
    c = np.asarray(cov, dtype=np.float64)
    if c.ndim == 0:
        c = c.reshape(1)
    d = m.shape[0]
    if m.ndim != 1 or c.shape not in ((d,), (d, d)):
        raise ValueError(
            f"class {which}: a mean of shape (d,) needs a covariance of shape (d,) or (d, d); "
            f"got {m.shape} and {c.shape}"
        )
    if not (np.isfinite(m).all() and np.isfinite(c).all()):
        raise ValueError(f"class {which}: mean and covariance must be finite")
    return _Gaussian(m, c)


def _pair(mean1: Any, cov1: Any, mean2: Any, cov2: Any) -> tuple[_Gaussian, _Gaussian]:
    g1, g2 = _gaussian(mean1, cov1, "1"), _gaussian(mean2, cov2, "2")
    if g1.mean.shape != g2.mean.shape:
        raise ValueError(f"the classes have {g1.mean.shape[0]} and {g2.mean.shape[0]} dimensions")
    return g1, g2


def _log_det(cov: np.ndarray, which: str) -> float:
    if cov.ndim == 1:
        if (cov <= 0).any():
            raise ValueError(f"covariance of {which} must be positive definite")
        return float(np.log(cov).sum())
    try:
        L = np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        raise ValueError(f"covariance of {which} must be positive definite") from None
    return float(2.0 * np.log(np.diag(L)).sum())


def _quad(cov: np.ndarray, v: np.ndarray) -> float:
    """``v^T cov^-1 v`` by a Cholesky solve (or elementwise for a diagonal)."""
    if cov.ndim == 1:
        return float(v @ (v / cov))
    L = np.linalg.cholesky(cov)
    z = np.linalg.solve(L, v)
    return float(z @ z)


# ------------------------------------------------------------------------- 1-D
def bayes_thresholds(
    mean1: float, var1: float, mean2: float, var2: float, priors: Any = (0.5, 0.5)
) -> np.ndarray:
    """Points x where the Bayes rule switches class, sorted (0, 1 or 2 of them).

    Solves log p1 + log N(x; m1, v1) = log p2 + log N(x; m2, v2): linear when the
    variances are equal, quadratic otherwise.

    >>> bayes_thresholds(0, 1, 0, 4).round(4).tolist()   # N(0,1) vs N(0,4), equal priors
    [-1.3596, 1.3596]
    >>> bayes_thresholds(0, 1, 0, 1).tolist()             # identical classes: no switch
    []
    """
    m1, v1 = _check_1d(mean1, var1, "1")
    m2, v2 = _check_1d(mean2, var2, "2")
    p1, p2 = _check_priors(priors)
    if p1 == 0 or p2 == 0:
        return np.empty(0)
    # f(x) = a x^2 + b x + c = log(p1 N1) - log(p2 N2)
    a = 0.5 / v2 - 0.5 / v1
    b = m1 / v1 - m2 / v2
    c = 0.5 * m2 * m2 / v2 - 0.5 * m1 * m1 / v1 + np.log(p1 / p2) + 0.5 * np.log(v2 / v1)
    if a == 0.0:
        return np.empty(0) if b == 0.0 else np.array([-c / b])
    disc = b * b - 4.0 * a * c
    if disc < 0:
        return np.empty(0)
    if disc == 0:
        return np.array([-b / (2.0 * a)])
    q = -0.5 * (b + np.copysign(np.sqrt(disc), b))  # stable: no cancellation
    roots = [q / a, c / q] if q != 0 else [np.sqrt(-c / a), -np.sqrt(-c / a)]
    return np.sort(np.array(roots, dtype=np.float64))


def bayes_error(
    mean1: float, var1: float, mean2: float, var2: float, priors: Any = (0.5, 0.5)
) -> float:
    """Probability that the Bayes rule errs: the integral of min(p1 N1, p2 N2).

    Between consecutive thresholds one class wins; the loser's prior times its normal
    probability of that interval is the error there.

    >>> round(bayes_error(0, 1, 0, 4), 4)   # N(0,1) vs N(0,4): B wins in both tails
    0.3387
    """
    m1, v1 = _check_1d(mean1, var1, "1")
    m2, v2 = _check_1d(mean2, var2, "2")
    p1, p2 = _check_priors(priors)
    if p1 == 0 or p2 == 0:
        return 0.0
    s1, s2 = np.sqrt(v1), np.sqrt(v2)
    edges = np.concatenate([[-np.inf], bayes_thresholds(m1, v1, m2, v2, (p1, p2)), [np.inf]])
    error = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        if np.isinf(lo) and np.isinf(hi):
            x = 0.5 * (m1 + m2)
        elif np.isinf(lo):
            x = hi - 1.0
        elif np.isinf(hi):
            x = lo + 1.0
        else:
            x = 0.5 * (lo + hi)
        first_wins = (np.log(p1) + _normal_logpdf(x, m1, s1)) >= (np.log(p2) + _normal_logpdf(x, m2, s2))
        p, m, s = (p2, m2, s2) if first_wins else (p1, m1, s1)
        error += p * float(ndtr((hi - m) / s) - ndtr((lo - m) / s))
    return float(error)


def _normal_logpdf(x: float, mean: float, sd: float) -> float:
    """log N(x; mean, sd^2), as ``scipy.stats.norm.logpdf``. This module is imported by
    every worker (the observer's Bhattacharyya gauges): ``scipy.stats`` and
    ``scipy.optimize`` would add about 0.9 s of start-up and 40 MB to each (``python -X
    importtime``), so it imports neither at module level."""
    z = (x - mean) / sd
    return float(-z * z / 2.0 - _LOG_SQRT_2PI - np.log(sd))


# ------------------------------------------------------------------ any dimension
def chernoff_exponent(alpha: float, mean1: Any, cov1: Any, mean2: Any, cov2: Any) -> float:
    """k(alpha) = -log of the integral of N1^alpha N2^(1-alpha).

    >>> chernoff_exponent(0.5, 0, 1, 2, 1)   # equal variances: alpha(1-alpha)/2 * dm^2
    0.5
    """
    g1, g2 = _pair(mean1, cov1, mean2, cov2)
    return _chernoff_k(float(alpha), g1, g2)


def _chernoff_k(alpha: float, g1: _Gaussian, g2: _Gaussian) -> float:
    if g1.diagonal and g2.diagonal:
        c1, c2 = g1.cov, g2.cov
    else:
        c1, c2 = g1.full(), g2.full()
    # N1^a N2^(1-a) combines the precisions: its covariance term is (1-a) S1 + a S2.
    mixed = (1.0 - alpha) * c1 + alpha * c2
    dm = g2.mean - g1.mean
    log_ratio = _log_det(mixed, "the mixture") - (1.0 - alpha) * _log_det(c1, "class 1") - (
        alpha * _log_det(c2, "class 2"))
    return 0.5 * alpha * (1.0 - alpha) * _quad(mixed, dm) + 0.5 * log_ratio


def chernoff_bound(
    mean1: Any, cov1: Any, mean2: Any, cov2: Any, priors: Any = (0.5, 0.5)
) -> ChernoffBound:
    """Chernoff bound min_alpha p1^alpha p2^(1-alpha) exp(-k(alpha)) and its alpha.

    >>> b = chernoff_bound(0, 1, 2, 1, priors=(0.8, 0.2))
    >>> round(b.bound, 4), round(b.alpha, 4)
    (0.1908, 0.1534)
    """
    g1, g2 = _pair(mean1, cov1, mean2, cov2)
    p1, p2 = _check_priors(priors)
    if p1 == 0 or p2 == 0:
        return ChernoffBound(0.0, 1.0 if p1 == 0 else 0.0)
    l1, l2 = np.log(p1), np.log(p2)

    def log_bound(a: float) -> float:
        return a * l1 + (1.0 - a) * l2 - _chernoff_k(a, g1, g2)

    # defer scipy.optimize (0.9 s, 40 MB at start-up; see _normal_logpdf) to the one bound
    # that uses it
    from scipy.optimize import minimize_scalar

    best = minimize_scalar(log_bound, bounds=(0.0, 1.0), method="bounded",
                           options={"xatol": 1e-10})
    candidates = [(float(best.fun), float(best.x)), (log_bound(0.0), 0.0), (log_bound(1.0), 1.0)]
    value, alpha = min(candidates)
    return ChernoffBound(float(np.exp(value)), alpha)


def bhattacharyya_distance(mean1: Any, cov1: Any, mean2: Any, cov2: Any) -> float:
    """D_B = 1/8 dm^T S^-1 dm + 1/2 ln(det S / sqrt(det S1 det S2)), S = (S1 + S2)/2.

    >>> round(bhattacharyya_distance(0, 1, 0, 4), 4)   # 1/2 ln(2.5 / 2)
    0.1116
    >>> bhattacharyya_distance([0, 0], [[1, 0], [0, 1]], [2, 0], [1, 1])
    0.5
    """
    g1, g2 = _pair(mean1, cov1, mean2, cov2)
    return float(_chernoff_k(0.5, g1, g2))


def bhattacharyya_bound(
    mean1: Any, cov1: Any, mean2: Any, cov2: Any, priors: Any = (0.5, 0.5)
) -> float:
    """sqrt(p1 p2) exp(-D_B): the Chernoff bound at alpha = 1/2.

    >>> round(bhattacharyya_bound(0, 1, 0, 4), 4)
    0.4472
    >>> round(bhattacharyya_bound(0, 1, 2, 1, priors=(0.8, 0.2)), 4)
    0.2426
    """
    p1, p2 = _check_priors(priors)
    return float(np.sqrt(p1 * p2) * np.exp(-bhattacharyya_distance(mean1, cov1, mean2, cov2)))
