"""The TREC spam track's measures of a filter on a replay: ROC area and lam%.

A filter gives each message a verdict (spam or not, at its own threshold; None when it
gave none) and a spamminess score (higher: more likely spam). From those and the true
labels (Cormack and Lynam, "TREC 2005 Spam Track Overview", Proc. TREC 2005, section 3,
"Evaluation measures"):

- hm% (ham misclassification: ham judged spam) and sm% (spam misclassification: spam not
  judged spam), at the filter's own threshold;
- lam%, the logistic average misclassification: ``logit^-1((logit(hm) + logit(sm)) / 2)``
  with ``logit(p) = log(p / (1 - p))``. A rate of 0 (or 1) has no logit: as the track's
  toolkit does, 0.5 of a message stands for the missing count (0.5 / n, or
  (n - 0.5) / n), so a filter that spares every ham still has a finite lam%. lam% is
  the geometric mean of the two rates' odds, turned back into a rate: it rewards a fixed
  factor of improvement in either rate the same;
- (1-ROCA)%: 100 times the area above the ROC curve of the scores, the chance that a
  random ham scores above a random spam (a tie counts half); 0 is perfect ranking;
- spam recall at ham FPR <= 0.1%: the share of spam a threshold catches when it may
  flag at most 0.1% of the ham (``floor(0.001 * n_ham)`` messages); a threshold never
  splits tied scores, so a tie at the cut-off counts against the filter.

A message with no verdict counts as misclassified (a ham as flagged, a spam as missed):
a filter is judged on every message of the replay.

>>> m = measure([0.9, 0.2, 0.3, 0.1], [True, False, True, False], [True, True, False, False])
>>> (m.accuracy, m.ham_fpr, m.spam_fnr, m.roca_pct)
(0.5, 0.5, 0.5, 25.0)
>>> round(lam(0, 100, 10, 100), 5)  # hm = 0.5/100 with the correction
0.02308
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

#: The ham false-positive rate at which spam recall is reported.
RECALL_AT_HAM_FPR = 0.001


def logit(p: float) -> float:
    """``log(p / (1 - p))`` for 0 < p < 1.

    >>> logit(0.5)
    0.0
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"logit needs 0 < p < 1, got {p}")
    return math.log(p) - math.log1p(-p)


def inverse_logit(x: float) -> float:
    """``1 / (1 + exp(-x))``, without overflow for large ``|x|``.

    >>> inverse_logit(0.0)
    0.5
    """
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def corrected_rate(errors: int, n: int) -> float:
    """``errors / n``, with 0.5 of a message for a count of 0 (or n): never 0 nor 1.

    >>> corrected_rate(0, 200), corrected_rate(3, 200), corrected_rate(200, 200)
    (0.0025, 0.015, 0.9975)
    """
    if n < 1 or not 0 <= errors <= n:
        raise ValueError(f"need 0 <= errors <= n and n >= 1, got {errors} of {n}")
    return min(max(errors, 0.5), n - 0.5) / n


def lam(ham_errors: int, n_ham: int, spam_errors: int, n_spam: int) -> float:
    """The logistic average of the ham and spam misclassification rates (a fraction).

    >>> round(lam(12, 2750, 35, 500) * 100, 2)
    1.78
    """
    hm = corrected_rate(ham_errors, n_ham)
    sm = corrected_rate(spam_errors, n_spam)
    return inverse_logit((logit(hm) + logit(sm)) / 2.0)


def roc_area(scores: Sequence[float], is_spam: Sequence[bool]) -> float:
    """Area under the ROC curve of ``scores`` for the spam class: the chance that a random
    spam scores above a random ham, a tie counting half (Mann-Whitney U / (n_spam n_ham)).

    >>> roc_area([0.1, 0.4, 0.35, 0.8], [False, False, True, True])
    0.75
    >>> roc_area([1, 1, 1], [True, False, False])
    0.5
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(is_spam, dtype=bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"scores and labels must be 1-d of one length, got {s.shape}, {y.shape}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    n_spam, n_ham = int(y.sum()), int((~y).sum())
    if n_spam == 0 or n_ham == 0:
        return float("nan")
    ranks = rankdata(s)  # average ranks: ties split evenly (infinities rank as numbers)
    u = float(ranks[y].sum()) - n_spam * (n_spam + 1) / 2.0
    return u / (n_spam * n_ham)


def spam_recall_at(scores: Sequence[float], is_spam: Sequence[bool],
                   max_ham_fpr: float = RECALL_AT_HAM_FPR) -> float:
    """The share of spam scored strictly above the ``k+1``-th highest ham score, with
    ``k = floor(max_ham_fpr * n_ham)``: the best threshold that flags at most ``k`` ham.

    >>> spam_recall_at([5, 4, 3, 2, 1], [True, False, True, True, False], 0.0)
    0.3333333333333333
    >>> spam_recall_at([5, 4, 3, 2, 1], [True, False, True, True, False], 0.5)
    1.0
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(is_spam, dtype=bool)
    ham = np.sort(s[~y])[::-1]
    spam = s[y]
    if not spam.size:
        return float("nan")
    k = int(math.floor(max_ham_fpr * ham.size + 1e-9))
    if k >= ham.size:
        return 1.0
    return float((spam > ham[k]).mean())


@dataclass(frozen=True)
class Measures:
    """A filter's figures on one replay (rates as fractions; ``roca_pct`` and ``lam_pct``
    in percent, as the track reports them)."""

    n: int
    n_ham: int
    n_spam: int
    ham_errors: int
    spam_errors: int
    no_verdict: int
    accuracy: float
    ham_fpr: float
    spam_fnr: float
    lam_pct: float
    roca_pct: float
    recall_at_fpr: float


def measure(scores: Sequence[float], verdicts: Sequence[bool | None],
            is_spam: Sequence[bool], max_ham_fpr: float = RECALL_AT_HAM_FPR) -> Measures:
    """Every measure of a replay: ``verdicts[i]`` True when message i was judged spam
    (None: no verdict, an error), ``scores[i]`` its spamminess, ``is_spam[i]`` the truth."""
    if not len(scores) == len(verdicts) == len(is_spam):
        raise ValueError(f"need one score, verdict and label a message, got "
                         f"{len(scores)}, {len(verdicts)}, {len(is_spam)}")
    judged = [None if v is None else bool(v) for v in verdicts]  # (numpy bools too)
    truth = [bool(t) for t in is_spam]
    n_spam = sum(truth)
    n_ham = len(truth) - n_spam
    ham_err = sum(1 for v, t in zip(judged, truth, strict=True) if not t and v is not False)
    spam_err = sum(1 for v, t in zip(judged, truth, strict=True) if t and v is not True)
    n = len(is_spam)
    both = n_ham > 0 and n_spam > 0
    return Measures(
        n=n, n_ham=n_ham, n_spam=n_spam, ham_errors=ham_err, spam_errors=spam_err,
        no_verdict=sum(1 for v in verdicts if v is None),
        accuracy=1 - (ham_err + spam_err) / n if n else float("nan"),
        ham_fpr=ham_err / n_ham if n_ham else float("nan"),
        spam_fnr=spam_err / n_spam if n_spam else float("nan"),
        lam_pct=100 * lam(ham_err, n_ham, spam_err, n_spam) if both else float("nan"),
        roca_pct=100 * (1 - roc_area(scores, is_spam)) if both else float("nan"),
        recall_at_fpr=spam_recall_at(scores, is_spam, max_ham_fpr) if both else float("nan"),
    )
