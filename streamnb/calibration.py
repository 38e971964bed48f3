"""Calibrated probabilities of the positive class from scores with known outcomes, binned.

A two-class model's score (``DecisionRule.score_of``) ranks well, but its posteriors
saturate at 0 and 1. A calibrator maps the score to P(positive | score), fitted on counts
of labelled scores per score bin (``positive[b]``, ``negative[b]``: how many of each class
scored in bin b, whose centre is ``centres[b]``):

- ``isotonic``: the pool-adjacent-violators fit of the positive share, non-decreasing in
  the score, over the bins that hold a score; a score between two bins' centres takes the
  straight line between their fitted values (scikit-learn's ``IsotonicRegression`` on the
  same points gives the same values);
- ``platt``: ``1 / (1 + exp(-(a s + b)))`` by Newton's method on the same counts, with
  Platt's targets ((N+ + 1) / (N+ + 2) for a positive, 1 / (N- + 2) for a negative).

:func:`expected_calibration_error` and :func:`reliability` measure a calibrator on later
outcomes (ten equal-width bins of the probability).

Under label shift (the class mix moves, each class's scores do not), a probability fitted
where P(positive) was ``fitted`` is moved to a new prior by Saerens, Latinne & Decaestecker
(2002, "Adjusting the outputs of a classifier to new a priori probabilities"):
p'(y|x) is proportional to p(y|x) prior'(y) / prior(y) (:func:`adjust_to_prior`); their EM
estimates the new prior from unlabelled probabilities alone (:func:`em_prior`).

>>> import numpy as np
>>> centres = np.array([-1.0, 0.0, 1.0])
>>> cal = fit_calibrator("isotonic", centres, positive=[1, 5, 9], negative=[9, 5, 1])
>>> cal(np.array([-1.0, 0.5, 2.0])).round(3).tolist()
[0.1, 0.7, 0.9]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CALIBRATIONS", "Calibrator", "adjust_to_prior", "em_prior",
           "expected_calibration_error", "fit_calibrator", "pav", "reliability"]

#: The calibrations :func:`fit_calibrator` makes.
CALIBRATIONS = ("isotonic", "platt")


@dataclass(frozen=True)
class Calibrator:
    """A fitted map score -> P(positive): ``isotonic`` (``xs``, ``ys``: points of the
    piecewise-linear map, constant beyond its ends) or ``platt`` (``xs`` = ``[a, b]``)."""

    kind: str
    xs: np.ndarray
    ys: np.ndarray

    def __call__(self, scores: Any) -> np.ndarray:
        s = np.asarray(scores, dtype=np.float64)
        if self.kind == "platt":
            a, b = float(self.xs[0]), float(self.xs[1])
            return 0.5 * (1.0 + np.tanh(0.5 * (a * s + b)))  # the logistic, without overflow
        if self.xs.size == 0:
            return np.full(s.shape, 0.5)
        return np.interp(s, self.xs, self.ys)


def pav(y: Any, w: Any) -> np.ndarray:
    """The weighted least-squares non-decreasing fit of ``y`` (pool adjacent violators).

    >>> pav([0.1, 0.5, 0.3, 0.9], [1, 1, 1, 1]).tolist()
    [0.1, 0.4, 0.4, 0.9]
    """
    y = np.asarray(y, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    means: list[float] = []
    weights: list[float] = []
    sizes: list[int] = []
    for yi, wi in zip(y.tolist(), w.tolist(), strict=True):
        m, wt, sz = yi, wi, 1
        while means and means[-1] >= m:
            pw = weights.pop()
            m = (means.pop() * pw + m * wt) / (pw + wt)
            wt += pw
            sz += sizes.pop()
        means.append(m)
        weights.append(wt)
        sizes.append(sz)
    return np.repeat(np.array(means), sizes)


def _platt(centres: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> tuple[float, float]:
    """(a, b) of Platt scaling on binned counts: Newton steps on the cross-entropy with
    Platt's targets, halving a step that does not lower it."""
    n_pos, n_neg = float(pos.sum()), float(neg.sum())
    t_pos, t_neg = (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0)
    # each bin is two points: its positives (target t_pos) and negatives (target t_neg)
    x = np.concatenate([centres, centres])
    t = np.concatenate([np.full(centres.size, t_pos), np.full(centres.size, t_neg)])
    w = np.concatenate([pos, neg]).astype(np.float64)

    def loss(a: float, b: float) -> float:
        z = a * x + b
        # -[t log p + (1-t) log(1-p)] = log(1 + e^z) - t z, with log1p(e^z) stable
        return float(np.sum(w * (np.logaddexp(0.0, z) - t * z)))

    a, b = 0.0, math.log((n_pos + 1.0) / (n_neg + 1.0))
    cur = loss(a, b)
    for _ in range(100):
        p = 0.5 * (1.0 + np.tanh(0.5 * (a * x + b)))
        g = w * (p - t)
        h = w * p * (1.0 - p)
        ga, gb = float(g @ x), float(g.sum())
        haa, hab, hbb = float(h @ (x * x)) + 1e-12, float(h @ x), float(h.sum()) + 1e-12
        det = haa * hbb - hab * hab
        if det <= 0 or not math.isfinite(det):
            break
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        step = 1.0
        while step > 1e-6:
            na, nb = a - step * da, b - step * db
            new = loss(na, nb)
            if new <= cur:
                break
            step *= 0.5
        else:
            break
        done = abs(cur - new) <= 1e-12 * max(1.0, abs(cur))
        a, b, cur = na, nb, new
        if done:
            break
    return a, b


