"""The weights a batch's labels are learnt with, the classes, learnt prior and class
weights its predictions see, and the verdicts at the model's operating point: pure
functions of the verdicts and the model (workers/worker/batch.py, ``predict``).

A labelled message whose verdict got its label wrong is learnt with ``error_weight``
times its weight (the model's stored config; docs/features.md, "Mail defaults of the
daemon"). The weight is decided here from the ordered prediction and carried in the
delta, so every replica applies the same counts (docs/architecture.md).

Autolearn (``worker --autolearn``): which unlabelled messages of a batch a worker
learns from its own verdicts, under the source ``autolearn`` (docs/worker.md,
"Autolearn").

A message is autolearnt when it came without a label, its verdict is one of the model's
two classes (not ``unsure``) with a score at least ``score`` away from 0 (the score to
threshold and rank by, docs/protocol.md), the model has learnt at
least ``min_class_weight`` of each class (a cold model learns nothing from itself), and
fewer than ``per_batch`` messages of its batch were autolearnt before it (the rate
limit). It is learnt with its message's weight (no error weight) under its learn-once key, which a user's label for
the same key then replaces (workers/worker/labels.py, ``replaces``); a key learnt
already, from any source, is not autolearnt.

>>> from types import SimpleNamespace as NS
>>> policy = AutolearnPolicy(score=0.5, min_class_weight=2, per_batch=1)
>>> verdicts = [NS(label="spam", score=0.9), NS(label="ham", score=-0.7)]
>>> items = [NS(msg=NS(label=None, forget=False))] * 2
>>> autolearn_choices(items, verdicts, {"ham": 5.0, "spam": 3.0}, policy)
{0: 'spam'}
>>> autolearn_choices(items, verdicts, {"ham": 5.0, "spam": 1.0}, policy)  # cold: too little spam
{}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from streamnb.decision import UNSURE
from streamnb_workers.wire.learn_keys import message_key
from streamnb_workers.wire.learn_sources import AUTOLEARN

__all__ = ["AutolearnPolicy", "autolearn_choices", "autolearn_key", "autolearnt",
           "class_weight_rows", "is_error", "judge_at_operating_point", "known_class_groups",
           "known_classes",
           "learn_weights", "learnt_log_prior"]


def is_error(label: Any, true: Any, rule: Any, classes: Sequence[Any]) -> bool:
    """Whether a verdict ``label`` got the true label ``true`` wrong. No verdict (None) is
    no error; "unsure" is an error only when the truth is the positive class (of the
    ``classes`` known with ``true``): an unsure message is not flagged.

    >>> from streamnb.decision import DecisionRule
    >>> rule = DecisionRule()
    >>> [is_error(v, t, rule, ["ham"]) for v, t in
    ...  [("ham", "spam"), ("ham", "ham"), ("unsure", "spam"), ("unsure", "ham"), (None, "spam")]]
    [True, False, True, False, False]
    """
    if label is None or true is None:
        return False
    if label == UNSURE and true != UNSURE:
        known = list(classes) if true in classes else [*classes, true]
        try:
            return len(known) == 2 and known[rule.positive_index(known)] == true
        except ValueError:  # a positive class that is not one of these two
            return False
    return label != true


def learn_weights(verdicts: Sequence[Any], items: Sequence[Any], rule: Any,
                  error_weight: float) -> np.ndarray:
    """The weight each item's own label is learnt with: its message's weight, times
    ``error_weight`` where the verdict got the label wrong (:func:`is_error`, with the
    classes the verdict knew)."""
    weights = np.array([it.msg.weight for it in items], dtype=np.float64)
    if error_weight == 1.0:
        return weights
    # (a verdict equal to its label is no error: is_error is asked of the others only;
    # w x 1.0 is w, so only the errors' weights are multiplied)
    errors = [i for i, v, it in zip(range(len(items)), verdicts, items, strict=True)
              if v.label != it.msg.label and is_error(v.label, it.msg.label, rule, v.log_proba)]
    if errors:
        weights[errors] *= error_weight
    return weights


def class_weight_rows(model: Any, classes: Sequence[Any], labels: Sequence[Any],
                       weights: np.ndarray, prequential: bool) -> np.ndarray:
    """The weight each row's model has learnt per class (columns in ``classes`` order):
    the model's, plus (prequential) the labelled rows before it in the batch."""
    n, k = len(labels), len(classes)
    out = np.zeros((n, k))
    try:
        learnt = model.stats["classes"].as_dict()
    except (AttributeError, KeyError):
        learnt = {}
    index = {c: j for j, c in enumerate(classes)}
    for c, w in learnt.items():
        if c in index:
            out[:, index[c]] = w
    if prequential:
        contrib = np.zeros((n, k))
        # (None is no class: never a key of index)
        col = np.fromiter(map(index.get, labels, repeat(-1, n)), dtype=np.int64, count=n)
        rows = np.flatnonzero(col >= 0)
        contrib[rows, col[rows]] = np.asarray(weights, dtype=np.float64)[rows]
        out += np.cumsum(contrib, axis=0) - contrib
    return out


