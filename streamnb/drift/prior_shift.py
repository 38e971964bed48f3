"""Prior shift: the class shares of the recent labels against the shares before them.

Every ``check_every`` labels, for each window size w in ``windows``, the last w labels are
compared with all earlier labels of the current regime by a two-sample G-test
(G = 2 sum O ln(O/E) over the 2 x K table, asymptotically chi-square with K-1 degrees of
freedom under "same shares"). The threshold is the chi-square quantile at
``alpha / len(windows)`` (Bonferroni), so a check alarms falsely with probability at most
``alpha`` (asymptotically): at most ``alpha * N / check_every`` false alarms over N stable
labels. Short windows catch large shifts fast, long windows catch small ones. After an alarm
the labels before the alarming window are forgotten: the window starts the new regime.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from scipy.stats import chi2

from streamnb.constants import DRIFT_COOLDOWN_SAMPLES, PRIOR_SHIFT_ALPHA
from streamnb.drift.base import DriftDetector


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence (nats) between two share vectors (normalised here).

    >>> round(js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])), 4)  # ln 2
    0.6931
    >>> js_divergence(np.array([3.0, 1.0]), np.array([0.75, 0.25]))
    0.0
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.sum() <= 0 or q.sum() <= 0:
        return 0.0
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log(a[nz] / m[nz])))

    return max(0.0, (kl(p) + kl(q)) / 2)


def _js_small(p: list, q: list) -> float:
    """:func:`js_divergence` in plain Python (faster for a handful of classes)."""
    sp, sq = float(sum(p)), float(sum(q))
    if sp <= 0 or sq <= 0:
        return 0.0
    js = 0.0
    for a, b in zip(p, q, strict=True):
        a, b = a / sp, b / sq
        m = (a + b) / 2
        if a > 0:
            js += a * math.log(a / m)
        if b > 0:
            js += b * math.log(b / m)
    return max(0.0, js / 2)


def _g_small(recent: list, reference: list) -> float:
    """:func:`g_statistic` in plain Python (faster for a handful of classes)."""
    n_r, n_c = float(sum(recent)), float(sum(reference))
    n = n_r + n_c
    if n_r <= 0 or n_c <= 0:
        return 0.0
    g = 0.0
    for a, b in zip(recent, reference, strict=True):
        col = a + b
        if a > 0:
            g += a * math.log(a * n / (n_r * col))
        if b > 0:
            g += b * math.log(b * n / (n_c * col))
    return 2.0 * g


def g_statistic(recent: np.ndarray, reference: np.ndarray) -> float:
    """Two-sample G statistic of two count vectors (0 when either is empty).

    >>> round(g_statistic(np.array([10.0, 10.0]), np.array([10.0, 10.0])), 6)
    0.0
    """
    table = np.vstack([recent, reference]).astype(np.float64)
    n = table.sum()
    if n <= 0 or table[0].sum() <= 0 or table[1].sum() <= 0:
        return 0.0
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / n
    nz = table > 0
    return float(2.0 * np.sum(table[nz] * np.log(table[nz] / expected[nz])))


class PriorShift(DriftDetector):
    """Multi-window G-test of class shares; ``divergence`` is the JS divergence (nats) between
    the longest recent window and the reference.

    >>> import random
    >>> rng = random.Random(0)
    >>> d = PriorShift()
    >>> labels = ["spam" if rng.random() < 0.05 else "ham" for _ in range(2000)]
    >>> labels += ["spam" if rng.random() < 0.3 else "ham" for _ in range(500)]
    >>> alarms = [i for i, y in enumerate(labels) if d.update(y)]
    >>> len(alarms) >= 1 and 2000 <= alarms[0] < 2300
    True
    >>> sorted(d.last_change["recent_shares"])
    ['ham', 'spam']
    """

    name = "prior_shift"

    def __init__(self, windows: tuple[int, ...] = (32, 64, 128, 256), check_every: int = 8,
                 alpha: float = PRIOR_SHIFT_ALPHA, min_reference: int = 200,
                 cooldown: int = DRIFT_COOLDOWN_SAMPLES) -> None:
        super().__init__(cooldown)
        if not windows or min(windows) < 2:
            raise ValueError(f"windows must be sizes >= 2, got {windows}")
        if not 0 < alpha < 1 or check_every < 1:
            raise ValueError(f"need 0 < alpha < 1 and check_every >= 1, got {alpha}, {check_every}")
        self.windows = tuple(sorted(windows))
        self.check_every = check_every
        self.alpha = alpha
        self.min_reference = min_reference
        self.labels: list[Any] = []            # class index -> label
        self._index: dict[Any, int] = {}
        self._ring = np.zeros(self.windows[-1], dtype=np.int64)
        self._ring_len = 0                      # labels in the ring (<= its size)
        self._pos = 0                           # next write position
        self._reference = np.zeros(0)           # counts of labels older than the ring
        self._window_counts: list[list[int]] = [[] for _ in self.windows]
        self.divergence = 0.0
        self._thresholds: dict[int, float] = {}

    def _threshold(self, df: int) -> float:
        if df not in self._thresholds:
            self._thresholds[df] = float(chi2.isf(self.alpha / len(self.windows), df))
        return self._thresholds[df]

    def _recent(self, w: int) -> np.ndarray:
        """Class indices of the last w labels, oldest first."""
        size = self._ring.shape[0]
        idx = (self._pos - w + np.arange(w)) % size
        return self._ring[idx]

    def update(self, label: Any) -> bool:
        """Add one label; True on an alarm."""
        self.drift_detected = False
        self.n_seen += 1
        k = self._index.get(label)
        if k is None:
            k = self._index[label] = len(self.labels)
            self.labels.append(label)
            self._reference = np.append(self._reference, 0.0)
            for counts in self._window_counts:
                counts.append(0)
        size = self._ring.shape[0]
        ring = self._ring
        for w, counts in zip(self.windows, self._window_counts, strict=True):
            if self._ring_len >= w:                      # the label leaving window w
                counts[ring[(self._pos - w) % size]] -= 1
            counts[k] += 1
        if self._ring_len == size:
            self._reference[ring[self._pos]] += 1.0
        else:
            self._ring_len += 1
        ring[self._pos] = k
        self._pos = (self._pos + 1) % size
        if self.n_seen % self.check_every:
            return False
        return self._check()

    def update_many(self, labels: Iterable[Any]) -> list[tuple[int, dict[str, Any]]]:
        """:meth:`update` with each label in turn; ``(position, last_change)`` of each alarm.

        >>> one, many = PriorShift(), PriorShift()
        >>> ys = ["ham"] * 300 + ["spam"] * 40
        >>> [i for i, y in enumerate(ys) if one.update(y)] == [i for i, _ in many.update_many(ys)]
        True
        """
        update = self.update
        return [(i, self.last_change) for i, y in enumerate(labels) if update(y)]

    def _check(self) -> bool:
        held = self._window_counts[-1] if self._ring_len == self._ring.shape[0] else (
            np.bincount(self._recent(self._ring_len), minlength=len(self.labels)).tolist())
        base = [r + h for r, h in zip(self._reference.tolist(), held, strict=True)]
        for w, counts in zip(self.windows, self._window_counts, strict=True):
            if w > self._ring_len:
                break
            reference = [b - c for b, c in zip(base, counts, strict=True)]
            if sum(reference) < max(self.min_reference, w):
                continue
            if w == self.windows[-1]:
                self.divergence = _js_small(counts, reference)
            df = sum(1 for c, r in zip(counts, reference, strict=True) if c + r > 0) - 1
            if df < 1:
                continue
            g = _g_small(counts, reference)
            if g > self._threshold(df):
                recent_a = np.array(counts, dtype=np.float64)
                reference_a = np.array(reference, dtype=np.float64)
                change = {
                    "window": w, "g": g, "threshold": self._threshold(df),
                    "divergence": js_divergence(recent_a, reference_a),
                    "recent_shares": self._shares(recent_a),
                    "reference_shares": self._shares(reference_a),
                }
                self._new_regime(w)
                return self._alarm(change)
        return False

    def _shares(self, counts: np.ndarray) -> dict[str, float]:
        total = counts.sum()
        return {str(lab): float(c / total) for lab, c in zip(self.labels, counts, strict=True)}

    def _new_regime(self, w: int) -> None:
        """Forget everything but the last w labels."""
        keep = self._recent(w)
        self._ring[:] = 0
        self._ring[:w] = keep
        self._ring_len = w
        self._pos = w % self._ring.shape[0]
        self._reference = np.zeros(len(self.labels))
        for v, counts in zip(self.windows, self._window_counts, strict=True):
            counts[:] = np.bincount(self._recent(min(v, w)), minlength=len(self.labels)).tolist()

    def _state(self) -> dict[str, Any]:
        held = np.bincount(self._recent(self._ring_len), minlength=len(self.labels))
        total = self._reference + held
        return {"divergence": self.divergence,
                "shares": self._shares(total) if total.sum() else {}}