def fit_calibrator(kind: str, centres: Any, positive: Any, negative: Any) -> Calibrator:
    """Fit a calibrator of ``kind`` (:data:`CALIBRATIONS`) on the counts of positives and
    negatives per score bin (bins with no count are left out). With no count at all it
    says 0.5 everywhere.

    >>> cal = fit_calibrator("platt", [-2.0, 2.0], positive=[1, 9], negative=[9, 1])
    >>> bool(cal(np.array([-2.0]))[0] < 0.2 < 0.8 < cal(np.array([2.0]))[0])
    True
    """
    if kind not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {list(CALIBRATIONS)}, got {kind!r}")
    centres = np.asarray(centres, dtype=np.float64)
    pos = np.asarray(positive, dtype=np.float64)
    neg = np.asarray(negative, dtype=np.float64)
    held = (pos + neg) > 0
    if not held.any():
        return Calibrator(kind, np.array([0.0, 0.0]) if kind == "platt" else np.zeros(0),
                          np.zeros(0))
    if kind == "platt":
        a, b = _platt(centres[held], pos[held], neg[held])
        return Calibrator("platt", np.array([a, b]), np.zeros(0))
    n = pos[held] + neg[held]
    fitted = pav(pos[held] / n, n)
    # never exactly 0 or 1: no finite count makes a class impossible
    total = float(n.sum())
    fitted = np.clip(fitted, 1.0 / (total + 2.0), (total + 1.0) / (total + 2.0))
    return Calibrator("isotonic", centres[held].copy(), fitted)


def reliability(probas: Any, outcomes: Any, bins: int = 10,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per equal-width bin of the probability: (mean probability, share of positives,
    count); bins with no prediction hold NaN and 0.

    >>> mp, share, n = reliability([0.05, 0.15, 0.95], [0, 1, 1], bins=2)
    >>> mp.round(2).tolist(), share.round(2).tolist(), n.tolist()
    ([0.1, 0.95], [0.5, 1.0], [2, 1])
    """
    p = np.asarray(probas, dtype=np.float64)
    y = np.asarray(outcomes, dtype=np.float64)
    idx = np.minimum((p * bins).astype(np.int64), bins - 1)
    n = np.bincount(idx, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.bincount(idx, weights=p, minlength=bins) / n
        share = np.bincount(idx, weights=y, minlength=bins) / n
    return mean_p, share, n


def expected_calibration_error(probas: Any, outcomes: Any, bins: int = 10) -> float:
    """sum over equal-width bins of |mean probability - share of positives| x the bin's
    share of the predictions (0 for no prediction).

    >>> expected_calibration_error([0.05, 0.15, 0.95], [0, 1, 1], bins=2)  # (0.4 x 2 + 0.05 x 1) / 3
    0.2833333333333334
    """
    mean_p, share, n = reliability(probas, outcomes, bins)
    total = int(n.sum())
    if total == 0:
        return 0.0
    held = n > 0
    return float(np.sum(np.abs(mean_p[held] - share[held]) * n[held]) / total)


def adjust_to_prior(p: Any, fitted: float, prior: float) -> Any:
    """P(positive) ``p``, made where the positive share was ``fitted``, moved to a positive
    share of ``prior`` (both in (0, 1)): p' = p r1 / (p r1 + (1 - p) r0) with r1 = prior /
    fitted and r0 = (1 - prior) / (1 - fitted). A float for a float, else an array.

    >>> round(adjust_to_prior(0.8, 0.2, 0.5), 6)  # odds 4 x (1 / (0.2 / 0.8)) = 16: 16/17
    0.941176
    >>> adjust_to_prior(np.array([0.0, 0.5, 1.0]), 0.5, 0.1).tolist()
    [0.0, 0.1, 1.0]
    """
    r1, r0 = prior / fitted, (1.0 - prior) / (1.0 - fitted)
    if isinstance(p, float):
        return p * r1 / (p * r1 + (1.0 - p) * r0)
    p = np.asarray(p, dtype=np.float64)
    return p * r1 / (p * r1 + (1.0 - p) * r0)


def em_prior(p: Any, fitted: float, tol: float = 1e-9, max_iter: int = 1000) -> float:
    """The positive share of unlabelled messages whose P(positive), made where the share
    was ``fitted``, is ``p``: Saerens et al.'s EM, from ``fitted``: move every p to the
    current share (:func:`adjust_to_prior`), take their mean as the next share, until it
    moves by at most ``tol``.

    >>> round(em_prior([0.9, 0.9, 0.1, 0.1], 0.5), 6)  # symmetric: the share stays
    0.5
    >>> round(em_prior([0.8, 0.8, 0.8, 0.2], 0.5), 6)  # 11/12: 3/4 x 44/45 + 1/4 x 11/15
    0.916667
    """
    p = np.asarray(p, dtype=np.float64)
    share = float(fitted)
    if p.size == 0:
        return share
    for _ in range(max_iter):
        new = float(np.mean(adjust_to_prior(p, fitted, share)))
        if abs(new - share) <= tol:
            return new
        share = new
    return share
