"""Explanations as the daemon writes and prints them: the model's
:meth:`~streamnb.models.base.GenerativeClassifier.explain_rows` of a batch, with the
hashed columns named by the message's own tokens, as the map ``explain`` of an output
(docs/protocol.md) and as text for ``streamnb explain``.

The pair of classes explained: for a two-class model the decision rule's positive class
against the other; with more classes, the model's most likely class against the
runner-up (per message). The model is the one the batch was predicted with; in a batch
that holds labels, a message's prediction also saw the labelled messages before it
(prequential), and what they moved its log-odds by is the explanation's ``batch`` term
(:func:`add_batch_term`).

>>> import numpy as np
>>> from streamnb.features import Featurizer
>>> from streamnb.models import MultinomialNB
>>> from streamnb.decision import DecisionRule
>>> f = Featurizer(bits=8)
>>> X = f.transform_payloads([("tokens", ["cheap", "meds"]), ("tokens", ["team", "lunch"])])
>>> model = MultinomialNB().fit(X, ["spam", "ham"])
>>> out = explain_matrix(model, DecisionRule(), f, X[:1], 2, [["cheap", "meds"]])[0]
>>> out["classes"], sorted(name for name, _ in out["tokens"])
(['ham', 'spam'], ['cheap', 'meds'])
>>> abs(out["bias"] + sum(w for _, w in out["tokens"]) + out["other"]
...     - float(model.decision_function(X[:1])[0])) < 1e-12
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from streamnb.exceptions import NotFittedError
from streamnb.features.mail import META_FEATURES

__all__ = ["EXPLAINED_KINDS", "add_batch_term", "explain_matrix", "format_explanation",
           "name_columns"]

#: The model kinds whose log-odds split per feature.
EXPLAINED_KINDS = ("multinomial", "bernoulli", "categorical", "gaussian", "hybrid")


def name_columns(featurizer: Any, cols: Sequence[int], tokens: Sequence[str] | None,
                 published: dict[int, list[tuple[str, int]]] | None = None) -> list[str]:
    """A name for each column: the first of the message's ``tokens`` that hashes to it,
    else the most frequent published name (``published``, from ``{M}:tokens``) as
    ``~name``, else ``#bucket``; ``meta:<feature>`` for a meta column and ``x[j]`` for
    dense input."""
    if featurizer.input != "sparse":
        return [f"x[{c}]" for c in cols]
    hasher = featurizer.hasher
    own: dict[int, str] = {}
    if tokens:
        tokens = list(tokens)
        buckets = (hasher.hashes_of(tokens) & np.uint64(hasher.mask)).astype(np.int64)
        for i in np.flatnonzero(np.isin(buckets, np.asarray(cols, dtype=np.int64))).tolist():
            own.setdefault(int(buckets[i]), tokens[i])  # the first occurrence wins
    names = []
    for c in cols:
        if c >= hasher.n_buckets:
            names.append(f"meta:{META_FEATURES[c - hasher.n_buckets]}")
        elif c in own:
            names.append(own[c])
        elif published and published.get(c):
            names.append("~" + published[c][0][0])
        else:
            names.append(f"#{c}")
    return names


def _pairs(model: Any, rule: Any, X: Any) -> list[tuple[Any, Any] | None]:
    """The (negative, positive) pair explained for each row (None: nothing to explain)."""
    try:
        classes = [c.item() if hasattr(c, "item") else c for c in model.classes_]
        weight = model.class_count_
    except NotFittedError:
        return [None] * X.shape[0]
    live = [i for i, w in enumerate(weight.tolist()) if w > 0]
    if len(live) < 2:
        return [None] * X.shape[0]
    if len(live) == 2:  # (a class with no weight takes no part: streamnb/decision.py)
        two = [classes[i] for i in live]
        try:
            pos = rule.positive_index(two)
        except ValueError:  # the rule's positive class is not one of them (yet)
            pos = 1
        return [(two[1 - pos], two[pos])] * X.shape[0]
    jll = model.predict_joint_log_proba(X)[:, live]
    top2 = np.argsort(-jll, axis=1, kind="stable")[:, :2]
    return [(classes[live[r]], classes[live[f]]) for f, r in top2.tolist()]


def explain_matrix(model: Any, rule: Any, featurizer: Any, X: Any, k: int,
                   tokens: Sequence[Sequence[str] | None],
                   published: dict[int, list[tuple[str, int]]] | None = None,
                   ) -> list[dict[str, Any] | None]:
    """The ``explain`` map of each row of ``X`` (None where the model cannot explain:
    another kind, fewer than two classes with weight): ``classes`` ``[negative,
    positive]``, ``bias``, ``tokens`` ``[[name, weight], ...]`` (the ``k`` largest terms,
    largest first) and ``other`` (the rest), whose sum is the log-odds of ``positive``.
    ``tokens[i]``: row i's token names (or None)."""
    n = X.shape[0]
    out: list[dict[str, Any] | None] = [None] * n
    if model.kind not in EXPLAINED_KINDS or k < 1 or n == 0:
        return out
    pairs = _pairs(model, rule, X)
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, pair in enumerate(pairs):
        if pair is not None:
            groups.setdefault(pair, []).append(i)
    for pair, rows in groups.items():
        Xg = X if len(rows) == n else X[rows]
        for i, e in zip(rows, model.explain_rows(Xg, k, classes=pair), strict=True):
            names = name_columns(featurizer, e.features.tolist(), tokens[i], published)
            out[i] = {"classes": list(e.classes), "bias": e.bias, "other": e.other,
                      "tokens": [[name, w] for name, w in
                                 zip(names, e.contributions.tolist(), strict=True)]}
    return out


