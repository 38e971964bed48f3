"""The weights a batch's labels are learnt with, the class weights its predictions see,
and the verdicts at the model's operating point: pure functions of the verdicts
(workers/worker/batch.py, ``predict``).

A labelled message whose verdict got its label wrong is learnt with ``error_weight``
times its weight (the model's stored config; docs/features.md, "Mail defaults of the
daemon"). The weight is decided here from the ordered prediction and carried in the
delta, so every replica applies the same counts (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from streamnb.decision import UNSURE

__all__ = ["class_weight_rows", "is_error", "judge_at_operating_point", "learn_weights"]


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
    return np.array([it.msg.weight * (error_weight if error_weight != 1.0 and
                                      is_error(v.label, it.msg.label, rule, list(v.log_proba))
                                      else 1.0)
                     for v, it in zip(verdicts, items, strict=True)], dtype=np.float64)


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
        for i, lab in enumerate(labels):
            if lab is not None and lab in index:
                contrib[i, index[lab]] = weights[i]
        out += np.cumsum(contrib, axis=0) - contrib
    return out


def judge_at_operating_point(window: Any, rule: Any, verdicts: Sequence[Any],
                             items: Sequence[Any], classes: list[Any]) -> None:
    """Give the ``verdicts`` of a two-class model the label, threshold, calibrated
    probability and score code of its score ``window`` (streamnb/operating_point.py)."""
    pos = rule.positive_of(classes)
    if pos is None:
        return
    j = window.judge([v.score for v in verdicts], [v.label for v in verdicts],
                     [it.msg.label for it in items], pos, classes[1 - classes.index(pos)])
    for v, *judged in zip(verdicts, j.labels, j.thresholds, j.probas, j.codes, strict=True):
        v.label, v.threshold, v.proba, v.code = judged