def known_class_groups(n_known: np.ndarray, per_row: bool) -> list[list[int]]:
    """The rows of a batch that knew the same number of classes (``n_known`` > 0),
    decided together, in order of first appearance (each row alone with ``per_row``).

    >>> known_class_groups(np.array([0, 2, 2, 3, 2]), False), known_class_groups(np.array([0, 1, 1]), True)
    ([[1, 2, 4], [3]], [[1], [2]])
    """
    predicted = np.flatnonzero(n_known > 0)
    if per_row:
        return [[i] for i in predicted.tolist()]
    known = n_known[predicted]
    values, first = np.unique(known, return_index=True)
    return [predicted[known == values[j]].tolist() for j in np.argsort(first).tolist()]


@dataclass(frozen=True, slots=True)
class AutolearnPolicy:
    """The thresholds of autolearn (module docstring)."""

    #: The least distance of the verdict's score from 0 (per-feature log-odds for mail).
    score: float
    #: The least weight the model must hold of each of its two classes.
    min_class_weight: float
    #: The most messages autolearnt per batch.
    per_batch: int


def autolearn_choices(items: Sequence[Any], verdicts: Sequence[Any], class_weights: dict[Any, float],
           policy: AutolearnPolicy) -> dict[int, Any]:
    """Index -> label of the items of a batch to autolearn (module docstring);
    ``class_weights``: what the model predicting them holds of each class."""
    if len(class_weights) != 2 or min(class_weights.values()) < policy.min_class_weight:
        return {}
    chosen: dict[int, Any] = {}
    for i, (it, v) in enumerate(zip(items, verdicts, strict=True)):
        if len(chosen) >= policy.per_batch:
            break
        if it.msg.label is not None or v.score is None or v.label not in class_weights:
            continue
        if abs(v.score) >= policy.score:
            chosen[i] = v.label
    return chosen


def autolearn_key(msg: Any) -> str:
    """The learn-once key an unlabelled message is autolearnt under (the producer's, else
    the one a label would have given it)."""
    return msg.key if msg.key is not None else message_key(msg.payload, msg.payload_kind)


def judge_at_operating_point(window: Any, rule: Any, verdicts: Sequence[Any],
                             items: Sequence[Any], classes: list[Any]) -> None:
    """Give the ``verdicts`` of a two-class model the label, threshold, calibrated
    probability, score code and followed prior of its score ``window``
    (streamnb/operating_point.py)."""
    pos = rule.positive_of(classes)
    if pos is None:
        return
    j = window.judge([v.score for v in verdicts], [v.label for v in verdicts],
                     [it.msg.label for it in items], pos, classes[1 - classes.index(pos)])
    for v, *judged in zip(verdicts, j.labels, j.thresholds, j.probas, j.codes, j.priors,
                          strict=True):
        v.label, v.threshold, v.proba, v.code, v.prior = judged


def known_classes(model: Any) -> list[Any]:
    """The classes the model has learnt, in its order (none before the first label),
    asked without raising: a ``NotFittedError`` raised may import scikit-learn."""
    return list(model.classes_) if model.__sklearn_is_fitted__() else []


def learnt_log_prior(model: Any, n_classes: int) -> np.ndarray:
    """The model's class log priors (``class_log_prior_``); NaN for each of the
    ``n_classes`` while no class has weight (the decision rule then has no learnt prior)."""
    if model.__sklearn_is_fitted__() and model.class_count_.sum() > 0:
        return model.class_log_prior_
    return np.full(n_classes, np.nan)


def autolearnt(items: Sequence[Any], verdicts: Sequence[Any], model: Any,
               policy: AutolearnPolicy | None, known: set[str], max_sources: int,
               ) -> dict[int, Any]:
    """Index -> label of the items to autolearn (:func:`autolearn_choices` on the model's
    class weights); none without a policy, or when the source ``autolearn`` would be one
    past ``max_sources`` (the sources ``known``)."""
    if policy is None or not items or (AUTOLEARN not in known and len(known) >= max_sources):
        return {}
    counts = model.stats["classes"]
    return autolearn_choices(items, verdicts,
                             dict(zip(counts.labels, counts.counts.tolist(), strict=True)),
                             policy)
