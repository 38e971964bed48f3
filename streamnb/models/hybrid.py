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
from streamnb.models._discrete import DiscreteNB
from streamnb.models.base import GenerativeClassifier
from streamnb.models.bernoulli import BernoulliNB
from streamnb.models.gaussian import GaussianNB
from streamnb.models.logspace import log_class_prior
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
    positive_only = True  # (the token columns; the meta columns may be negative)
    poor_score = True

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
        self.n_meta = n_meta
        self.token_model = token_model
        self.alpha = alpha
        self.binarize = binarize
        self.n_features = n_features
        self.smoothing_m = smoothing_m
        self.var_smoothing = var_smoothing
        self._tokens: DiscreteNB | None = None
        self._meta: GaussianNB | None = None
        self._bound: tuple[Any, Any, Any] | None = None  # the parts the blocks are bound to

    def _check_params(self) -> None:
        n_meta, n_features = self.n_meta, self.n_features
        if isinstance(n_meta, bool) or not isinstance(n_meta, (int, np.integer)) or n_meta < 1:
            raise ValueError(f"n_meta must be an int >= 1, got {n_meta!r}")
        if self.token_model not in TOKEN_MODELS:
            raise ValueError(f"token_model must be one of {sorted(TOKEN_MODELS)}, got {self.token_model!r}")
        if n_features is not None and (
            isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer))
            or n_features <= n_meta
        ):
            raise ValueError(
                f"n_features is the total width (token columns + {n_meta} meta columns), "
                f"so it must be an int > {n_meta}; got {n_features!r}"
            )
        self._blocks()[0].validate_params()
        self._blocks()[1].validate_params()

    def _blocks(self) -> tuple[DiscreteNB, GaussianNB]:
        """The token and the meta block, made from the current parameters."""
        if self._tokens is None or self._meta is None:
            n_tokens = None if self.n_features is None else int(self.n_features) - int(self.n_meta)
            if self.token_model == "bernoulli":
                self._tokens = BernoulliNB(self.alpha, self.binarize, n_tokens, self.smoothing_m)
            else:
                self._tokens = MultinomialNB(self.alpha, n_tokens, self.smoothing_m)
            self._meta = GaussianNB(self.var_smoothing)
            self._bound = None
        return self._tokens, self._meta

    def _on_params_changed(self) -> None:
        self._tokens = self._meta = None
        super()._on_params_changed()

    @property
    def tokens_(self) -> DiscreteNB:
        """The token block, a count model on this model's ``classes`` and ``features``."""
        self._check_fitted()
        self._bind()
        return self._blocks()[0]

    @property
    def meta_(self) -> GaussianNB:
        """The meta block, a GaussianNB on this model's ``classes`` and ``moments``."""
        self._check_fitted()
        self._bind()
        return self._blocks()[1]

    @property
    def class_log_prior_(self) -> np.ndarray:
        """``log P(c)``, the classes' shares of the weight (counted once)."""
        self._check_fitted()
        return log_class_prior(self.stats["classes"].counts)  # type: ignore[attr-defined]

    def _derive(self) -> None:
        self._bind()
        tokens, meta = self._blocks()
        tokens._refresh()
        meta._refresh()

    def unseen_share(self, X: Any) -> np.ndarray:
        """The token block's :meth:`~DiscreteNB.unseen_share` (meta columns are dense)."""
        tokens, _ = self._validate_X(X, predicting=True)
        return self._blocks()[0].unseen_share(tokens)

    # -------------------------------------------------------------- statistics
    def _empty_stats(self) -> StatsBundle:
        tokens, meta = self._blocks()
        return StatsBundle(
            classes=ClassCounts(),
            features=tokens._empty_stats()["features"],
            moments=meta._empty_stats()["moments"],
        )

    def _bind(self) -> None:
        """Point both blocks at this model's statistic parts (the class counts are shared)."""
        parts = self.stats.parts
        if set(parts) != {"classes", "features", "moments"}:
            raise ValueError(f"HybridNB needs parts classes, features, moments; got {sorted(parts)}")
        key = (parts["classes"], parts["features"], parts["moments"])
        tokens, meta = self._blocks()
        if self._bound is None or any(a is not b for a, b in zip(key, self._bound, strict=True)):
            tokens._stats = StatsBundle(classes=parts["classes"], features=parts["features"])
            meta._stats = StatsBundle(classes=parts["classes"], moments=parts["moments"])
            tokens._on_stats_changed(None)
            meta._on_stats_changed(None)
            self._bound = key

    def _split(self, X: Any) -> tuple[Any, np.ndarray]:
        width = X.shape[1] - int(self.n_meta)
        if width < 1:
            raise ValueError(
                f"X has {X.shape[1]} feature(s), but HybridNB(n_meta={self.n_meta}) needs token "
                f"columns then {self.n_meta} meta columns"
            )
        if sp.issparse(X):
            X = sp.csr_matrix(X)
            return X[:, :width], np.asarray(X[:, width:].toarray(), dtype=np.float64)
        return X[:, :width], np.asarray(X[:, width:], dtype=np.float64)

    def _n_features(self) -> int | None:
        self._bind()
        n = self._blocks()[0]._n_features()
        return None if n is None else n + int(self.n_meta)

    def _validate_X(self, X: Any, predicting: bool = False) -> Any:
        X = super()._validate_X(X, predicting)
        tokens, meta = self._split(X)
        self._bind()
        tokens = self._blocks()[0]._validate_X(tokens, predicting)
        meta = self._blocks()[1]._validate_X(meta, predicting)
        return tokens, meta

    def _batch_stats(self, X: Any, y: list, sample_weight: np.ndarray) -> StatsBundle:
        tokens, meta = X
        t = self._blocks()[0]._batch_stats(tokens, y, sample_weight)
        m = self._blocks()[1]._batch_stats(meta, y, sample_weight)
        return StatsBundle(classes=t["classes"], features=t["features"], moments=m["moments"])

    def batch_stats(self, X: Any, y: Any, sample_weight: Any = None) -> StatsBundle:
        self.validate_params()
        X = self._validate_X(X)
        n = X[0].shape[0]
        yl = self._validate_y(y, n)
        w = self._validate_weight(sample_weight, n)
        return self._batch_stats(X, yl, w)

    def _on_stats_changed(self, delta: StatsBundle | None) -> None:
        self._bind()
        tokens, meta = self._blocks()
        if delta is None:
            tokens._on_stats_changed(None)
            meta._on_stats_changed(None)
            return
        tokens._on_stats_changed(StatsBundle(classes=delta["classes"], features=delta["features"]))
        meta._on_stats_changed(StatsBundle(classes=delta["classes"], moments=delta["moments"]))

    def _register_classes(self, labels: list) -> None:
        self._bind()
        self.stats["classes"].add_classes(labels)  # type: ignore[attr-defined]
        self._blocks()[1].moments.add_classes(labels)
        self._on_stats_changed(None)

    # -------------------------------------------------------------- prediction
    def _joint_log_likelihood(self, X: Any) -> np.ndarray:
        tokens, meta = X
        self._bind()
        jll_tokens = self._blocks()[0]._joint_log_likelihood(tokens)
        jll_meta = self._blocks()[1]._joint_log_likelihood(meta)
        prior = log_class_prior(self.stats["classes"].counts)  # type: ignore[attr-defined]
        # Both blocks include log P(c); keep it once. Classes with no weight stay -inf.
        with np.errstate(invalid="ignore"):
            out = jll_tokens + jll_meta - prior
        out[:, ~np.isfinite(prior)] = -np.inf
        return out

    def _log_odds_terms(self, X: Any, a: int, b: int) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """The token block's terms (token columns), then the meta block's (the last
        ``n_meta`` columns); the bias is the token block's, with the prior counted once."""
        tokens, meta = X
        self._bind()
        token_block, meta_block = self._blocks()
        bias_t, ptr_t, f_t, t_t = token_block._log_odds_terms(tokens, a, b)
        bias_m, ptr_m, f_m, t_m = meta_block._log_odds_terms(meta, a, b)
        prior = log_class_prior(self.stats["classes"].counts)  # type: ignore[attr-defined]
        width = tokens.shape[1]
        n = ptr_t.size - 1
        both = sp.hstack([sp.csr_matrix((t_t, f_t, ptr_t), shape=(n, width)),
                          sp.csr_matrix((t_m, f_m, ptr_m), shape=(n, meta.shape[1]))],
                         format="csr")
        bias = bias_t + bias_m - float(prior[b] - prior[a])
        return bias, both.indptr, both.indices.astype(np.int64), both.data
