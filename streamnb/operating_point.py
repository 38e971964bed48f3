"""An operating point held from recent labelled scores: a threshold on the score that keeps
the false-positive rate under a target, and a calibrated probability of the positive class.

A :class:`ScoreWindow` holds the scores of the last ``size`` labelled predictions, each as
its score bin and its class (negative or positive), in the order they were learnt, and the
counts per bin and class of what it holds. Every ``refit_every`` labelled predictions it
fits its :class:`OperatingPoint` from those counts:

- with ``target_fpr``: the lowest bin edge t such that, of the n negatives in the window,
  the k that score at or above t give a one-sided Clopper-Pearson upper bound on the
  false-positive rate at ``confidence`` (95%) of at most the target
  (:func:`fp_upper_bound`). A message is positive when its score is >= t. While the window
  holds too few negatives for any k (no false positive among n still bounds the rate above
  the target: n < log(1 - confidence) / log(1 - target), 2995 at 0.001) the point is
  ``supported: False`` and t is just above the highest negative score held, never below 0
  (the argmax);
- with ``calibration`` (``isotonic`` or ``platt``, :mod:`streamnb.calibration`): the map
  score -> P(positive).

With ``prior_half_life`` h (and a calibration) it also follows the class mix of the labelled
predictions: each one added multiplies the weights of those before it by 2^(-1/h), and the
prior in use is P(positive) = (positive weight + 1) / (all weight + 2), updated at every
label (:attr:`ScoreWindow.prior`). A calibrated probability p, fitted on the window's mix
pi = (positives + 1) / (all + 2), is moved to that prior by Saerens, Latinne &
Decaestecker's (2002) rule (:func:`streamnb.calibration.adjust_to_prior`), and without a
target the label is the positive class when the moved probability is above 1/2 (while the
calibrator has seen both classes; before, the label is left as decided).

It changes only by :meth:`ScoreWindow.add`, in the order the labelled predictions were
made, so two holders that added the same codes hold the same window and point, bit for
bit. :meth:`ScoreWindow.walk` gives, for a run of predictions, the point each one sees
(that of the window with the labelled ones before it added), without changing the window.

>>> w = ScoreWindow(size=10_000, score="log_odds", target_fpr=0.01, refit_every=1)
>>> w.add([w.code(-3.0, False)] * 400 + [w.code(2.0, False)] * 2 + [w.code(4.0, True)] * 50)
>>> w.point.supported, w.point.n_negative, w.point.threshold
(True, 402, 2.5)
>>> round(fp_upper_bound(2, 402), 5)
0.01558
>>> w = ScoreWindow(size=100, score="log_odds", calibration="isotonic", refit_every=4,
...                 prior_half_life=1.0)
>>> w.add([w.code(-3.0, False), w.code(3.0, True), w.code(-3.0, False), w.code(3.0, False)])
>>> w.recent, w.prior  # (weights 1/8, 1/4, 1/2 and 1; prior (0.25 + 1) / (1.875 + 2))
((1.625, 0.25), 0.3225806451612903)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamnb.calibration import CALIBRATIONS, Calibrator, adjust_to_prior, fit_calibrator
from streamnb.decision import UNSURE
from streamnb.encoding import dumps, loads, pack_array, unpack_array
from streamnb.exceptions import FormatError

__all__ = ["CONFIDENCE", "DEFAULT_WINDOW", "N_BINS", "REFIT_EVERY", "SCORE_RANGES",
           "Judged", "OperatingPoint", "ScoreWindow", "fp_upper_bound", "max_false_positives"]

#: The score range binned, per kind of score (``DecisionRule.score``); a score beyond it
#: falls in the end bin.
SCORE_RANGES = {"per_feature": (-5.0, 5.0), "log_odds": (-500.0, 500.0)}
#: Equal-width score bins (0.005 of a per-feature score, 0.5 of a log-odds).
N_BINS = 2000
#: Labelled predictions between two fits of the operating point.
REFIT_EVERY = 100
#: Labelled predictions the window holds by default.
DEFAULT_WINDOW = 20_000
#: The confidence of the false-positive bound.
CONFIDENCE = 0.95
_FORMAT = "streamnb.score_window"


def fp_upper_bound(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson upper bound on a rate seen as ``k`` in ``n``: the rate p
    at which P(X <= k) = 1 - confidence for X ~ Binomial(n, p); 1 when k >= n (or n = 0).

    >>> round(fp_upper_bound(0, 2995), 7), round(fp_upper_bound(0, 2994), 7)  # 1 - 0.05 ** (1 / n)
    (0.0009997, 0.0010001)
    """
    if n <= 0 or k >= n:
        return 1.0
    if k <= 0:
        return -math.expm1(math.log1p(-confidence) / n)
    # defer scipy to the windows with a target (ScoreWindow imports it when it is made,
    # so that no worker pays for the import inside its ordered section)
    from scipy.special import betaincinv

    return float(betaincinv(k + 1, n - k, confidence))  # (the Beta(k+1, n-k) quantile)