def add_batch_term(explained: dict[str, Any], model_log_proba: np.ndarray | None,
                   classes: Sequence[Any]) -> dict[str, Any]:
    """``explained`` with ``batch``: the prediction's log-odds (``model_log_proba``, in
    the order of ``classes``) less the explanation's, when they differ; what the labelled
    messages before the message in its batch moved its log-odds by (a prequential
    prediction saw them, the explanation's model did not). Then ``bias + weights + other
    + batch`` is the prediction's log-odds.

    >>> e = {"classes": ["ham", "spam"], "bias": 0.5, "other": 0.0, "tokens": [["a", 1.0]]}
    >>> add_batch_term(e, np.log([0.2, 0.8]), ["ham", "spam"])["batch"].__round__(4)
    -0.1137
    >>> "batch" in add_batch_term(e, np.array([-1.5, 0.0]), ["ham", "spam"])
    False
    """
    if model_log_proba is None:
        return explained
    neg, pos = explained["classes"]
    index = {c: i for i, c in enumerate(classes[: len(model_log_proba)])}
    if neg not in index or pos not in index:
        return explained
    log_odds = float(model_log_proba[index[pos]] - model_log_proba[index[neg]])
    if not np.isfinite(log_odds):
        return explained
    gap = log_odds - (explained["bias"] + explained["other"] +
                      sum(w for _, w in explained["tokens"]))
    if abs(gap) <= 1e-9 * max(1.0, abs(log_odds)):
        return explained
    return {**explained, "batch": gap}


def format_explanation(explained: dict[str, Any]) -> str:
    """Lines for a terminal: the log-odds, then one line per token, then the rest.

    >>> print(format_explanation({"classes": ["ham", "spam"], "bias": -0.5, "other": 0.25,
    ...                           "tokens": [["cheap", 2.0], ["team", -1.0]]}))
    log-odds spam vs ham: +0.750
      +2.000  cheap
      -1.000  team
      +0.250  (other features)
      -0.500  (bias)
    """
    neg, pos = explained["classes"]
    total = explained["bias"] + explained["other"] + sum(w for _, w in explained["tokens"])
    total += explained.get("batch", 0.0)
    lines = [f"log-odds {pos} vs {neg}: {total:+.3f}"]
    lines += [f"  {w:+.3f}  {name}" for name, w in explained["tokens"]]
    lines.append(f"  {explained['other']:+.3f}  (other features)")
    lines.append(f"  {explained['bias']:+.3f}  (bias)")
    if "batch" in explained:
        lines.append(f"  {explained['batch']:+.3f}  (labelled messages before it in its batch)")
    return "\n".join(lines)
