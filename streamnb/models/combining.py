"""Robinson's token probabilities and Fisher's chi-square combining, as SpamBayes and
bogofilter judge a message, on the statistics of a count model.

Where the multinomial model sums every token's log-likelihood ratio, these filters give
each token a spam probability of its own and combine the strongest ones:

1. Robinson's f(w) (bogofilter ``src/prob.c``, ``calc_prob_pure``; SpamBayes
   ``classifier.py``, ``Classifier.probability``): with ``b`` and ``g`` the spam and ham
   messages that hold the token (here: the learnt weights of its bucket in each class),
   ``p = (b / n_spam) / (b / n_spam + g / n_ham)`` and
   ``f = (s x + (b + g) p) / (s + b + g)``; a token never seen gets ``x``. SpamBayes:
   s = 0.45 (``unknown_word_strength``), x = 0.5 (``unknown_word_prob``).
2. The clues: the tokens with ``|f - 0.5| >= min_strength`` (SpamBayes'
   ``minimum_prob_strength``, 0.1), at most ``max_clues`` of the strongest
   (``max_discriminators``, 150).
3. Fisher's combining (SpamBayes ``Classifier.chi2_spamprob``): for n clues,
   ``S = 1 - Q(-2 sum ln(1 - f), 2n)``, ``H = 1 - Q(-2 sum ln f, 2n)`` with ``Q`` the
   chi-square survival function (:func:`chi2_q`), and the indicator
   ``I = (1 + S - H) / 2`` in [0, 1]: near 1 spam, near 0 ham, near 0.5 unsure (also for
   a message without clues). SpamBayes calls a mail spam above 0.90 and ham below 0.20.

Everything in float64 and log space: the products of many probabilities underflow, so the
sums of their logs are kept and the series of ``Q`` is summed by log-sum-exp.

>>> round(chi2_q(4.0, 2), 6)  # exp(-2)
0.135335
>>> round(fisher_indicator(np.array([0.99, 0.98, 0.2])), 4)
0.8827
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["ROBINSON_S", "ROBINSON_X", "chi2_indicators", "chi2_prequential", "chi2_q",
           "fisher_indicator", "robinson_f"]

#: SpamBayes' defaults (``Options.py``): the strength and value of the prior of a token.
ROBINSON_S = 0.45
ROBINSON_X = 0.5
#: SpamBayes' ``minimum_prob_strength`` and ``max_discriminators``.
MIN_STRENGTH = 0.1
MAX_CLUES = 150


def chi2_q(x2: float, dof: int) -> float:
    """P(chi-square with ``dof`` degrees of freedom >= ``x2``), ``dof`` even: the series
    ``exp(-m) sum_{i < dof/2} m**i / i!`` (m = x2 / 2) of SpamBayes' ``chi2Q``, summed in
    log space (no underflow to 0 for large ``x2``), at most 1.

    >>> chi2_q(0.0, 10), round(chi2_q(10.0, 4), 6)
    (1.0, 0.040428)
    """
    if dof < 2 or dof % 2:
        raise ValueError(f"chi2_q needs an even number of degrees of freedom >= 2, got {dof}")
    if not x2 > 0.0:
        return 1.0
    if math.isinf(x2):  # (a token probability of exactly 0 or 1, possible with s = 0)
        return 0.0
    m = x2 / 2.0
    i = np.arange(dof // 2, dtype=np.float64)
    logs = -m + i * math.log(m) - np.array([math.lgamma(k + 1.0) for k in i])
    top = float(logs.max())
    return min(1.0, math.exp(top + math.log(float(np.exp(logs - top).sum()))))


def robinson_f(spam: Any, ham: Any, n_spam: float, n_ham: float,
               s: float = ROBINSON_S, x: float = ROBINSON_X) -> np.ndarray:
    """Robinson's f(w) of each token from its spam and ham counts (messages, or learnt
    weights) and the class totals; ``x`` for a token in neither class.

    >>> robinson_f([3.0, 0.0, 0.0], [1.0, 2.0, 0.0], 10.0, 20.0).round(4).tolist()
    [0.821, 0.0918, 0.5]
    """
    b = np.asarray(spam, dtype=np.float64)
    g = np.asarray(ham, dtype=np.float64)
    b_ratio = b / (n_spam if n_spam > 0 else 1.0)
    g_ratio = g / (n_ham if n_ham > 0 else 1.0)
    total = b_ratio + g_ratio
    n = b + g
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(total > 0, b_ratio / np.where(total > 0, total, 1.0), x)
    return (s * x + n * p) / (s + n)


def fisher_indicator(f: Any, min_strength: float = MIN_STRENGTH,
                     max_clues: int = MAX_CLUES) -> float:
    """Fisher's chi-square combining of token probabilities ``f`` (see the module
    docstring): ``(1 + S - H) / 2``, 0.5 without clues.

    >>> fisher_indicator(np.array([0.55, 0.45]))  # no clue strong enough
    0.5
    """
    f = np.asarray(f, dtype=np.float64).ravel()
    strength = np.abs(f - 0.5)
    clues = f[strength >= min_strength]
    if clues.size > max_clues:  # the strongest (ties: as a stable sort leaves them)
        clues = clues[np.argsort(-np.abs(clues - 0.5), kind="stable")[:max_clues]]
    n = clues.size
    if not n:
        return 0.5
    with np.errstate(divide="ignore"):
        log_ham = float(np.log(clues).sum())        # ln prod f
        log_spam = float(np.log1p(-clues).sum())    # ln prod (1 - f)
    spam = 1.0 - chi2_q(-2.0 * log_spam, 2 * n)
    ham = 1.0 - chi2_q(-2.0 * log_ham, 2 * n)
    return (1.0 + spam - ham) / 2.0


def chi2_indicators(model: Any, X: Any, positive: Any = "spam",
                    s: float = ROBINSON_S, x: float = ROBINSON_X,
                    min_strength: float = MIN_STRENGTH, max_clues: int = MAX_CLUES) -> np.ndarray:
    """The chi-square indicator of each row of ``X`` (CSR, the model's columns) from a
    two-class count model's statistics (its per-class feature counts: for binary token
    values, the learnt weight of the messages that hold each bucket; and its class
    weights); ``positive`` is the spam class. 0.5 for a row while the spam or the other
    class has no weight."""
    return chi2_prequential(model, X, [None] * X.shape[0], None, positive, s, x,
                            min_strength, max_clues)


def chi2_prequential(model: Any, X: Any, labels: Sequence[Any], weights: Any = None,
                     positive: Any = "spam", s: float = ROBINSON_S, x: float = ROBINSON_X,
                     min_strength: float = MIN_STRENGTH, max_clues: int = MAX_CLUES) -> np.ndarray:
    """:func:`chi2_indicators` test-then-train within a batch, as
    :mod:`streamnb.models.prequential` predicts: row i is judged on the model's statistics
    plus the labelled rows before it (``labels``, None for unlabelled; ``weights``, 1 if
    None), and the model is left unchanged. The other class is the model's (or the batch's
    first) label that is not ``positive``; rows labelled with a third class add nothing."""
    X = sp.csr_matrix(X, dtype=np.float64)
    n = X.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    classes = model.stats.parts["classes"]
    features = model.stats.parts["features"]
    known = [c for c in classes.labels if c != positive]
    other = known[0] if known else next((c for c in labels if c is not None and c != positive), None)
    totals = classes.as_dict()
    f_labels = list(features.labels)
    rows = np.repeat(np.arange(n), np.diff(X.indptr))
    cols = X.indices.astype(np.int64)
    counts, before = [], []
    for c in (positive, other):
        own = np.array([lab == c and c is not None for lab in labels], dtype=bool) * w
        before.append(totals.get(c, 0.0) + np.concatenate([[0.0], np.cumsum(own)[:-1]]))
        base = features.column_counts(cols)[f_labels.index(c)] if c in f_labels else np.zeros(cols.size)
        counts.append(base + _earlier_in_column(rows, cols, X.data * own[rows]))
    out = np.full(n, 0.5)
    for i in range(n):
        if not (before[0][i] > 0 and before[1][i] > 0):
            continue
        at = slice(X.indptr[i], X.indptr[i + 1])
        f = robinson_f(counts[0][at], counts[1][at], before[0][i], before[1][i], s, x)
        out[i] = fisher_indicator(f, min_strength, max_clues)
    return out


def _earlier_in_column(rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each nonzero (rows[k], cols[k]): the sum of ``values`` of the nonzeros of the same
    column in earlier rows (an exclusive prefix sum per column, rows in order)."""
    if not values.size:
        return np.zeros(0)
    order = np.lexsort((rows, cols))
    v = values[order]
    total = np.cumsum(v)
    c = cols[order]
    first = np.flatnonzero(np.concatenate([[True], c[1:] != c[:-1]]))
    start = np.repeat(first, np.diff(np.append(first, c.size)))
    earlier = total - v - np.where(start > 0, total[np.maximum(start - 1, 0)], 0.0)
    out = np.empty_like(earlier)
    out[order] = earlier
    return out
