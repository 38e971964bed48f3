"""The generative classifier base: statistics in, log-space decisions out.

Every model is a pair (statistics, scorer). Subclasses say how a batch becomes
statistics (:meth:`GenerativeClassifier._batch_stats`) and how the joint
log-likelihood ``log P(x, c) = log P(c) + log P(x | c)`` is computed from them
(:meth:`GenerativeClassifier._joint_log_likelihood`); everything else (posteriors by
log-sum-exp, ``predict``, merging, unlearning, forgetting) is derived here.

A model is a scikit-learn estimator without importing scikit-learn: ``get_params`` /
``set_params`` over the constructor's arguments (kept as given, checked when the model
learns or predicts), ``fit``, ``partial_fit``, ``score``, ``__sklearn_tags__`` and the
input checks of :mod:`streamnb.models.validation`. Its fitted state is its statistics,
plus validated copies of the parameters it keeps (the priors), taken by ``fit``, the
first ``partial_fit`` and ``set_params``: changing the caller's array afterwards changes
nothing. What is derived from them (``classes_``, ``class_log_prior_``, ...) is read
through properties, so a model that learnt from a merge or a decoded delta has them too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self

import numpy as np

from streamnb.exceptions import NotFittedError
from streamnb.models.explanation import Explanation, check_k, class_pair, top_terms
from streamnb.models.logspace import log_normalize
from streamnb.models.params import HyperParams
from streamnb.models.prequential import PrequentialPrediction, generic_prequential
from streamnb.models.validation import check_labels, check_sample_weight, check_X
from streamnb.stats.base import check_scale_factor
from streamnb.stats.bundle import StatsBundle


class GenerativeClassifier(HyperParams, ABC):
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
    #: Whether X must be >= 0 (scikit-learn's ``positive_only`` input tag).
    positive_only: ClassVar[bool] = False
    #: scikit-learn's ``poor_score`` tag: its estimator checks then ask for no accuracy
    #: on their Gaussian blobs (set, as on scikit-learn's own, for the count models).
    poor_score: ClassVar[bool] = False
    #: scikit-learn before 1.6 reads this instead of ``__sklearn_tags__``.
    _estimator_type: ClassVar[str] = "classifier"

    def __init__(self) -> None:
        self._stats: StatsBundle | None = None
        self._params_checked = False

    # ------------------------------------------------------------------ params
    def set_params(self, **params: Any) -> Self:
        """Set hyper-parameters. A model's fitted state is its statistics, so a fitted
        model predicts with the new values from its next prediction on (no refit)."""
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"Invalid parameter {name!r} for estimator "
                                 f"{type(self).__name__}. Valid parameters are: {valid!r}.")
            setattr(self, name, value)
        self._params_checked = False
        self._on_params_changed()
        return self

    def _on_params_changed(self) -> None:
        """Derived parameters follow the hyper-parameters: re-derive them all."""
        if self._stats is not None:
            self._on_stats_changed(None)

    @abstractmethod
    def _check_params(self) -> None:
        """Raise ValueError for a hyper-parameter out of its range; keep a validated copy
        of a parameter the model reads later (an array the caller may change)."""

    def validate_params(self) -> Self:
        """Check the hyper-parameters now (a model does so before it first learns or
        predicts); ValueError names the wrong one.

        Once checked, they are not read again until ``fit``, a ``partial_fit`` of an
        unfitted model or ``set_params``: the model keeps what it validated.
        """
        if not self._params_checked:
            self._check_params()
            self._params_checked = True
        return self

    def _params_in_use(self) -> dict[str, Any]:
        """``get_params()`` with each parameter as the model uses it (a validated copy
        where it keeps one): what a copy of this model is made with (a model file, a
        scratch model), whatever has happened to the caller's arrays since."""
        self.validate_params()
        return self.get_params()

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's tags (called by scikit-learn only, so it is imported here)."""
        # defer scikit-learn (optional): imported only when scikit-learn asks for the tags
        from sklearn.utils import ClassifierTags, InputTags, Tags, TargetTags

        return Tags(
            estimator_type="classifier",
            target_tags=TargetTags(required=True),
            classifier_tags=ClassifierTags(poor_score=self.poor_score),
            input_tags=InputTags(sparse=self.accepts_sparse, positive_only=self.positive_only,
                                 categorical=False),
        )

    def __sklearn_is_fitted__(self) -> bool:
        return self._stats is not None and bool(self.stats["classes"].labels)  # type: ignore[attr-defined]

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
        model = cls(**params).validate_params()
        model._stats = stats.copy()
        model._on_stats_changed(None)
        return model

    def batch_stats(self, X: Any, y: Any, sample_weight: Any = None,
                    columns: Any = None) -> StatsBundle:
        """Validate a batch and return its statistics alone; the model is unchanged.

        This is what a worker commits as a delta: ``model.merge_stats(delta)`` is then
        the same as ``model.partial_fit(X, y, sample_weight=sample_weight)``. ``columns``:
        X's columns found before (``streamnb.stats.feature_counts.batch_columns``, as a
        MultinomialNB's prequential plan holds them), for the models that count features.
        """
        self.validate_params()
        X = self._validate_X(X)
        yl, w = self._validate_y(y, X.shape[0]), self._validate_weight(sample_weight, X.shape[0])
        return self._batch_stats(X, yl, w) if columns is None else \
            self._batch_stats(X, yl, w, columns=columns)  # type: ignore[call-arg]

    def merge_stats(self, delta: StatsBundle) -> Self:
        self.stats.merge(delta)
        self._on_stats_changed(delta)
        return self

    def subtract_stats(self, delta: StatsBundle, clip: bool = False) -> Self:
        """Remove ``delta``'s data; ValueError, and nothing changed, if the model does not
        hold it (more weight than was learnt, see :meth:`StatsBundle.subtract`).
        ``clip``: remove at most what each statistic holds, unchecked (a worker applying
        a label correction of a message that a decay has shrunk since it was learnt)."""
        self.stats.subtract(delta, clip=clip)
        self._on_stats_changed(delta)
        return self

    # ------------------------------------------------------------ learning API
    def partial_fit(
        self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None
    ) -> Self:
        """Learn one batch. ``classes`` (as scikit-learn's): classes listed there are
        registered with zero weight if not known yet; unlike scikit-learn's, it is never
        required, since classes are found as they arrive. The first call reads the
        hyper-parameters anew, as ``fit`` does."""
        if not self.__sklearn_is_fitted__():
            self._params_checked = False
        delta = self.batch_stats(X, y, sample_weight)
        if classes is not None:
            self._register_classes(check_labels(classes, type(self).__name__))
        return self.merge_stats(delta)

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> Self:
        """Forget everything, then learn ``X, y`` in one batch (reading the
        hyper-parameters anew)."""
        self._params_checked = False
        self.validate_params()
        fresh = type(self)(**self.get_params())  # validate against no earlier data
        delta = fresh.batch_stats(X, y, sample_weight)
        if sample_weight is not None and not delta["classes"].counts.any():  # type: ignore[attr-defined]
            raise ValueError("Sample weights must contain at least one non-zero number.")
        self._stats = self._empty_stats()
        self._on_stats_changed(None)
        self.merge_stats(delta)
        self._derive()  # a fitted model's predictions then change nothing in it
        return self

    @abstractmethod
    def _derive(self) -> None:
        """Bring every derived parameter up to date (predictions do it lazily)."""

    def merge(self, other: GenerativeClassifier) -> Self:
        """Add another model's statistics (same kind; hyper-parameters are this model's)."""
        if type(other) is not type(self):
            raise ValueError(f"cannot merge a {type(other).__name__} into a {type(self).__name__}")
        return self.merge_stats(other.stats)

    def unlearn(self, X: Any, y: Any, sample_weight: Any = None) -> Self:
        """Remove previously learnt samples (the exact inverse of ``partial_fit``).
        Samples the model cannot hold (more weight than was learnt) raise ValueError and
        change nothing."""
        return self.subtract_stats(self.batch_stats(X, y, sample_weight))

    def remove_class(self, label: Any) -> bool:
        """Drop class ``label`` and everything learnt under it from every statistic (its
        rows; what is pooled over classes follows the classes left), so that the model is
        one that never saw the class; False (nothing changed) when it is not a class here.

        >>> from streamnb import GaussianNB
        >>> g = GaussianNB().partial_fit([[0.0], [1.0], [5.0]], ["ham", "ham", "Spam"])
        >>> g.remove_class("Spam"), g.classes_.tolist(), g.remove_class("Spam")
        (True, ['ham'], False)
        """
        if not self.stats.remove_class(label):
            return False
        self._on_stats_changed(None)
        return True

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
        """The classes, sorted (as scikit-learn's), whichever order they arrived in."""
        labels = self.stats["classes"].labels  # type: ignore[attr-defined]
        if not labels:
            raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet: it "
                                 "has not learnt any class.")
        return np.asarray(labels, dtype=object if isinstance(labels[0], str) else np.int64)

    @property
    def class_count_(self) -> np.ndarray:
        """Weighted number of samples per class, in ``classes_`` order."""
        self._check_fitted()
        return self.stats["classes"].counts.copy()  # type: ignore[attr-defined]

    @abstractmethod
    def _joint_log_likelihood(self, X: Any) -> np.ndarray:
        """``log P(c) + log P(x | c)`` for validated X, shape (n_samples, n_classes).

        Classes with zero weight get ``-inf`` (computed without taking log(0))."""

    def predict_joint_log_proba(self, X: Any) -> np.ndarray:
        self._check_fitted()
        self.validate_params()
        return self._joint_log_likelihood(self._validate_X(X, predicting=True))

    def predict_log_proba(self, X: Any) -> np.ndarray:
        """Log posteriors, normalised by log-sum-exp (never a product of probabilities)."""
        jll = self.predict_joint_log_proba(X)
        return log_normalize(jll)

    def decision_function(self, X: Any) -> np.ndarray:
        """The log-odds ``log P(classes_[1], x) - log P(classes_[0], x)`` of each row for a
        two-class model, shape (n_samples,) (predict ``classes_[1]`` when >= 0); with more
        classes, the joint log-likelihoods, shape (n_samples, n_classes).

        >>> import numpy as np
        >>> from streamnb.models import CategoricalNB
        >>> m = CategoricalNB().fit(np.array([[0], [0], [1]]), ["a", "a", "b"])
        >>> # log(1/3 * 1/3) - log(2/3 * 3/4)
        >>> float(m.decision_function(np.array([[0]]))[0].round(4))
        -1.5041
        """
        jll = self.predict_joint_log_proba(X)
        if jll.shape[1] != 2:
            return jll
        with np.errstate(invalid="ignore"):
            return jll[:, 1] - jll[:, 0]

    def explain(self, X: Any, k: int = 10, classes: Any = None) -> Explanation:
        """The ``k`` features of one message that move its log-odds most.

        Parameters
        ----------
        X : array-like or sparse matrix, shape (1, n_features) or (n_features,)
            One message.
        k : int
            How many features to name (the others are summed in ``other``).
        classes : (negative, positive), optional
            The pair of classes whose log-odds are explained; default ``classes_[0],
            classes_[1]`` of a two-class model (required with more classes).

        Returns
        -------
        Explanation
            ``bias + contributions.sum() + other`` equals :meth:`decision_function` of
            the message (for ``classes``: the difference of the two classes' joint
            log-likelihoods) up to float rounding.

        Raises
        ------
        ValueError
            For a model that cannot split its log-odds per feature (LDA, QDA), a class
            not learnt or without weight, or more than one row.

        Examples
        --------
        >>> import numpy as np
        >>> from streamnb.models import BernoulliNB
        >>> X = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 1]])
        >>> model = BernoulliNB().fit(X, ["ham", "ham", "spam"])
        >>> e = model.explain(np.array([0, 1, 1]), k=1)
        >>> # feature 2: logit(2/3) - logit(1/4) = log 2 + log 3; feature 1 (in other): -log 2
        >>> e.classes, e.features.tolist(), e.contributions.round(4).tolist(), round(e.other, 4)
        (('ham', 'spam'), [2], [1.7918], -0.6931)
        >>> bool(np.isclose(e.log_odds, model.decision_function(np.array([[0, 1, 1]]))[0]))
        True
        """
        if np.ndim(X) == 1 and not hasattr(X, "tocsr"):
            X = np.asarray(X)[None, :]
        explained = self.explain_rows(X, k, classes)
        if len(explained) != 1:
            raise ValueError(f"explain takes one message, got {len(explained)} rows "
                             "(explain_rows explains each row)")
        return explained[0]

    def explain_rows(self, X: Any, k: int = 10, classes: Any = None) -> list[Explanation]:
        """:meth:`explain` of every row of ``X``, in order (one vectorised pass)."""
        k = check_k(k)
        self._check_fitted()
        self.validate_params()
        a, b, pair = self._class_pair(classes)
        bias, indptr, features, terms = self._log_odds_terms(self._validate_X(X, predicting=True), a, b)
        return [top_terms(bias, features[s:e], terms[s:e], k, pair)
                for s, e in zip(indptr[:-1].tolist(), indptr[1:].tolist(), strict=True)]

    def _class_pair(self, classes: Any) -> tuple[int, int, tuple[Any, Any]]:
        """(row of negative, row of positive, the pair as labels) of :meth:`explain`."""
        return class_pair([c.item() if hasattr(c, "item") else c for c in self.classes_],
                          self.stats["classes"].counts, classes,  # type: ignore[attr-defined]
                          type(self).__name__)

    def _log_odds_terms(self, X: Any, a: int, b: int) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """The log-odds of class row ``b`` against row ``a`` for validated X, per feature:
        ``(bias, indptr, features, terms)``, row i's features and terms in
        ``[indptr[i]:indptr[i + 1]]`` (CSR layout). Models whose log-odds do not split
        per feature raise ValueError."""
        raise ValueError(f"{type(self).__name__} does not split its log-odds per feature: "
                         "explain is for the naive Bayes models")

    def predict_log_proba_prequential(
        self, X: Any, y: Any, sample_weight: Any = None, plan: Any = None
    ) -> PrequentialPrediction:
        """Log posteriors of each row by this model plus the labelled rows before it in
        the batch (label ``None``: unlabelled); the model itself is unchanged. See
        :mod:`streamnb.models.prequential`. ``plan``: :meth:`prequential_plan` of the same
        batch, made earlier (the model's statistics may have changed since)."""
        self.validate_params()
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

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Mean accuracy of ``predict(X)`` against ``y`` (weighted by ``sample_weight``)."""
        truth = self._validate_y(y, _n_rows(X), learning=False)
        pred = self.predict(X).tolist()
        right = np.fromiter((p == t for p, t in zip(pred, truth, strict=True)), dtype=np.float64,
                            count=len(truth))
        return float(np.average(right, weights=sample_weight))

    def unseen_share(self, X: Any) -> np.ndarray:
        """Share of each row's nonzero features that the model holds no count for, shape
        (n_samples,); 0 for an empty row and for models without feature counts (every
        feature of a dense model is "seen")."""
        return np.zeros(_n_rows(X))

    def _check_fitted(self) -> None:
        self.classes_  # noqa: B018 - raises NotFittedError

    # -------------------------------------------------------------- validation
    @property
    def n_features_in_(self) -> int:
        """Number of features, fixed by the first batch (or the constructor)."""
        n = self._n_features()
        if n is None:
            raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet: it "
                                 "has not seen any data.")
        return n

    @abstractmethod
    def _n_features(self) -> int | None:
        """Feature count fixed so far, or None before the first batch."""

    def _validate_X(self, X: Any, predicting: bool = False) -> Any:
        """Return float64 dense ndarray or CSR matrix; check shape, finiteness, width."""
        return check_X(X, type(self).__name__, accept_sparse=self.accepts_sparse,
                       n_features=self._n_features())

    def _validate_y(self, y: Any, n_samples: int, learning: bool = True) -> list:
        labels = check_labels(y, type(self).__name__)
        if len(labels) != n_samples:
            raise ValueError(f"y has {len(labels)} labels, but X has {n_samples} samples")
        known = self.stats["classes"].labels  # type: ignore[attr-defined]
        if learning and labels and known and type(labels[0]) is not type(known[0]):
            raise ValueError(
                f"labels of mixed types: the model has {type(known[0]).__name__} labels, "
                f"got {type(labels[0]).__name__} {labels[0]!r}"
            )
        return labels

    @staticmethod
    def _validate_weight(sample_weight: Any, n_samples: int) -> np.ndarray:
        return check_sample_weight(sample_weight, n_samples)


def _n_rows(X: Any) -> int:
    shape = getattr(X, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else len(X)

