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

from streamnb.drift.base import DRIFT_COOLDOWN_SAMPLES, DriftDetector
from streamnb.drift.quantiles import chi2_isf

#: Prior-shift G-test: false-alarm probability per check (Bonferroni over the windows).
PRIOR_SHIFT_ALPHA = 1e-5


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
            self._thresholds[df] = self._quantile(df)
        return self._thresholds[df]

    def _recent(self, w: int) -> np.ndarray:
        """Class indices of the last w labels, oldest first."""
        size = self._ring.shape[0]
        idx = (self._pos - w + np.arange(w)) % size
        return self._ring[idx]

    def _register(self, label: Any) -> int:
        """Give a new label the next class index."""
        k = self._index[label] = len(self.labels)
        self.labels.append(label)
        self._reference = np.append(self._reference, 0.0)
        for counts in self._window_counts:
            counts.append(0)
        return k

    def update(self, label: Any) -> bool:
        """Add one label; True on an alarm."""
        self.drift_detected = False
        self.n_seen += 1
        k = self._index.get(label)
        if k is None:
            k = self._register(label)
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
        """:meth:`update` with each label in turn (the same state, bit for bit, and alarms);
        ``(position, last_change)`` of each alarm.

        The counts of every check in a run of labels come from one cumulative count table
        (numpy, exact integers); the G statistics of all checks are screened in numpy and only
        those near their threshold are recomputed as :meth:`update` does (``_g_small``).

        >>> one, many = PriorShift(), PriorShift()
        >>> ys = ["ham"] * 300 + ["spam"] * 40
        >>> [i for i, y in enumerate(ys) if one.update(y)] == [i for i, _ in many.update_many(ys)]
        True
        """
        labels = labels if isinstance(labels, list) else list(labels)
        if not labels:
            return []
        alarms: list[tuple[int, dict[str, Any]]] = []
        ks = list(map(self._index.get, labels))
        start, n = 0, len(labels)
        while start < n:
            try:                                 # a run of known labels up to the next new one
                stop = ks.index(None, start)
            except ValueError:
                stop = n
            while start < stop:
                done, alarmed = self._advance(np.array(ks[start:min(stop, start + 1024)],
                                                       dtype=np.int64))
                start += done
                if alarmed:
                    alarms.append((start - 1, self.last_change))
            if stop < n:                         # registered just before its update, as there
                self._register(labels[stop])
                ks[stop:] = map(self._index.get, labels[stop:])
        self.drift_detected = bool(alarms) and alarms[-1][0] == n - 1
        return alarms

    def _advance(self, ks: np.ndarray) -> tuple[int, bool]:
        """:meth:`update` with the known class indices ``ks`` up to the first check whose
        G-test fires; return how many were taken and whether that check alarmed."""
        size, ring_len, pos, ring = self._ring.shape[0], self._ring_len, self._pos, self._ring
        m, n_classes = ks.shape[0], len(self.labels)
        old = (ring[pos:], ring[:pos]) if ring_len == size else (self._recent(ring_len),)
        seq = np.concatenate((*old, ks))                 # the regime's last labels, oldest first
        cum = np.zeros((n_classes, ring_len + m + 1), dtype=np.int64)   # [k, j]: k in seq[:j]
        np.cumsum(seq == np.arange(n_classes)[:, None], axis=1, out=cum[:, 1:])
        at = np.arange((-self.n_seen - 1) % self.check_every, m, self.check_every)
        taken, hit = m, None
        if at.size:                              # _check at each, from exact integer counts
            t = at + (ring_len + 1)                              # seq[:t] is taken there
            win = np.array(self.windows)[:, None]
            top = cum[:, t]
            base = top + self._reference[:, None]                # regime's counts (class, check)
            counts = top[:, None] - cum.take(t - win, axis=1, mode="clip")  # (class, win, check)
            table = np.empty((2, *counts.shape))
            table[0] = counts
            reference = table[1]
            np.subtract(base[:, None], counts, out=reference)
            n = base.sum(axis=0)
            ref_n = n - win                      # sum(reference) where the window is full
            ok = (win <= t) & (ref_n >= np.maximum(win, self.min_reference))
            df = (base > 0).sum(axis=0) - 1
            dfs = df.tolist()
            tested = ok & (df >= 1)
            thr_of: dict[int, float] = {}
            if tested.any():                     # G screened in numpy, close ones exactly
                some = tested.any(axis=0).tolist()
                thr_of = {d: self._thresholds[d] if d in self._thresholds else self._quantile(d)
                          for d in {d for d, y in zip(dfs, some, strict=True) if y}}
                thr: float | np.ndarray = next(iter(thr_of.values()))
                if len(thr_of) > 1:
                    thr = np.array([thr_of.get(d, np.inf) for d in dfs])
                # G = 2 sum O ln(O/E) <= 2 sum O (O/E - 1) = 2 (sum O^2/E - n): only the checks
                # whose bound passes the threshold (floating-point error << 1e-9 n) are tested
                rows = np.empty((2, 1, *ref_n.shape))
                rows[0, 0] = win
                np.maximum(ref_n, 1.0, out=rows[1, 0])
                o2_e = (table * table / (rows * np.maximum(base, 1.0)[:, None])).sum(axis=(0, 1))
                flag = tested & (2.0 * (o2_e * n - n) + 1e-9 * n > thr)
                if flag.any():
                    for c, i in np.argwhere(flag.T).tolist():    # as _check: in its order
                        g_c = _g_small(counts[:, i, c].tolist(), reference[:, i, c].tolist())
                        if g_c > thr_of[dfs[c]]:
                            hit = (c, i, g_c)
                            break
            last = hit[0] if hit else at.size - 1                # the last check taken
            if not self._thresholds.keys() >= thr_of.keys():
                for c in range(last + 1):        # cache the quantiles in _check's order
                    if tested[:, c].any():
                        self._threshold(dfs[c])
            reached = ok[-1, :last + (hit is None or hit[1] == len(win) - 1)].tolist()
            if True in reached:                  # the divergence of the last check reaching it
                c = len(reached) - 1 - reached[::-1].index(True)
                self.divergence = _js_small(counts[:, -1, c].tolist(),
                                            reference[:, -1, c].tolist())
            if hit:
                taken = int(at[last]) + 1
        self._take(ks[:taken], cum, ring_len)
        if hit is None:
            return taken, False
        c, i, g_c = hit
        return taken, self._fire(self.windows[i], g_c, dfs[c], counts[:, i, c].tolist(),
                                 reference[:, i, c].tolist())

    def _take(self, ks: np.ndarray, cum: np.ndarray, ring_len: int) -> None:
        """The state after :meth:`update` with ``ks``, checks aside (``cum``: the class counts
        of the prefixes of the regime's last ``ring_len`` labels then ``ks``)."""
        size, p = self._ring.shape[0], ks.shape[0]
        tail = min(p, size)                      # the labels left in the ring
        start = (self._pos + p - tail) % size
        first = min(tail, size - start)
        self._ring[start:start + first] = ks[p - tail:p - tail + first]
        self._ring[:tail - first] = ks[p - tail + first:]
        self._pos = (self._pos + p) % size
        t = ring_len + p
        self._ring_len = held_n = min(t, size)
        if t > size:                             # the labels that left the ring
            self._reference += cum[:, t - size]
        new = cum[:, t, None] - cum.take([t - min(w, held_n) for w in self.windows], axis=1)
        for counts, now in zip(self._window_counts, new.T.tolist(), strict=True):
            counts[:] = now
        self.n_seen += p

    def _quantile(self, df: int) -> float:
        """The G-test threshold for df degrees of freedom (cached by :meth:`_threshold`)."""
        return chi2_isf(self.alpha / len(self.windows), df)

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
                return self._fire(w, g, df, counts, reference)
        return False

    def _fire(self, w: int, g: float, df: int, counts: list, reference: list) -> bool:
        """Window w's test fired: start the new regime; True unless the alarm is cooled down."""
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