def max_false_positives(n: int, target: float, confidence: float = CONFIDENCE) -> int:
    """The largest k whose :func:`fp_upper_bound` in ``n`` is at most ``target``; -1 if even
    0 is not (too few negatives to support the target).

    >>> max_false_positives(2994, 0.001), max_false_positives(2995, 0.001)
    (-1, 0)
    >>> max_false_positives(10_000, 0.001)
    4
    """
    if fp_upper_bound(0, n, confidence) > target:
        return -1
    lo, hi = 0, n - 1  # bound(lo) <= target; the bound grows with k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fp_upper_bound(mid, n, confidence) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class Judged:
    """:meth:`ScoreWindow.judge`'s answer: per prediction its label, the threshold and the
    calibrated P(positive) it was judged with (None: no score, or none held), its code
    (None: not added to the window) and the followed prior P(positive) its probability was
    moved to (None: not moved)."""

    labels: list[Any]
    thresholds: list[float | None]
    probas: list[float | None]
    codes: list[int | None]
    priors: list[float | None]


@dataclass(frozen=True)
class OperatingPoint:
    """What the window gives a prediction: the score threshold (positive when the score is
    >= it; None without a target), whether the window supports the target, the negatives
    and positives it was fitted on, and the calibrator (None without one)."""

    threshold: float | None = None
    supported: bool = False
    n_negative: int = 0
    n_positive: int = 0
    calibrator: Calibrator | None = None


