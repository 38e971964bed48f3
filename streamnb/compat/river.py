"""A streamnb model as a River classifier: ``learn_one`` / ``predict_one`` /
``predict_proba_one`` on dicts of features, for ``river.evaluate.progressive_val_score``,
River's pipelines and its metrics. Importing this module imports River.

Each dict becomes one row of the model. A dense model (GaussianNB, LDA, QDA,
CategoricalNB) takes the feature names of the first sample it learns, sorted, as its
columns (a missing name then counts 0; a name it does not know is left out). A count
model (MultinomialNB, BernoulliNB) takes sparse rows: every new name learnt gets the next
column, up to the model's ``n_features``, which must be given; at prediction a name never
learnt has no column and is left out (``smoothing_m="seen"`` scores the same way: a column
with no count is ignored). ``features=[...]`` fixes the columns instead, for any model
(HybridNB needs it: its meta columns come last). Labels may be anything River has
(``bool`` too): the model learns them as ``int`` or ``str`` and they are given back as
they came.

>>> from river import datasets, evaluate, metrics
>>> from streamnb.compat.river import Classifier
>>> from streamnb.models import GaussianNB
>>> evaluate.progressive_val_score(datasets.Phishing(), Classifier(GaussianNB()),
...                                metrics.Accuracy())
Accuracy: 88.71%
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from river import base

from streamnb.exceptions import NotFittedError

__all__ = ["Classifier"]


class Classifier(base.Classifier):
    """River's view of a streamnb ``model`` (see the module docstring).

    ``features``: the column of each feature name, in order (None: learnt as they come).
    """

    def __init__(self, model: Any, features: Sequence[Hashable] | None = None) -> None:
        self.model = model
        self.features = features
        self._columns: dict[Hashable, int] = (
            {} if features is None else {f: j for j, f in enumerate(features)})
        self._labels: dict[Any, Any] = {}  # the model's label -> the label as River gave it

    @property
    def _multiclass(self) -> bool:
        return True

    @property
    def _sparse(self) -> bool:
        return self.features is None and bool(getattr(self.model, "accepts_sparse", False))

    def _width(self) -> int:
        if self.features is not None:
            return len(self.features)
        if self._sparse:
            n = self.model.get_params().get("n_features")
            if n is None:
                raise ValueError(
                    f"{type(self.model).__name__} takes the dict's names as columns of a sparse "
                    "row: give the model n_features (at least the number of names it will "
                    "learn), e.g. n_features=2**16 with smoothing_m='seen'"
                )
            return int(n)
        return len(self._columns)

    def _learn_names(self, x: dict) -> None:
        if self.features is not None:
            return
        if self._sparse:
            new = [f for f, v in x.items() if v != 0 and f not in self._columns]
            if len(self._columns) + len(new) > self._width():
                raise ValueError(f"more feature names than the model's n_features "
                                 f"({self._width()})")
            for f in new:
                self._columns[f] = len(self._columns)
        elif not self._columns:
            self._columns = {f: j for j, f in enumerate(sorted(x, key=str))}

    def _row(self, x: dict) -> Any:
        """One row: CSR for a count model with learnt names, else a dense array."""
        cols = [(self._columns[f], v) for f, v in x.items() if f in self._columns and v != 0]
        if self._sparse:
            idx = np.fromiter((j for j, _ in cols), dtype=np.int64, count=len(cols))
            val = np.fromiter((v for _, v in cols), dtype=np.float64, count=len(cols))
            return sp.csr_matrix((val, idx, [0, len(cols)]), shape=(1, self._width()))
        row = np.zeros((1, self._width()))
        for j, v in cols:
            row[0, j] = v
        return row

    def _model_label(self, y: Any) -> Any:
        label = int(y) if isinstance(y, (bool, np.bool_)) else y
        self._labels.setdefault(label.item() if hasattr(label, "item") else label, y)
        return label

    def learn_one(self, x: dict, y: Any, w: float = 1.0) -> None:
        """Learn one sample (``w``: its weight)."""
        self._learn_names(x)
        self.model.partial_fit(self._row(x), [self._model_label(y)], sample_weight=[w])

    def predict_proba_one(self, x: dict) -> dict[Any, float]:
        """Posterior of each class learnt so far (empty before the first class)."""
        try:
            classes = self.model.classes_.tolist()
        except NotFittedError:
            return {}
        proba = self.model.predict_proba(self._row(x))[0]
        return {self._labels.get(c, c): float(p) for c, p in zip(classes, proba, strict=True)}
