"""Gaussian feature drift: recent per-class moments against the reference (the model's).

For one class with recent moments (n_r, mean m_r, variances v_r) and reference moments
(n_0, m_0, v_0), the reported divergence is the J-divergence (symmetric KL, nats) of the two
diagonal Gaussians,

    J = sum_j 1/2 (v_r/v_0 + v_0/v_r - 2) + 1/2 (m_r - m_0)^2 (1/v_r + 1/v_0),

which is 1 per feature whose mean moved by one standard deviation. The alarm is decided by two
tests whose false-alarm rate is exact for Gaussian features when the reference is large:

- means: ``n_eff * sum_j (m_r - m_0)^2 / v_0`` with ``n_eff = n_r n_0 / (n_r + n_0)`` is
  chi-square with d degrees of freedom; alarm above its ``1 - alpha/2`` quantile;
- variances: ``(n_r - 1) v_r / v_0`` is chi-square with ``n_r - 1`` degrees of freedom per
  feature; alarm outside its two-sided ``alpha / (2d)`` band (Bonferroni over features).

So a test alarms falsely with probability at most ``alpha``: at most ``alpha * N / window``
false alarms over N stable samples of a class. (Small windows with a J threshold instead
alarmed far more often than nominal: the variance term is heavy-tailed.)

:meth:`GaussianDrift.test` compares given moments (the worker's observer passes the model's
statistics before and after a window of updates); :meth:`GaussianDrift.update` is the
per-sample form, which keeps its own reference and tumbling windows of ``window`` samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamnb.drift.base import DRIFT_COOLDOWN_SAMPLES, DriftDetector
from streamnb.drift.quantiles import chi2_isf, chi2_ppf

#: Gaussian feature drift: false-alarm probability per window test (chi-square tests).
GAUSSIAN_DRIFT_ALPHA = 1e-5

#: Variances are floored at this fraction of the largest one (plus a tiny absolute floor).
VAR_FLOOR = 1e-9


@dataclass
class Moments:
    """Weighted count, mean and sum of squared deviations (per feature) of one class."""

    n: float = 0.0
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    m2: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def add(self, x: np.ndarray) -> None:
        """Welford's update with one sample."""
        x = np.asarray(x, dtype=np.float64)
        if self.n == 0:
            self.mean, self.m2 = np.zeros_like(x), np.zeros_like(x)
        self.n += 1
        d = x - self.mean
        self.mean = self.mean + d / self.n
        self.m2 = self.m2 + d * (x - self.mean)

    def merge(self, other: Moments) -> None:
        """Chan et al.'s parallel combination."""
        if other.n == 0:
            return
        if self.n == 0:
            self.n, self.mean, self.m2 = other.n, other.mean.copy(), other.m2.copy()
            return
        n = self.n + other.n
        d = other.mean - self.mean
        self.m2 = self.m2 + other.m2 + d * d * self.n * other.n / n
        self.mean = self.mean + d * other.n / n
        self.n = n

    def minus(self, part: Moments) -> Moments:
        """The moments of the samples in ``self`` but not in ``part`` (Chan's formula inverted).

        >>> a, b = Moments(), Moments()
        >>> for v in (1.0, 2.0, 6.0):
        ...     a.add(np.array([v]))
        >>> b.add(np.array([1.0]))
        >>> rest = a.minus(b)
        >>> rest.n, rest.mean.tolist(), rest.m2.tolist()   # the moments of [2, 6]
        (2.0, [4.0], [8.0])
        """
        n_b = self.n - part.n
        if n_b <= 0:
            return Moments()
        if part.n <= 0:
            return Moments(self.n, self.mean.copy(), self.m2.copy())
        mean_b = (self.n * self.mean - part.n * part.mean) / n_b
        d = part.mean - mean_b
        m2_b = self.m2 - part.m2 - d * d * part.n * n_b / self.n
        return Moments(float(n_b), mean_b, np.maximum(m2_b, 0.0))

    @property
    def var(self) -> np.ndarray:
        return self.m2 / self.n if self.n > 0 else np.zeros_like(self.m2)


def j_divergence(mean_a: np.ndarray, var_a: np.ndarray, mean_b: np.ndarray,
                 var_b: np.ndarray) -> float:
    """J-divergence (symmetric KL, nats) between two diagonal Gaussians.

    >>> j_divergence(np.array([1.0]), np.array([1.0]), np.array([0.0]), np.array([1.0]))
    1.0
    >>> j_divergence(np.zeros(2), np.ones(2), np.zeros(2), np.ones(2))
    0.0
    """
    var_a = np.asarray(var_a, dtype=np.float64)
    var_b = np.asarray(var_b, dtype=np.float64)
    floor = VAR_FLOOR * max(float(np.max(var_a, initial=0.0)), float(np.max(var_b, initial=0.0)),
                            1e-300)
    va, vb = np.maximum(var_a, floor), np.maximum(var_b, floor)
    d2 = (np.asarray(mean_a, dtype=np.float64) - np.asarray(mean_b, dtype=np.float64)) ** 2
    return float(np.sum(0.5 * (va / vb + vb / va - 2.0) + 0.5 * d2 * (1.0 / va + 1.0 / vb)))


