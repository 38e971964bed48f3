"""Chi-square quantiles of the drift tests, from ``scipy.special``.

``scipy.stats.chi2`` computes these with the same special functions, but importing
``scipy.stats`` costs a worker about 0.9 s of start-up and 40 MB of memory (with
``scipy.optimize``, which it imports; ``python -X importtime``): the daemon imports
neither. The values are those of ``scipy.stats.chi2`` bit for bit
(tests/streamnb/drift/test_drift.py checks).

>>> round(chi2_isf(0.05, 1), 6), round(chi2_ppf(0.95, 1), 6)
(3.841459, 3.841459)
"""

from __future__ import annotations

from scipy.special import chdtri, gammaincinv


def chi2_isf(q: float, df: float) -> float:
    """The x with P(X > x) = q for X ~ chi-square(df): ``scipy.stats.chi2.isf(q, df)``."""
    return float(chdtri(df, q))


def chi2_ppf(p: float, df: float) -> float:
    """The x with P(X <= x) = p for X ~ chi-square(df): ``scipy.stats.chi2.ppf(p, df)``."""
    return float(2.0 * gammaincinv(df / 2.0, p))
