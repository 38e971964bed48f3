"""Log-space arithmetic of posteriors, shared by the models and their prequential paths."""

from __future__ import annotations

import numpy as np


def log_normalize(jll: np.ndarray) -> np.ndarray:
    """Rows of joint log-likelihoods -> log posteriors (log-sum-exp, -inf safe).

    Each row is shifted by its maximum *before* normalising, so a joint log-likelihood of
    -1e11 (a feature counted 3e10 times) still gives posteriors that sum to 1: subtracting
    ``logsumexp`` from the unshifted row would lose the last five digits.

    >>> import numpy as np
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
