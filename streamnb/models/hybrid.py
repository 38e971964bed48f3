"""Hybrid Naive Bayes for mail: a token block and a Gaussian block over meta-features.

Under class-conditional independence of the two blocks,
``log P(x, c) = log P(c) + log P(tokens | c) + log P(meta | c)``: the joint
log-likelihoods of a count model (multinomial or Bernoulli NB) over the first
``n_features`` columns and of a GaussianNB over the last ``n_meta`` columns add,
and the prior is counted once. ``X`` is one CSR matrix (as
:meth:`streamnb.features.Featurizer.stack` builds it with ``meta=True``).

The statistics are one bundle with the parts ``classes`` (shared by both blocks),
``features`` (the token counts) and ``moments`` (the meta moments), so the hybrid
merges, unlearns and forgets like any other model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from streamnb.features.mail import N_META
from streamnb.models._discrete import DiscreteNB, log_class_prior
from streamnb.models.base import GenerativeClassifier
from streamnb.models.bernoulli import BernoulliNB
from streamnb.models.gaussian import GaussianNB
from streamnb.models.multinomial import MultinomialNB
from streamnb.stats.bundle import StatsBundle
from streamnb.stats.class_counts import ClassCounts

__all__ = ["HybridNB", "TOKEN_MODELS"]

#: The token block's model, by name.
TOKEN_MODELS: dict[str, type[DiscreteNB]] = {"multinomial": MultinomialNB, "bernoulli": BernoulliNB}


class HybridNB(GenerativeClassifier):
    """Token block (multinomial/Bernoulli NB) + GaussianNB over the last ``n_meta`` columns.

    ``n_features`` is the total width (token columns + ``n_meta``), as the featurizer's
    ``n_columns``; ``n_meta`` defaults to the mail meta vector's length. The other
    parameters are the token block's (``alpha``, ``binarize`` for Bernoulli,
    ``smoothing_m``) and the Gaussian block's (``var_smoothing``).

    >>> import numpy as np
    >>> X = np.array([[3, 0, 1.0, 10.0], [2, 1, 1.2, 11.0], [0, 2, 5.0, 1.0], [0, 3, 5.5, 2.0]])
    >>> model = HybridNB(n_meta=2).fit(X, ["spam", "spam", "ham", "ham"])
    >>> model.predict(np.array([[1, 0, 1.1, 10.5], [0, 1, 5.2, 1.5]])).tolist()
    ['spam', 'ham']
    """

    kind = "hybrid"
    cheap_prequential = False  # its exact prequential method copies the count table
    accepts_sparse = True

    def __init__(
        self,
        n_meta: int = N_META,
        token_model: str = "multinomial",
        alpha: float = 1.0,
        binarize: float | None = 0.0,
        n_features: int | None = None,
        smoothing_m: str = "seen",
        var_smoothing: float = 1e-9,
    ) -> None:
        super().__init__()
        if isinstance(n_meta, bool) or not isinstance(n_meta, (int, np.integer)) or n_meta < 1:
            raise ValueError(f"n_meta must be an int >= 1, got {n_meta!r}")
        if token_model not in TOKEN_MODELS:
            raise ValueError(f"token_model must be one of {sorted(TOKEN_MODELS)}, got {token_model!r}")
        if n_features is not None and (
            isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer))
            or n_features <= n_meta
        ):
            raise ValueError(
                f"n_features is the total width (token columns + {n_meta} meta columns), "
                f"so it must be an int > {n_meta}; got {n_features!r}"
            )
        self.n_meta = int(n_meta)
        self.token_model = token_model
        self.binarize = binarize
        n_tokens = None if n_features is None else int(n_features) - self.n_meta
        if token_model == "bernoulli":
            self.tokens_ = BernoulliNB(alpha, binarize, n_tokens, smoothing_m)
        else:
            self.tokens_: DiscreteNB = MultinomialNB(alpha, n_tokens, smoothing_m)
        self.meta_ = GaussianNB(var_smoothing)
        self._bound: tuple[int, int, int] | None = None

    def get_params(self) -> dict[str, Any]:
        tok = self.tokens_.get_params()
        return {
            "n_meta": self.n_meta,
            "token_model": self.token_model,
            "alpha": tok["alpha"],
            "binarize": self.binarize,
            "n_features": None if tok["n_features"] is None else tok["n_features"] + self.n_meta,
            "smoothing_m": tok["smoothing_m"],
            "var_smoothing": self.meta_.var_smoothing,
        }

    # -------------------------------------------------------------- statistics
    def _empty_stats(self) -> StatsBundle:
        return StatsBundle(
            classes=ClassCounts(),
            features=self.tokens_._empty_stats()["features"],
            moments=self.meta_._empty_stats()["moments"],
        )

    def _bind(self) -> None:
        """Point both blocks at this model's statistic parts (the class counts are shared)."""
        parts = self.stats.parts
        if set(parts) != {"classes", "features", "moments"}:
            raise ValueError(f"HybridNB needs parts classes, features, moments; got {sorted(parts)}")
        key = (id(parts["classes"]), id(parts["features"]), id(parts["moments"]))
        if key != self._bound:
            self.tokens_._stats = StatsBundle(classes=parts["classes"], features=parts["features"])
            self.meta_._stats = StatsBundle(classes=parts["classes"], moments=parts["moments"])
            self._bound = key

    def _split(self, X: Any) -> tuple[Any, np.ndarray]:
        width = X.shape[1] - self.n_meta
        if width < 1:
            raise ValueError(
                f"X has {X.shape[1]} columns, but this model needs token columns plus {self.n_meta} meta columns"
            )
        if sp.issparse(X):
            X = sp.csr_matrix(X)
            return X[:, :width], np.asarray(X[:, width:].toarray(), dtype=np.float64)
        return X[:, :width], np.asarray(X[:, width:], dtype=np.float64)

    def _n_features(self) -> int | None:
        self._bind()
        n = self.tokens_._n_features()
        return None if n is None else n + self.n_meta

    def _validate_X(self, X: Any, predicting: bool = False) -> Any:
        X = super()._validate_X(X, predicting)
        tokens, meta = self._split(X)
        self._bind()
        tokens = self.tokens_._validate_X(tokens, predicting)
        meta = self.meta_._validate_X(meta, predicting)
        return tokens, meta

    def _batch_stats(self, X: Any, y: list, sample_weight: np.ndarray) -> StatsBundle:
        tokens, meta = X
        t = self.tokens_._batch_stats(tokens, y, sample_weight)
        m = self.meta_._batch_stats(meta, y, sample_weight)
        return StatsBundle(classes=t["classes"], features=t["features"], moments=m["moments"])

    def batch_stats(self, X: Any, y: Any, sample_weight: Any = None) -> StatsBundle:
        X = self._validate_X(X)
        n = X[0].shape[0]
        yl = self._validate_y(y, n)
        w = self._validate_weight(sample_weight, n)
        return self._batch_stats(X, yl, w)

    def _on_stats_changed(self, delta: StatsBundle | None) -> None:
        self._bind()
        if delta is None:
            self.tokens_._on_stats_changed(None)
            self.meta_._on_stats_changed(None)
            return
        self.tokens_._on_stats_changed(StatsBundle(classes=delta["classes"], features=delta["features"]))
        self.meta_._on_stats_changed(StatsBundle(classes=delta["classes"], moments=delta["moments"]))

    def _register_classes(self, labels: list) -> None:
        self._bind()
        self.stats["classes"].add_classes(labels)  # type: ignore[attr-defined]
        self.meta_.moments.add_classes(labels)
        self._on_stats_changed(None)

    # -------------------------------------------------------------- prediction
    def _joint_log_likelihood(self, X: Any) -> np.ndarray:
        tokens, meta = X
        self._bind()
        jll_tokens = self.tokens_._joint_log_likelihood(tokens)
        jll_meta = self.meta_._joint_log_likelihood(meta)
        prior = log_class_prior(self.stats["classes"].counts)  # type: ignore[attr-defined]
        # Both blocks include log P(c); keep it once. Classes with no weight stay -inf.
        with np.errstate(invalid="ignore"):
            out = jll_tokens + jll_meta - prior
        out[:, ~np.isfinite(prior)] = -np.inf
        return out
