"""The generative classifier base: statistics in, log-space decisions out.

Every model is a pair (statistics, scorer). Subclasses say how a batch becomes
statistics (:meth:`GenerativeClassifier._batch_stats`) and how the joint
log-likelihood ``log P(x, c) = log P(c) + log P(x | c)`` is computed from them
(:meth:`GenerativeClassifier._joint_log_likelihood`); everything else (posteriors by
log-sum-exp, ``predict``, merging, unlearning, forgetting) is derived here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np
import scipy.sparse as sp

from streamnb.exceptions import NotFittedError
from streamnb.stats.base import check_scale_factor, normalize_labels
from streamnb.stats.bundle import StatsBundle

if TYPE_CHECKING:
    from streamnb.models.prequential import PrequentialPrediction

#: Every concrete model class by its ``kind``; filled by ``__init_subclass__``.
MODEL_KINDS: dict[str, type[GenerativeClassifier]] = {}


class GenerativeClassifier(ABC):
    """Abstract online generative classifier (see the module docstring).

    Fitted attributes end with an underscore (``classes_``, ``n_features_in_``).
    Derived parameters are recomputed lazily: ``merge_stats`` records what changed
    and the next prediction re-derives only that.
    """

    kind: ClassVar[str]
    #: Whether the model accepts scipy.sparse input (the count models do).
    accepts_sparse: ClassVar[bool] = False
    #: Whether ``predict_log_proba_prequential`` is cheap enough for every batch of the
    #: daemon (vectorised, or a model small enough to copy); False where the exact method
    #: copies a table as wide as the hashed feature space.
    cheap_prequential: ClassVar[bool] = True

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "kind" in cls.__dict__:
            MODEL_KINDS[cls.kind] = cls

    def __init__(self) -> None:
        self._stats: StatsBundle | None = None

    # ------------------------------------------------------------------ params
    @abstractmethod
    def get_params(self) -> dict[str, Any]:
        """Hyper-parameters, JSON/msgpack friendly; ``type(self)(**get_params())`` is a clone."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # -------------------------------------------------------------- statistics
    @property
    def stats(self) -> StatsBundle:
        """The sufficient statistics (empty bundle before any data)."""
        if self._stats is None:
            self._stats = self._empty_stats()
        return self._stats

    @abstractmethod
    def _empty_stats(self) -> StatsBundle:
        """A bundle that summarises no data (the identity of merge)."""

    @abstractmethod
    def _batch_stats(self, X: Any, y: list, sample_weight: np.ndarray) -> StatsBundle:
        """Statistics of one validated batch alone (X already validated by _validate_X)."""

    @abstractmethod
    def _on_stats_changed(self, delta: StatsBundle | None) -> None:
        """Mark derived parameters stale; ``delta`` is what changed, None for everything."""

    @classmethod
    def from_stats(cls, stats: StatsBundle, **params: Any) -> Self:
        """A model with these hyper-parameters whose statistics are a copy of ``stats``."""
        model = cls(**params)
        model._stats = stats.copy()
        model._on_stats_changed(None)
        return model

    def batch_stats(self, X: Any, y: Any, sample_weight: Any = None) -> StatsBundle:
        """Validate a batch and return its statistics alone; the model is unchanged.

        This is what a worker commits as a delta: ``model.merge_stats(delta)`` is then
        the same as ``model.partial_fit(X, y, sample_weight=sample_weight)``.
        """
        X = self._validate_X(X)
        yl = self._validate_y(y, X.shape[0])
        w = self._validate_weight(sample_weight, X.shape[0])
        return self._batch_stats(X, yl, w)

    def merge_stats(self, delta: StatsBundle) -> Self:
        self.stats.merge(delta)
        self._on_stats_changed(delta)
        return self

    def subtract_stats(self, delta: StatsBundle) -> Self:
        self.stats.subtract(delta)
        self._on_stats_changed(delta)
        return self

    # ------------------------------------------------------------ learning API
    def partial_fit(
        self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None
    ) -> Self:
        """Learn one batch. ``classes`` is accepted for scikit-learn compatibility:
        classes listed there are registered (with zero weight) if not yet known."""
        delta = self.batch_stats(X, y, sample_weight)
        if classes is not None:
            self._register_classes(normalize_labels(classes))
        return self.merge_stats(delta)

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> Self:
        """Forget everything, then learn ``X, y`` in one batch."""
        fresh = type(self)(**self.get_params())  # validate against no earlier data
        delta = fresh.batch_stats(X, y, sample_weight)
        self._stats = self._empty_stats()
        self._on_stats_changed(None)
        return self.merge_stats(delta)

    def merge(self, other: GenerativeClassifier) -> Self:
        """Add another model's statistics (same kind; hyper-parameters are this model's)."""
        if type(other) is not type(self):
            raise ValueError(f"cannot merge a {type(other).__name__} into a {type(self).__name__}")
        return self.merge_stats(other.stats)

    def unlearn(self, X: Any, y: Any, sample_weight: Any = None) -> Self:
        """Remove previously learnt samples (the exact inverse of ``partial_fit``)."""
        return self.subtract_stats(self.batch_stats(X, y, sample_weight))

    def decay(self, g: float) -> Self:
        """Exponential forgetting: multiply every learnt weight by ``g`` in (0, 1]."""
        self.stats.scale(check_scale_factor(g))
        self._on_stats_changed(None)
        return self

    def _register_classes(self, labels: list) -> None:
        """Make ``labels`` known with zero weight; default: via an empty class-count merge."""
        self.stats["classes"].add_classes(labels)  # type: ignore[attr-defined]
        self._on_stats_changed(None)

    # -------------------------------------------------------------- prediction
    @property
    def classes_(self) -> np.ndarray:
        labels = self.stats["classes"].labels  # type: ignore[attr-defined]
        if not labels:
            raise NotFittedError(f"this {type(self).__name__} has not learnt any class yet")
        return np.asarray(labels, dtype=object if isinstance(labels[0], str) else np.int64)

    @abstractmethod
    def _joint_log_likelihood(self, X: Any) -> np.ndarray:
        """``log P(c) + log P(x | c)`` for validated X, shape (n_samples, n_classes).

        Classes with zero weight get ``-inf`` (computed without taking log(0))."""

    def predict_joint_log_proba(self, X: Any) -> np.ndarray:
        self._check_fitted()
        return self._joint_log_likelihood(self._validate_X(X, predicting=True))

    def predict_log_proba(self, X: Any) -> np.ndarray:
        """Log posteriors, normalised by log-sum-exp (never a product of probabilities)."""
        jll = self.predict_joint_log_proba(X)
        return log_normalize(jll)

    def predict_log_proba_prequential(
        self, X: Any, y: Any, sample_weight: Any = None, plan: Any = None
    ) -> PrequentialPrediction:
        """Log posteriors of each row by this model plus the labelled rows before it in
        the batch (label ``None``: unlabelled); the model itself is unchanged. See
        :mod:`streamnb.models.prequential`. ``plan``: :meth:`prequential_plan` of the same
        batch, made earlier (the model's statistics may have changed since)."""
        from streamnb.models.prequential import generic_prequential

        return generic_prequential(self, X, y, sample_weight)

    def prequential_plan(self, X: Any, y: Any, sample_weight: Any = None) -> Any:
        """The part of :meth:`predict_log_proba_prequential` that depends on the batch
        alone, to make before the model is current (None: nothing to prepare)."""
        return None

    def predict_proba(self, X: Any) -> np.ndarray:
        return np.exp(self.predict_log_proba(X))

    def predict(self, X: Any) -> np.ndarray:
        jll = self.predict_joint_log_proba(X)
        return self.classes_[np.argmax(jll, axis=1)]

    def _check_fitted(self) -> None:
        self.classes_  # noqa: B018 - raises NotFittedError

    # -------------------------------------------------------------- validation
    @property
    def n_features_in_(self) -> int:
        """Number of features, fixed by the first batch (or the constructor)."""
        n = self._n_features()
        if n is None:
            raise NotFittedError(f"this {type(self).__name__} has not seen any data yet")
        return n

    @abstractmethod
    def _n_features(self) -> int | None:
        """Feature count fixed so far, or None before the first batch."""

    def _validate_X(self, X: Any, predicting: bool = False) -> Any:
        """Return float64 dense ndarray or CSR matrix; check shape, finiteness, sign."""
        if sp.issparse(X):
            if not self.accepts_sparse:
                raise ValueError(f"{type(self).__name__} needs dense input, got a sparse matrix")
            X = sp.csr_matrix(X, dtype=np.float64)
            values = X.data
        else:
            try:
                X = np.asarray(X, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"X must be a numeric 2-d array: {exc}") from None
            if X.ndim != 2:
                raise ValueError(f"X must be 2-d (n_samples, n_features), got shape {X.shape}")
            values = X
        if X.shape[0] == 0:
            raise ValueError("empty batch: X has 0 samples")
        if not np.isfinite(values).all():
            raise ValueError("X contains NaN or infinity")
        n = self._n_features()
        if n is not None and X.shape[1] != n:
            raise ValueError(f"X has {X.shape[1]} features, but this model expects {n}")
        return X

    def _validate_y(self, y: Any, n_samples: int) -> list:
        y = list(np.asarray(y, dtype=object).ravel()) if not isinstance(y, list) else y
        if len(y) != n_samples:
            raise ValueError(f"y has {len(y)} labels, but X has {n_samples} samples")
        labels = normalize_labels(y)
        known = self.stats["classes"].labels  # type: ignore[attr-defined]
        if labels and known and type(labels[0]) is not type(known[0]):
            raise ValueError(
                f"labels of mixed types: the model has {type(known[0]).__name__} labels, "
                f"got {type(labels[0]).__name__} {labels[0]!r}"
            )
        return labels

    @staticmethod
    def _validate_weight(sample_weight: Any, n_samples: int) -> np.ndarray:
        if sample_weight is None:
            return np.ones(n_samples, dtype=np.float64)
        try:
            w = np.asarray(sample_weight, dtype=np.float64).ravel()
        except (TypeError, ValueError):
            raise ValueError("sample_weight must be numeric") from None
        if w.shape != (n_samples,):
            raise ValueError(f"sample_weight has {w.size} values, but X has {n_samples} samples")
        if not np.isfinite(w).all():
            raise ValueError("sample_weight contains NaN or infinity")
        if (w < 0).any():
            raise ValueError("sample_weight must be >= 0")
        return w


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