class GaussianDrift(DriftDetector):
    """Per-class J-divergence test of recent Gaussian moments against the reference.

    >>> rng = np.random.default_rng(0)
    >>> d = GaussianDrift()
    >>> xs = np.concatenate([rng.normal(0, 1, (1000, 2)), rng.normal([1, 0], 1, (300, 2))])
    >>> alarms = [i for i, x in enumerate(xs) if d.update(x, "a")]
    >>> 1000 <= alarms[0] < 1100
    True
    >>> d.last_change["feature"], d.last_change["label"], d.last_change["moved"]
    (0, 'a', 'mean')
    """

    name = "gaussian"

    def __init__(self, window: int = 25, alpha: float = GAUSSIAN_DRIFT_ALPHA,
                 min_reference: int = 100, min_divergence: float = 0.0,
                 cooldown: int = DRIFT_COOLDOWN_SAMPLES) -> None:
        super().__init__(cooldown)
        #: Changes whose J-divergence is below this are not alarms, however significant
        #: (with thousands of samples per test, tiny real changes are significant).
        self.min_divergence = min_divergence
        if window < 2 or not 0 < alpha < 1:
            raise ValueError(f"need window >= 2 and 0 < alpha < 1, got {window}, {alpha}")
        self.window, self.alpha, self.min_reference = window, alpha, min_reference
        #: Latest J-divergence per class label (the ``feature_drift_divergence`` gauge).
        self.divergence: dict[Any, float] = {}
        self._reference: dict[Any, Moments] = {}
        self._recent: dict[Any, Moments] = {}
        self._cache: dict[tuple[float, int], tuple[float, float, float]] = {}

    def _thresholds(self, n_r: float, d: int) -> tuple[float, float, float]:
        key = (round(n_r, 6), d)
        if key not in self._cache:
            df = max(n_r - 1.0, 1.0)
            self._cache[key] = (chi2_isf(self.alpha / 2, d),
                                chi2_ppf(self.alpha / (4 * d), df),
                                chi2_isf(self.alpha / (4 * d), df))
            if len(self._cache) > 4096:
                self._cache.clear()
        return self._cache[key]

    def test(self, label: Any, recent: Moments, reference: Moments) -> bool:
        """Compare one class's recent moments with its reference; True on an alarm.

        The ``recent.n`` samples count as updates for the cool-down."""
        self.n_seen += int(round(recent.n))
        return self._test(label, recent, reference)

    def _test(self, label: Any, recent: Moments, reference: Moments) -> bool:
        self.drift_detected = False
        if recent.n < 2 or reference.n < self.min_reference:
            return False
        va, v0 = recent.var, reference.var
        floor = VAR_FLOOR * max(float(va.max(initial=0)), float(v0.max(initial=0)), 1e-300)
        va, v0 = np.maximum(va, floor), np.maximum(v0, floor)
        dm2 = (recent.mean - reference.mean) ** 2
        per_feature = 0.5 * (va / v0 + v0 / va - 2) + 0.5 * dm2 * (1 / va + 1 / v0)
        j = float(per_feature.sum())
        self.divergence[label] = j
        d = recent.mean.shape[0]
        n_eff = recent.n * reference.n / (recent.n + reference.n)
        mean_limit, var_low, var_high = self._thresholds(recent.n, d)
        if j < self.min_divergence:
            return False
        mean_stat = n_eff * float(np.sum(dm2 / v0))
        var_stat = (recent.n - 1.0) * va / v0
        if mean_stat > mean_limit:
            moved, statistic = "mean", mean_stat
            worst = int(np.argmax(dm2 / v0))
        elif np.any(var_stat < var_low) or np.any(var_stat > var_high):
            moved, statistic = "variance", float(np.max(np.abs(np.log(va / v0))))
            worst = int(np.argmax(np.abs(np.log(va / v0))))
        else:
            return False
        return self._alarm({
            "label": label if isinstance(label, (str, int)) else str(label), "moved": moved,
            "divergence": j, "statistic": statistic, "feature": worst,
            "recent_mean": float(recent.mean[worst]), "reference_mean": float(reference.mean[worst]),
            "recent_var": float(va[worst]), "reference_var": float(v0[worst]),
            "samples": float(recent.n),
        })

    def update(self, x: Any, label: Any = None) -> bool:
        """Add one sample of class ``label``; the test runs when its window is full."""
        self.drift_detected = False
        self.n_seen += 1
        recent = self._recent.setdefault(label, Moments())
        recent.add(np.asarray(x, dtype=np.float64).ravel())
        if recent.n < self.window:
            return False
        reference = self._reference.setdefault(label, Moments())
        alarm = self._test(label, recent, reference)
        if alarm:
            self._reference[label] = recent       # the window starts the new regime
        else:
            reference.merge(recent)
        self._recent[label] = Moments()
        return alarm

    def _state(self) -> dict[str, Any]:
        return {"divergence": {str(k): v for k, v in self.divergence.items()},
                "max_divergence": max(self.divergence.values(), default=0.0)}