class ScoreWindow:
    """The last ``size`` labelled scores and the operating point fitted on them (see the
    module docstring)."""

    def __init__(self, size: int = DEFAULT_WINDOW, score: str = "per_feature",
                 target_fpr: float | None = None, calibration: str | None = None,
                 confidence: float = CONFIDENCE, refit_every: int = REFIT_EVERY,
                 prior_half_life: float | None = None) -> None:
        if score not in SCORE_RANGES:
            raise ValueError(f"score must be one of {sorted(SCORE_RANGES)}, got {score!r}")
        if not (isinstance(size, int) and size >= 1):
            raise ValueError(f"the window must hold at least 1 score, got {size!r}")
        if target_fpr is not None and not 0.0 < target_fpr < 1.0:
            raise ValueError(f"target_fpr must lie in (0, 1), got {target_fpr!r}")
        if calibration is not None and calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {list(CALIBRATIONS)}, got {calibration!r}")
        if prior_half_life is not None and not (math.isfinite(prior_half_life)
                                                and prior_half_life > 0):
            raise ValueError(f"prior_half_life must be a number > 0, got {prior_half_life!r}")
        if target_fpr is not None:
            # defer scipy to the windows with a target, imported here, when a replica
            # is made, rather than at the first fit, in the middle of a batch
            import scipy.special  # noqa: F401
        self.size, self.score, self.target_fpr = size, score, target_fpr
        self.calibration, self.confidence, self.refit_every = calibration, confidence, refit_every
        self.prior_half_life = prior_half_life
        self.decay = 0.5 ** (1.0 / prior_half_life) if prior_half_life is not None else 1.0
        #: The labelled predictions' weights (negative, positive), each multiplied by
        #: ``decay`` at every later one (with ``prior_half_life``).
        self.recent = (0.0, 0.0)
        self.lo, self.hi = SCORE_RANGES[score]
        self.width = (self.hi - self.lo) / N_BINS
        self.centres = self.lo + (np.arange(N_BINS) + 0.5) * self.width
        #: The window, oldest overwritten first: bin * 2 + (1 if positive), -1 when empty.
        self.ring = np.full(size, -1, dtype=np.int32)
        #: Labelled scores ever added (the next one goes to ring[total % size]).
        self.total = 0
        #: Counts held per class (row 0 negative, 1 positive) and bin.
        self.counts = np.zeros((2, N_BINS), dtype=np.int64)
        #: The counts the operating point was last fitted on.
        self.fitted = self.counts.copy()
        self._k_max: dict[int, int] = {}
        self.point = self._fit(self.fitted)

    # ------------------------------------------------------------------ adding
    def code(self, score: float, positive: bool) -> int:
        """The code of a labelled ``score`` (its bin, and its class)."""
        b = int(min(max(math.floor((score - self.lo) / self.width), 0), N_BINS - 1))
        return 2 * b + (1 if positive else 0)

    def add(self, codes: Any) -> None:
        """Add labelled scores' codes, in the order they were predicted."""
        for c in codes:
            self._add_one(int(c))

    def _add_one(self, c: int) -> None:
        if not 0 <= c < 2 * N_BINS:
            raise FormatError(f"a score code must lie in [0, {2 * N_BINS}), got {c}")
        at = self.total % self.size
        old = int(self.ring[at])
        if old >= 0:
            self.counts[old & 1, old >> 1] -= 1
        self.ring[at] = c
        self.counts[c & 1, c >> 1] += 1
        self.total += 1
        if self.prior_half_life is not None:
            neg, pos = self.recent
            self.recent = (self.decay * neg + (1 - (c & 1)), self.decay * pos + (c & 1))
        if self.total % self.refit_every == 0:
            self.fitted = self.counts.copy()
            self.point = self._fit(self.fitted)

    @property
    def prior(self) -> float | None:
        """The followed prior P(positive) (None without ``prior_half_life``)."""
        if self.prior_half_life is None:
            return None
        neg, pos = self.recent
        return (pos + 1.0) / (neg + pos + 2.0)

    def walk(self, scores: Any, truth: Any, priors: list[float | None] | None = None,
             ) -> tuple[list[OperatingPoint], list[int | None]]:
        """For predictions in order (``scores``, NaN for none; ``truth``: 1 positive, 0
        negative, -1 unlabelled): the point each one sees, and the code of each that is
        added (labelled, with a score; else None): what :meth:`add` is given for them;
        ``priors``, if given, gets the followed prior each one sees. The window is
        unchanged."""
        points: list[OperatingPoint] = []
        codes: list[int | None] = []
        w: ScoreWindow | None = None
        for s, t in zip(np.asarray(scores, dtype=np.float64).tolist(), list(truth), strict=True):
            points.append((w or self).point)
            if priors is not None:
                priors.append((w or self).prior)
            c = None
            if t >= 0 and s == s:
                if w is None:
                    w = self.copy()
                c = self.code(s, t == 1)
                w._add_one(c)
            codes.append(c)
        return points, codes

    def judge(self, scores: Sequence[float | None], labels: Sequence[Any],
              true_labels: Sequence[Any], positive: Any, negative: Any) -> Judged:
        """Judge predictions in order: ``scores`` (None: no score), the ``labels`` decided
        without the window (None and ``"unsure"`` are kept), the ``true_labels`` (None:
        unlabelled; neither class: not added). With a target, a scored label becomes
        ``positive`` when the score is >= the threshold its point holds, else ``negative``;
        with a followed prior and no target, when its moved probability is above 1/2.

        >>> w = ScoreWindow(size=1000, score="log_odds", target_fpr=0.5, refit_every=1)
        >>> j = w.judge([1.0, 3.0, None, 1.2], ["spam", "spam", None, "spam"],
        ...             ["ham", None, "ham", None], "spam", "ham")
        >>> j.labels, j.thresholds, j.codes, w.total
        (['spam', 'spam', None, 'ham'], [0.0, 1.5, None, 1.5], [2004, None, None, None], 0)
        """
        truth = [-1 if t is None else 1 if t == positive else 0 if t == negative else -1
                 for t in true_labels]
        priors: list[float | None] = []
        points, codes = self.walk([math.nan if s is None else s for s in scores], truth, priors)
        n = len(points)
        out = Judged(list(labels), [None] * n, [None] * n, codes, [None] * n)
        for i, (s, pt) in enumerate(zip(scores, points, strict=True)):
            if s is None:
                continue
            out.thresholds[i] = pt.threshold
            if pt.calibrator is not None:
                out.probas[i] = float(pt.calibrator(s))
                if priors[i] is not None and pt.n_negative and pt.n_positive:
                    self._follow_prior(out, i, pt, priors[i], positive, negative)
            if pt.threshold is not None and out.labels[i] not in (None, UNSURE):
                out.labels[i] = positive if s >= pt.threshold else negative
        return out

    @staticmethod
    def _follow_prior(out: Judged, i: int, pt: OperatingPoint, prior: float,
                      positive: Any, negative: Any) -> None:
        """Move prediction ``i``'s probability from the mix ``pt`` was fitted on to
        ``prior``, and (no target) decide its label by it."""
        fitted = (pt.n_positive + 1.0) / (pt.n_positive + pt.n_negative + 2.0)
        p = adjust_to_prior(out.probas[i], fitted, prior)
        out.probas[i], out.priors[i] = p, prior
        if pt.threshold is None and out.labels[i] not in (None, UNSURE):
            out.labels[i] = positive if p > 0.5 else negative

    def copy(self) -> ScoreWindow:
        out = object.__new__(ScoreWindow)
        out.__dict__.update(self.__dict__)
        out.ring, out.counts = self.ring.copy(), self.counts.copy()
        return out

    # ------------------------------------------------------------------ fitting
    def _fit(self, counts: np.ndarray) -> OperatingPoint:
        neg, pos = counts[0], counts[1]
        n_neg, n_pos = int(neg.sum()), int(pos.sum())
        threshold, supported = None, False
        if self.target_fpr is not None:
            threshold, supported = self._threshold(neg, n_neg)
        cal = (fit_calibrator(self.calibration, self.centres, pos, neg)
               if self.calibration is not None else None)
        return OperatingPoint(threshold, supported, n_neg, n_pos, cal)

    def _threshold(self, neg: np.ndarray, n: int) -> tuple[float, bool]:
        """(threshold, supported) for the negatives ``neg`` per bin (n in all)."""
        k_max = self._k_max.get(n)
        if k_max is None:
            assert self.target_fpr is not None
            k_max = max_false_positives(n, self.target_fpr, self.confidence)
            if len(self._k_max) > 4096:
                self._k_max.clear()
            self._k_max[n] = k_max
        # at_or_above[j]: negatives in bins >= j (j = N_BINS: none)
        at_or_above = np.concatenate([np.cumsum(neg[::-1])[::-1], [0]])
        j = int(np.argmax(at_or_above <= max(k_max, 0)))  # the first bin edge that holds it
        edge = -math.inf if j == 0 else math.inf if j == N_BINS else self.lo + j * self.width
        if k_max < 0:
            return max(edge, 0.0), False
        return edge, True

    # ------------------------------------------------------------------ bytes
    def to_bytes(self) -> bytes:
        """The window's state (its settings are the model's: given again to load it)."""
        state = {"format": _FORMAT, "version": 1, "size": self.size, "score": self.score,
                 "total": self.total, "ring": pack_array(self.ring),
                 "fitted": pack_array(self.fitted)}
        if self.prior_half_life is not None:
            state["recent"] = list(self.recent)
        return dumps(state)

    def load_bytes(self, data: bytes) -> ScoreWindow:
        """Take the state of :meth:`to_bytes` (FormatError if it does not fit the settings).

        >>> w = ScoreWindow(size=4, target_fpr=0.5, refit_every=2)
        >>> w.add([w.code(0.1, False), w.code(0.2, True), w.code(-0.3, False)])
        >>> v = ScoreWindow(size=4, target_fpr=0.5, refit_every=2).load_bytes(w.to_bytes())
        >>> v.total, bool((v.counts == w.counts).all()), v.point == w.point
        (3, True, True)
        """
        obj = loads(data)
        if not isinstance(obj, dict) or obj.get("format") != _FORMAT or obj.get("version") != 1:
            raise FormatError("not a score window")
        if obj.get("size") != self.size or obj.get("score") != self.score:
            raise FormatError(f"a window of {obj.get('size')} {obj.get('score')} scores, the "
                              f"model's holds {self.size} {self.score}")
        ring = unpack_array(obj["ring"], dtype="<i4", ndim=1)
        fitted = unpack_array(obj["fitted"], dtype="<i8", ndim=2)
        total = obj.get("total")
        if ring.shape != (self.size,) or fitted.shape != (2, N_BINS) or \
                not isinstance(total, int) or total < 0 or (fitted < 0).any() or \
                ((ring < -1) | (ring >= 2 * N_BINS)).any():
            raise FormatError("score window arrays of the wrong shape or values")
        counts = np.zeros((2, N_BINS), dtype=np.int64)
        held = ring[ring >= 0].astype(np.int64)
        np.add.at(counts, (held & 1, held >> 1), 1)
        self.ring, self.total, self.counts = ring.copy(), total, counts
        if self.prior_half_life is not None:
            self.recent = self._recent_of(obj.get("recent"))
        self.fitted = fitted.copy()
        self.point = self._fit(self.fitted)
        return self

    @staticmethod
    def _recent_of(value: Any) -> tuple[float, float]:
        """The followed prior's weights as :meth:`to_bytes` wrote them (FormatError if
        missing: a window kept without a followed prior)."""
        if not (isinstance(value, list) and len(value) == 2 and
                all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in value)):
            raise FormatError("a score window without the followed prior's weights")
        return float(value[0]), float(value[1])
