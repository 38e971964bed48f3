"""Bernoulli Naive Bayes: presence/absence of each feature, absent features scored too."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from streamnb.models._discrete import DiscreteNB
from streamnb.stats.class_counts import ClassCounts
from streamnb.stats.feature_counts import FeatureCounts


class BernoulliNB(DiscreteNB):
    """Bernoulli Naive Bayes (the full model: absent features count), learnt online.

    ``theta_cj = P(j present | c) = (N_cj + alpha) / (N_c + 2 alpha)`` with ``N_c`` the
    class's document weight (the ``classes`` statistic) and ``N_cj`` its document
    frequency of feature j (the ``features`` statistic, of binarized input). Input is
    binarized as ``x > binarize`` (``binarize=None``: input must already be 0/1).
    The feature space is every column (``smoothing_m="columns"``, as scikit-learn) or
    the features seen in training (``"seen"``: a test document's never-seen features
    are ignored; the right choice for hashed input).

    >>> import numpy as np
    >>> X = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 1]])
    >>> model = BernoulliNB().fit(X, ["a", "a", "b"])
    >>> # a: 2/3 * (3/4)(1 - 2/4)(1 - 1/4), b: 1/3 * (1/3)(1 - 1/3)(1 - 2/3) -> 0.884 : 0.116
    >>> model.predict_proba(np.array([[1, 0, 0]])).round(3).tolist()
    [[0.884, 0.116]]
    """

    kind = "bernoulli"
    positive_only = False  # binarized: x > binarize (>= 0), so negative values are absent
    cheap_prequential = False  # its exact prequential method copies the count table

    def __init__(
        self,
        alpha: float = 1.0,
        binarize: float | None = 0.0,
        n_features: int | None = None,
        smoothing_m: str = "columns",
        fit_prior: bool = True,
        class_prior: Any = None,
    ) -> None:
        self.binarize = binarize
        super().__init__(alpha=alpha, n_features=n_features, smoothing_m=smoothing_m,
                         fit_prior=fit_prior, class_prior=class_prior)

    def _check_params(self) -> None:
        super()._check_params()
        binarize = self.binarize
        if binarize is not None:
            try:
                binarize = float(binarize)
            except (TypeError, ValueError):
                raise ValueError(f"binarize must be a number or None, got {binarize!r}") from None
            if not (math.isfinite(binarize) and binarize >= 0):
                raise ValueError(f"binarize must be a finite number >= 0 or None, got {binarize!r}")

    # ------------------------------------------------------------------ input
    def _validate_X(self, X: Any, predicting: bool = False) -> Any:
        X = super()._validate_X(X, predicting)
        if self.binarize is None:
            values = X.data if sp.issparse(X) else X
            if ((values != 0) & (values != 1)).any():
                raise ValueError("BernoulliNB(binarize=None) expects 0/1 input, got other values")
        return X

    def _count_matrix(self, X: Any) -> Any:
        """Binarized X as CSR (presence = 1)."""
        if self.binarize is None:
            Xb = sp.csr_matrix(X, dtype=np.float64)
        elif sp.issparse(X):
            Xb = sp.csr_matrix(X, dtype=np.float64, copy=True)
            Xb.data = (Xb.data > self.binarize).astype(np.float64)
        else:
            Xb = sp.csr_matrix((X > self.binarize).astype(np.float64))
        Xb.eliminate_zeros()
        return Xb

    # ---------------------------------------------------------------- derived
    # log P(x | c) = const_c + sum_{j present} w_cj, where
    #   w_cj    = log theta_cj - log(1 - theta_cj) = log(N_cj + a) - log(N_c - N_cj + a)
    #   const_c = sum_{j in space} log(1 - theta_cj)
    #           = (M - s) log(N_c + a) + sum_{j seen} log(N_c - N_cj + a) - M log(N_c + 2a)
    # (M = size of the feature space, s = number of seen columns: every never-seen
    # column shares theta = a / (N_c + 2a), handled analytically). w_cj is evaluated
    # only for the features present in the input, at prediction time (O(nnz x classes)).
    # The seen-column sum in const_c is kept per class as a histogram of document
    # frequencies {N_cj: number of seen columns j with that value}, updated for the
    # touched columns only, so a refresh after a batch costs O(touched + distinct
    # values), never O(seen): learning one message at a time is not O(vocabulary).
    def _derive_all(self, cc: ClassCounts, fc: FeatureCounts) -> None:
        self._seen_mask = fc.values.any(axis=0)
        self._n_seen_cols = int(np.count_nonzero(self._seen_mask))
        self._df = fc.values.copy()  # document frequencies as of the last derivation
        seen = np.compress(self._seen_mask, fc.values, axis=1)
        self._df_hist: list[dict[float, int]] = [{} for _ in range(seen.shape[0])]
        for c, hist in enumerate(self._df_hist):
            _hist_add(hist, seen[c], 1)

    def _derive_columns(self, cc: ClassCounts, fc: FeatureCounts, cols: np.ndarray) -> None:
        new = np.take(fc.values, cols, axis=1)  # C-ordered rows (not [:, cols])
        nonzero = new.any(axis=0)
        was = self._seen_mask[cols]
        old = np.take(self._df, cols, axis=1)
        for c, hist in enumerate(self._df_hist):
            _hist_add(hist, old[c, was], -1)
            _hist_add(hist, new[c, nonzero], 1)
        self._df[:, cols] = new
        self._n_seen_cols += int(np.count_nonzero(nonzero)) - int(np.count_nonzero(was))
        self._seen_mask[cols] = nonzero

    def _derive_classes(self, cc: ClassCounts, fc: FeatureCounts) -> None:
        a = self.alpha
        n_c = cc.counts
        self._log_prior = self._class_log_prior(n_c, cc.labels)
        s = self._n_seen_cols
        space = fc.n_features if self.smoothing_m == "columns" else s
        log_absent_seen = np.zeros(n_c.size)
        for c, hist in enumerate(self._df_hist):
            if hist:
                values = np.fromiter(hist.keys(), dtype=np.float64, count=len(hist))
                columns = np.fromiter(hist.values(), dtype=np.float64, count=len(hist))
                log_absent_seen[c] = columns @ np.log(np.maximum(n_c[c] - values, 0.0) + a)
        self._const = (
            self._log_prior
            + (space - s) * np.log(n_c + a)
            + log_absent_seen
            - space * np.log(n_c + 2 * a)
        )

    def _weights(self, n_cj: np.ndarray, cc: ClassCounts) -> np.ndarray:
        """``w_cj`` for gathered document frequencies ``n_cj`` (n_classes, t)."""
        a = self.alpha
        w = np.log(n_cj + a) - np.log(np.maximum(cc.counts[:, None] - n_cj, 0.0) + a)
        if self.smoothing_m == "seen":
            w[:, ~n_cj.any(axis=0)] = 0.0
        return w

    def _joint_log_likelihood(self, X: Any) -> np.ndarray:
        cc, fc = self._refresh()
        Xb = self._count_matrix(X)
        w = self._weights(np.take(fc.values, Xb.indices, axis=1), cc)
        # Row sums of the per-entry weights (times x, which is 1): a CSR product.
        per_row = sp.csr_matrix((Xb.data, np.arange(Xb.nnz), Xb.indptr), shape=(Xb.shape[0], Xb.nnz))
        return np.asarray(per_row @ w.T) + self._const

    def _linear_form(self) -> tuple[np.ndarray, np.ndarray]:
        cc, fc = self._parts()
        return self._weights(fc.values, cc), self._const.copy()

    def _pair_weights(self, cols: np.ndarray, a: int, b: int) -> np.ndarray:
        """``logit theta_bj - logit theta_aj``: the true weight of a present feature (its
        absent term ``log(1 - theta)`` is in the bias whether it is present or not), not
        the log ratio of the presence probabilities, which can rank features otherwise."""
        cc, fc = self._parts()
        w = self._weights(np.take(fc.values, cols, axis=1), cc)
        return w[b] - w[a]

    def _pair_bias(self, a: int, b: int) -> float:
        return float(self._const[b] - self._const[a])

    @property
    def feature_log_prob_(self) -> np.ndarray:
        """``log theta_cj``, shape (n_classes, n_features)."""
        self._check_fitted()
        cc, fc = self._refresh()
        return np.log(fc.values + self.alpha) - np.log(cc.counts + 2 * self.alpha)[:, None]


def _hist_add(hist: dict[float, int], values: np.ndarray, sign: int) -> None:
    """Add (``sign`` = 1) or remove (-1) ``values`` from a value -> multiplicity histogram.

    >>> h: dict[float, int] = {}
    >>> _hist_add(h, np.array([1.0, 2.0, 1.0]), 1); _hist_add(h, np.array([2.0]), -1); h
    {1.0: 2}
    """
    if values.size == 0:
        return
    keys, counts = np.unique(values, return_counts=True)
    for key, n in zip(keys.tolist(), counts.tolist(), strict=True):
        m = hist.get(key, 0) + sign * n
        if m:
            hist[key] = m
        else:
            del hist[key]
