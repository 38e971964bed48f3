"""Log-space arithmetic of posteriors, shared by the models and their prequential paths."""

from __future__ import annotations

import math

import numpy as np


def log_normalize(jll: np.ndarray) -> np.ndarray:
    """Rows of joint log-likelihoods -> log posteriors (log-sum-exp, -inf safe).

    Each row is shifted by its maximum *before* normalising, so a joint log-likelihood of
    -1e11 (a feature counted 3e10 times) still gives posteriors that sum to 1: subtracting
    ``logsumexp`` from the unshifted row would lose the last five digits.

    >>> import math

import numpy as np
    >>> np.round(np.exp(log_normalize(np.array([[0.0, np.log(3.0)]]))), 3).tolist()
    [[0.25, 0.75]]
    >>> float(np.exp(log_normalize(np.array([[-1e11, -1e11]]))).sum())
    1.0
    """
    top = np.max(jll, axis=1, keepdims=True)
    dead = ~np.isfinite(top[:, 0])  # every class impossible (-inf): no posterior
    with np.errstate(invalid="ignore", divide="ignore"):
        shifted = jll - np.where(dead[:, None], 0.0, top)
        out = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    if dead.any():
        out[dead] = -np.log(jll.shape[1])  # call it uniform
    return out


def log_class_prior(counts: np.ndarray) -> np.ndarray:
    """``log(N_c / N)``; ``-inf`` for zero-weight classes, without ``log(0)`` warnings.

    With no weight at all (every class registered but empty), the prior is uniform.

    >>> log_class_prior(np.array([3.0, 0.0, 1.0])).round(4).tolist()
    [-0.2877, -inf, -1.3863]
    """
    total = float(counts.sum())
    if total <= 0.0:
        return np.full(counts.shape, -math.log(max(counts.size, 1)))
    out = np.full(counts.shape, -np.inf)
    pos = counts > 0
    out[pos] = np.log(counts[pos]) - math.log(total)
    return out
