"""Multinomial Naive Bayes: word (feature) counts per class with alpha smoothing."""

from __future__ import annotations

from typing import Any

import numpy as np

from streamnb.arrays import nonzero_columns, put_rows
from streamnb.models._discrete import DiscreteNB
from streamnb.models.prequential import (
    MultinomialPlan,
    PrequentialPrediction,
    multinomial_plan,
    multinomial_prequential,
)
from streamnb.stats.class_counts import ClassCounts
from streamnb.stats.feature_counts import FeatureCounts


class MultinomialNB(DiscreteNB):
    """Multinomial Naive Bayes, learnt online from mergeable counts.

    ``P(j | c) = (F_cj + alpha) / (sum_j F_cj + alpha * m)``, m the number of columns
    (``smoothing_m="columns"``, as scikit-learn) or of distinct features seen in
    training (``"seen"``: the right choice for hashed input, where unseen test
    features are then ignored). ``n_features`` fixes the width up front.

    >>> import numpy as np
    >>> X = np.array([[2, 1, 0, 0], [2, 0, 1, 0], [1, 0, 0, 1], [1, 0, 0, 0]])
    >>> model = MultinomialNB().partial_fit(X[:3], ["spam"] * 3).partial_fit(X[3:], ["ham"])
    >>> model.predict(np.array([[3, 0, 0, 0], [0, 0, 0, 0]])).tolist()
    ['spam', 'spam']
    >>> # ham: 1/4 * (1/5)**2, spam: 3/4 * (2/12)**2 -> 0.324 : 0.676 (classes_ sorted)
    >>> model.classes_.tolist(), model.predict_proba(np.array([[0, 0, 0, 2]])).round(3).tolist()
    (['ham', 'spam'], [[0.324, 0.676]])
    """

    kind = "multinomial"

    def __init__(
        self, alpha: float = 1.0, n_features: int | None = None, smoothing_m: str = "columns",
        fit_prior: bool = True, class_prior: Any = None,
    ) -> None:
        super().__init__(alpha=alpha, n_features=n_features, smoothing_m=smoothing_m,
                         fit_prior=fit_prior, class_prior=class_prior)

    # Derived: table T (n_features, k + 1): T[j, c] = log(F_cj + alpha) and
    # T[j, k] = 1 for the columns in the feature space (0 for never-seen columns when
    # smoothing_m="seen", whose rows are all 0, so their features are ignored). Then
    # log P(x | c) = (x @ T)[c] - (x @ T)[k] * log(sum_j F_cj + alpha * m).
    def _table_rows(self, counts: np.ndarray) -> np.ndarray:
        """Rows of T for the columns of ``counts`` (n_classes, t): shape (t, k + 1)."""
        k = counts.shape[0]
        out = np.empty((k + 1, counts.shape[1]))  # class-major: every step is contiguous
        np.add(counts, self.alpha, out=out[:k])
        np.log(out[:k], out=out[:k])
        if self.smoothing_m == "seen":
            seen = nonzero_columns(counts)
            np.copyto(out[:k], 0.0, where=~seen)
            out[k] = seen
        else:
            out[k] = 1.0
        return np.ascontiguousarray(out.T)

    def _derive_all(self, cc: ClassCounts, fc: FeatureCounts) -> None:
        # Never-seen columns all share one row (zeros with smoothing_m="seen", log(alpha)
        # and 1 otherwise): fill it in, then derive the seen columns only.
        # The old table's memory is reused when the shape is unchanged (e.g. after a
        # decay): refilling mapped pages is cheaper than faulting in fresh ones.
        shape = (fc.n_features, fc.values.shape[0] + 1)
        fill = self._table_rows(np.zeros((shape[1] - 1, 1)))[0]
        old = getattr(self, "_table", None)
        if isinstance(old, np.ndarray) and old.shape == shape and old.flags.writeable:
            old[:] = fill
        elif fill.any():
            self._table = np.empty(shape)
            self._table[:] = fill
        else:
            self._table = np.zeros(shape)  # untouched pages cost nothing until written
        self._derive_columns(cc, fc, np.flatnonzero(nonzero_columns(fc.values)))

    def _derive_columns(self, cc: ClassCounts, fc: FeatureCounts, cols: np.ndarray) -> None:
        put_rows(self._table, cols, self._table_rows(fc.column_counts(cols)))

    def _derive_classes(self, cc: ClassCounts, fc: FeatureCounts) -> None:
        self._log_prior = self._class_log_prior(cc.counts, cc.labels)
        denominator = fc.totals + self.alpha * self._m(fc)
        # A zero denominator only arises with nothing seen ("seen" mode, m = 0), where
        # every feature is ignored: its coefficient is 0, not log(0).
        self._log_denominator = np.log(np.where(denominator > 0, denominator, 1.0))

    def _joint_log_likelihood(self, X: Any) -> np.ndarray:
        self._refresh()
        S = np.asarray(X @ self._table)
        return S[:, :-1] - S[:, -1:] * self._log_denominator + self._log_prior

    def _scoring_table(self) -> np.ndarray:
        """The refreshed table T (n_features, n_classes + 1) described above."""
        self._refresh()
        return self._table

    def _linear_form(self) -> tuple[np.ndarray, np.ndarray]:
        T = self._table
        W = T[:, :-1].T - T[:, -1][None, :] * self._log_denominator[:, None]
        return W, self._log_prior.copy()

    def _pair_weights(self, cols: np.ndarray, a: int, b: int) -> np.ndarray:
        # one product over the gathered rows of T: T_b - T_a - T_k (ld_b - ld_a)
        ld = self._log_denominator
        coef = np.zeros(self._table.shape[1])
        coef[b] += 1.0
        coef[a] -= 1.0
        coef[-1] = -(ld[b] - ld[a])
        return np.take(self._table, cols, axis=0) @ coef

    def _pair_bias(self, a: int, b: int) -> float:
        return float(self._log_prior[b] - self._log_prior[a])

    def predict_log_proba_prequential(
        self, X: Any, y: Any, sample_weight: Any = None, plan: MultinomialPlan | None = None
    ) -> PrequentialPrediction:
        """Exact and vectorised (see :func:`streamnb.models.prequential.multinomial_prequential`)."""
        return multinomial_prequential(self, X, y, sample_weight, plan)

    def prequential_plan(self, X: Any, y: Any, sample_weight: Any = None) -> MultinomialPlan:
        """The validated batch and, without the C loop, the sort of its nonzeros and its
        in-batch prefix sums (:class:`streamnb.models.prequential.MultinomialPlan`); valid
        while the model's classes stay the same.

        >>> import numpy as np
        >>> m = MultinomialNB().partial_fit(np.array([[2, 0], [0, 2]]), ["a", "b"])
        >>> X, y = np.array([[1, 1], [1, 0]]), ["a", None]
        >>> plan = m.prequential_plan(X, y)
        >>> _ = m.partial_fit(np.array([[0, 1]]), ["b"])  # the model changes meanwhile
        >>> bool(np.array_equal(m.predict_log_proba_prequential(X, y, plan=plan).log_proba,
        ...                     m.predict_log_proba_prequential(X, y).log_proba))
        True
        """
        return multinomial_plan(self, X, y, sample_weight)

    @property
    def feature_log_prob_(self) -> np.ndarray:
        """``log P(j | c)``, shape (n_classes, n_features) (0 for ignored never-seen columns)."""
        self._check_fitted()
        self._refresh()
        return self._linear_form()[0]
