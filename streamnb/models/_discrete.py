"""Shared machinery of the count models (multinomial and Bernoulli Naive Bayes).

Both keep ``StatsBundle(classes=ClassCounts, features=FeatureCounts)`` and score with
the linear form ``score_c = b_c + x . w_c``. Derived parameters are refreshed lazily,
at the next prediction: after ``merge_stats(delta)`` only the delta's touched columns
are re-derived (plus O(classes) per-class terms); ``None`` (fit, decay, new class,
wider feature space) re-derives everything once.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from streamnb.arrays import sorted_unique
from streamnb.models.base import GenerativeClassifier
from streamnb.models.logspace import log_class_prior
from streamnb.models.validation import check_nonnegative
from streamnb.stats.base import Label, normalize_labels
from streamnb.stats.bundle import StatsBundle
from streamnb.stats.class_counts import ClassCounts
from streamnb.stats.feature_counts import FeatureCounts

#: Values of ``smoothing_m``: m = number of columns (scikit-learn) or of features seen.
SMOOTHING_M_CHOICES = ("columns", "seen")


def check_alpha(alpha: Any) -> float:
    """Return ``alpha`` as a float > 0 (alpha = 0 would take log(0) for unseen features)."""
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a positive number, got {alpha!r}") from None
    if not (math.isfinite(a) and a > 0):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    return a


def check_n_features(n_features: Any) -> None:
    if n_features is not None and (
        isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) or n_features < 1
    ):
        raise ValueError(f"n_features must be None or an int >= 1, got {n_features!r}")


ClassPrior = list[float] | dict[Label, float] | None


def check_class_prior(class_prior: Any) -> ClassPrior:
    """Validate ``class_prior`` and return a copy the caller cannot change.

    Parameters
    ----------
    class_prior : None, sequence of float or mapping label -> float
        A non-empty sequence (in ``classes_`` order) or map of finite numbers >= 0.

    Returns
    -------
    None, list of float or dict label -> float
        A new list or dict of Python floats (labels normalised), never ``class_prior``.

    Raises
    ------
    ValueError
        For values that are not finite numbers >= 0, or an empty or non-1-d sequence.

    Examples
    --------
    >>> import numpy as np
    >>> given = np.array([0.25, 0.75])
    >>> kept = check_class_prior(given)
    >>> given[0] = 0.5
    >>> kept, check_class_prior({np.int64(1): 1})
    ([0.25, 0.75], {1: 1.0})
    """
    if class_prior is None:
        return None
    values = list(class_prior.values()) if isinstance(class_prior, Mapping) else class_prior
    keys = normalize_labels(list(class_prior)) if isinstance(class_prior, Mapping) else None
    try:
        p = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"class_prior must be numbers, got {class_prior!r}") from None
    if p.ndim != 1 or p.size == 0 or not np.isfinite(p).all() or (p < 0).any():
        raise ValueError(f"class_prior must be a non-empty sequence (or map) of finite "
                         f"numbers >= 0, got {class_prior!r}")
    return p.tolist() if keys is None else dict(zip(keys, p.tolist(), strict=True))


def fixed_log_prior(class_prior: Any, labels: list[Label]) -> np.ndarray:
    """``log class_prior`` in the order of ``labels`` (-inf for a prior of 0).

    >>> fixed_log_prior({"b": 0.25, "a": 0.75}, ["a", "b"]).round(4).tolist()
    [-0.2877, -1.3863]
    """
    if isinstance(class_prior, Mapping):
        prior = {normalize_labels([k])[0]: float(v) for k, v in class_prior.items()}
        missing = [lab for lab in labels if lab not in prior]
        if missing:
            raise ValueError(f"class_prior gives no prior for the classes {missing!r}")
        p = np.array([prior[lab] for lab in labels], dtype=np.float64)
    else:
        p = np.asarray(class_prior, dtype=np.float64)
        if p.size != len(labels):
            raise ValueError(f"Number of priors must match number of classes: class_prior has "
                             f"{p.size} values, the model has the classes {labels!r}")
    out = np.full(p.shape, -np.inf)
    np.log(p, out=out, where=p > 0)
    return out


class ClassPriorParam:
    """What a model with a ``class_prior`` parameter (the count models and CategoricalNB)
    learns with: the copy its ``_check_params`` validated into ``_class_prior``."""

    _class_prior: ClassPrior

    def _fitted_class_prior(self) -> ClassPrior:
        """``class_prior`` as validated when the model started learning (or at set_params)."""
        self.validate_params()
        return self._class_prior

    def _params_in_use(self) -> dict[str, Any]:
        return {**super()._params_in_use(),  # type: ignore[misc]
                "class_prior": self._fitted_class_prior()}


class DiscreteNB(ClassPriorParam, GenerativeClassifier):
    """Base of MultinomialNB and BernoulliNB: parameters, statistics, lazy refresh, linear form."""

    accepts_sparse = True
    positive_only = True
    poor_score = True

    def __init__(
        self, alpha: float = 1.0, n_features: int | None = None, smoothing_m: str = "columns",
        fit_prior: bool = True, class_prior: Any = None,
    ) -> None:
        super().__init__()
        self.alpha = alpha
        self.n_features = n_features
        self.smoothing_m = smoothing_m
        self.fit_prior = fit_prior
        self.class_prior = class_prior
        self._class_prior: ClassPrior = None
        self._reset_derived()

    def _check_params(self) -> None:
        check_alpha(self.alpha)
        check_n_features(self.n_features)
        if self.smoothing_m not in SMOOTHING_M_CHOICES:
            raise ValueError(f"smoothing_m must be one of {SMOOTHING_M_CHOICES}, got {self.smoothing_m!r}")
        if not isinstance(self.fit_prior, (bool, np.bool_)):
            raise ValueError(f"fit_prior must be True or False, got {self.fit_prior!r}")
        # A validated copy (see GaussianClassifier._check_params): class_log_prior_ keeps
        # it whatever then happens to the caller's array.
        self._class_prior = check_class_prior(self.class_prior)


    # ------------------------------------------------------------------ priors
    def _class_log_prior(self, counts: np.ndarray, labels: list[Label]) -> np.ndarray:
        """scikit-learn's ``class_log_prior_``: ``log class_prior`` if given, else the
        classes' shares of the weight (``fit_prior``), else uniform."""
        class_prior = self._fitted_class_prior()
        if class_prior is not None:
            return fixed_log_prior(class_prior, labels)
        if self.fit_prior:
            return log_class_prior(counts)
        return np.full(counts.shape, -math.log(max(counts.size, 1)))

    def _prior_rows(self, learnt: np.ndarray, classes: list[Label],
                    n_known: np.ndarray) -> np.ndarray:
        """The log priors a prequential prediction scores each row with: ``learnt`` (the
        weight shares before each row) unless ``class_prior`` or ``fit_prior=False``
        fix them; -inf for the classes a row does not know yet."""
        class_prior = self._fitted_class_prior()
        if class_prior is None and self.fit_prior:
            return learnt
        known = np.arange(len(classes))[None, :] < n_known[:, None]
        if class_prior is not None:
            prior = np.broadcast_to(fixed_log_prior(class_prior, classes), known.shape)
        else:
            prior = np.broadcast_to(-np.log(np.maximum(n_known, 1))[:, None], known.shape)
        return np.where(known, prior, -np.inf)

    @property
    def class_log_prior_(self) -> np.ndarray:
        """``log P(c)`` as the model scores with it (see :meth:`_class_log_prior`)."""
        self._check_fitted()
        self._refresh()
        return self._log_prior.copy()

    @property
    def feature_count_(self) -> np.ndarray:
        """Weighted feature counts per class, shape (n_classes, n_features) (for
        BernoulliNB, of the binarized input: document frequencies)."""
        self._check_fitted()
        return self._parts()[1].toarray()

    # -------------------------------------------------------------- statistics
    def _empty_stats(self) -> StatsBundle:
        return StatsBundle(classes=ClassCounts(), features=FeatureCounts(int(self.n_features or 0)))

    def _parts(self) -> tuple[ClassCounts, FeatureCounts]:
        cc, fc = self.stats.parts.get("classes"), self.stats.parts.get("features")
        if not isinstance(cc, ClassCounts) or not isinstance(fc, FeatureCounts) or len(self.stats.parts) != 2:
            raise ValueError(
                f"{type(self).__name__} needs statistics with parts classes (ClassCounts) and "
                f"features (FeatureCounts), got {self.stats!r}"
            )
        return cc, fc

    def _n_features(self) -> int | None:
        width = self._stats["features"].n_features if self._stats is not None else 0  # type: ignore[attr-defined]
        n = max(int(self.n_features or 0), width)
        return n or None

    def _count_matrix(self, X: Any) -> Any:
        """What is counted for validated X (identity; Bernoulli binarizes)."""
        return X

    def _batch_stats(self, X: Any, y: list, sample_weight: np.ndarray,
                     columns: Any = None) -> StatsBundle:
        width = self._n_features() or X.shape[1]
        features = FeatureCounts.sparse(width).update(self._count_matrix(X), y, sample_weight,
                                                      columns)
        return StatsBundle(classes=ClassCounts().update(y, sample_weight), features=features)

    def _validate_X(self, X: Any, predicting: bool = False) -> Any:
        X = super()._validate_X(X, predicting)
        if self.positive_only:
            check_nonnegative(X.data if sp.issparse(X) else X, type(self).__name__)
        return X

    # ------------------------------------------------------------ lazy refresh
    def _reset_derived(self) -> None:
        self._full_refresh = True
        self._pending: list[np.ndarray] = []
        self._coef_cache: tuple[np.ndarray, np.ndarray] | None = None
        self._shape = (0, 0)
        self._classes_stale = True

    def _on_stats_changed(self, delta: StatsBundle | None) -> None:
        cc, fc = self._parts()
        if fc.labels != cc.labels:  # (both sorted: the same labels are the same rows)
            cc.add_classes(fc.labels)
            fc.add_classes(cc.labels)
        fc.densify()
        self._coef_cache = None
        shape = (len(cc.labels), fc.n_features)
        delta_fc = None if delta is None else delta.parts.get("features")
        if shape != self._shape or not isinstance(delta_fc, FeatureCounts) or not delta_fc.is_sparse:
            self._full_refresh = True
            self._pending = []
        elif not self._full_refresh:
            self._pending.append(delta_fc.columns)  # type: ignore[arg-type]
            # Deltas pile up while nothing refreshes (e.g. a worker predicting labelled
            # batches prequentially, from the statistics): past 1/8 of the columns, sorting
            # them costs about what one full derivation does.
            if sum(p.size for p in self._pending) > fc.n_features // 8:
                self._full_refresh, self._pending = True, []
        self._shape = shape
        self._classes_stale = True

    def _refresh(self) -> tuple[ClassCounts, FeatureCounts]:
        """Bring derived parameters up to date with the statistics; return the parts."""
        cc, fc = self._parts()
        if self._full_refresh:
            self._derive_all(cc, fc)
            self._full_refresh, self._pending = False, []
            self._classes_stale = True
        elif self._pending:
            # one delta's columns are sorted and distinct already
            cols = self._pending[0] if len(self._pending) == 1 else \
                sorted_unique(np.concatenate(self._pending), runs=True)
            self._pending = []
            self._derive_columns(cc, fc, cols)
        if self._classes_stale:
            self._derive_classes(cc, fc)
            self._classes_stale = False
        return cc, fc

    @abstractmethod
    def _derive_all(self, cc: ClassCounts, fc: FeatureCounts) -> None:
        """Re-derive every per-feature parameter."""

    @abstractmethod
    def _derive_columns(self, cc: ClassCounts, fc: FeatureCounts, cols: np.ndarray) -> None:
        """Re-derive the per-feature parameters of columns ``cols`` only."""

    @abstractmethod
    def _derive_classes(self, cc: ClassCounts, fc: FeatureCounts) -> None:
        """Re-derive the per-class terms (priors, denominators, constants)."""

    @abstractmethod
    def _linear_form(self) -> tuple[np.ndarray, np.ndarray]:
        """Full ``(W, b)``: ``log P(x, c) = b_c + x . W[c]``, W of shape (n_classes, n_features)."""

    def _derive(self) -> None:
        self._refresh()
        self._coef_intercept()

    def unseen_share(self, X: Any) -> np.ndarray:
        """Share of each row's nonzero features whose column holds no count in any class
        (0 for an empty row), shape (n_samples,).

        >>> import numpy as np
        >>> from streamnb.models import MultinomialNB
        >>> m = MultinomialNB().fit(np.array([[1, 0, 0], [0, 1, 0]]), ["a", "b"])
        >>> m.unseen_share(np.array([[1, 0, 3], [0, 0, 0]])).tolist()
        [0.5, 0.0]
        """
        X = sp.csr_matrix(self._validate_X(X, predicting=True))
        X.eliminate_zeros()
        sizes = np.diff(X.indptr)
        out = np.zeros(X.shape[0])
        if not X.nnz:
            return out
        fc = self._parts()[1]
        unseen = ~fc.column_counts(X.indices).any(axis=0) if len(fc.labels) else \
            np.ones(X.nnz, dtype=bool)
        row = np.repeat(np.arange(X.shape[0]), sizes)
        n_unseen = np.bincount(row, weights=unseen, minlength=X.shape[0])
        has = sizes > 0
        out[has] = 1.0 - (sizes[has] - n_unseen[has]) / sizes[has]
        return out

    def _m(self, fc: FeatureCounts) -> int:
        """The smoothing width m: number of columns, or of distinct features seen."""
        return fc.n_features if self.smoothing_m == "columns" else fc.n_seen

    # ------------------------------------------------------------ linear form
    def _coef_intercept(self) -> tuple[np.ndarray, np.ndarray]:
        self._check_fitted()
        if self._coef_cache is None:
            self._refresh()
            W, b = self._linear_form()
            if W.shape[0] == 2:
                with np.errstate(invalid="ignore"):
                    W, b = (W[1] - W[0])[None, :], np.array([b[1] - b[0]])
            self._coef_cache = (W, b)
        return self._coef_cache

    @property
    def coef_(self) -> np.ndarray:
        """Linear log-odds weights: ``(1, n_features)`` for two classes (class 1 vs 0),
        else the per-class weights ``(n_classes, n_features)``."""
        return self._coef_intercept()[0]

    @property
    def intercept_(self) -> np.ndarray:
        """Intercepts matching :attr:`coef_`."""
        return self._coef_intercept()[1]

    def decision_function(self, X: Any) -> np.ndarray:
        """``X . coef_ + intercept_``; for two classes the log-odds of ``classes_[1]``
        (predict it when >= 0), shape (n_samples,)."""
        W, b = self._coef_intercept()
        Xc = self._count_matrix(self._validate_X(X, predicting=True))
        scores = np.asarray(Xc @ W.T) + b
        return scores.ravel() if W.shape[0] == 1 else scores

    # ------------------------------------------------------------ explanation
    def _log_odds_terms(self, X: Any, a: int, b: int) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Per present feature j: ``x_j (W[b, j] - W[a, j])`` of the linear form (for
        BernoulliNB x_j = 1 and the weight is ``logit theta_bj - logit theta_aj``, the
        absent terms being in the bias); the bias is ``b_b - b_a``."""
        self._refresh()
        Xc = sp.csr_matrix(self._count_matrix(X), dtype=np.float64, copy=True)
        Xc.sum_duplicates()
        Xc.eliminate_zeros()
        with np.errstate(invalid="ignore"):
            terms = Xc.data * self._pair_weights(Xc.indices, a, b)
        return self._pair_bias(a, b), Xc.indptr, Xc.indices, terms

    def log_odds_weights(self, columns: Any = None, classes: Any = None) -> np.ndarray:
        """How much one unit of each feature moves the log-odds of ``classes[1]`` against
        ``classes[0]`` (default: ``classes_[1]`` against ``classes_[0]``): for
        MultinomialNB ``log P(j|b) - log P(j|a)`` per occurrence, for BernoulliNB
        ``logit theta_bj - logit theta_aj`` for its presence; the per-unit terms of
        :meth:`explain`. ``columns``: the features (default all), shape (n,).

        >>> import numpy as np
        >>> from streamnb.models import MultinomialNB
        >>> m = MultinomialNB().fit(np.array([[3, 0], [0, 1]]), ["ham", "spam"])
        >>> m.log_odds_weights().round(4).tolist()  # log((1/3) / (4/5)), log((2/3) / (1/5))
        [-0.8755, 1.204]
        """
        self._check_fitted()
        self.validate_params()
        a, b, _ = self._class_pair(classes)
        self._refresh()
        n = self.n_features_in_
        cols = np.arange(n) if columns is None else np.asarray(columns, dtype=np.int64).ravel()
        if cols.size and (cols.min() < 0 or cols.max() >= n):
            raise ValueError(f"columns must be in [0, {n}), got {cols.min()}..{cols.max()}")
        return self._pair_weights(cols, a, b)

    @abstractmethod
    def _pair_weights(self, cols: np.ndarray, a: int, b: int) -> np.ndarray:
        """``W[b, j] - W[a, j]`` for the columns ``cols`` (derived parameters current)."""

    @abstractmethod
    def _pair_bias(self, a: int, b: int) -> float:
        """``b_b - b_a`` of the linear form (derived parameters current)."""
