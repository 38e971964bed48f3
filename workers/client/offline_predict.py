"""Offline prediction from a model file (``streamnb predict --snapshot``): one message
featurized, predicted and decided as the workers would, and the tokens that most favour
its label (:func:`top_tokens`, also the demo's).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from streamnb.decision import DecisionRule
from streamnb_workers.client.model_files import featurizer_for, read_envelope
from streamnb_workers.client.sources import read_message
from streamnb_workers.observe.token_names import message_tokens
from streamnb_workers.wire.explanations import EXPLAINED_KINDS, name_columns

__all__ = ["predict_file", "top_tokens"]


def top_tokens(model: Any, featurizer: Any, msg: Any, label: Any, k: int = 5) -> list[tuple[str, float]]:
    """The ``k`` tokens of ``msg`` that most favour ``label``: the largest positive terms of
    the log-odds of ``label`` against the runner-up class (:meth:`explain
    <streamnb.models.base.GenerativeClassifier.explain>`; for BernoulliNB the true weight
    ``logit theta_label - logit theta_other``), as ``(token, term)``; empty for models that
    do not split their log-odds per feature, payloads without tokens or an unsure label."""
    if model.kind not in EXPLAINED_KINDS or msg.payload_kind not in ("raw", "text", "tokens"):
        return []
    classes = [c.item() if hasattr(c, "item") else c for c in model.classes_]
    weight = model.class_count_
    if label not in classes or weight[classes.index(label)] <= 0:
        return []
    X = featurizer.stack([featurizer.featurize(msg.as_payload())])
    jll = model.predict_joint_log_proba(X)[0]
    others = [i for i, c in enumerate(classes) if c != label and weight[i] > 0]
    if not others:
        return []
    runner_up = max(others, key=lambda i: jll[i])
    e = model.explain(X, k=X.shape[1], classes=(classes[runner_up], label))
    favour = [(int(j), float(w)) for j, w in e.as_pairs() if w > 0][:k]
    names = name_columns(featurizer, [j for j, _ in favour], message_tokens(featurizer, msg))
    return [(name, w) for name, (_, w) in zip(names, favour, strict=True)]


def predict_file(model_path: str | os.PathLike[str], message_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Predict one message offline from an exported model file."""
    model, env = read_envelope(model_path)
    featurizer = featurizer_for(model, env, model_path)
    msg = read_message(message_path)
    X = featurizer.stack([featurizer.featurize(msg.as_payload())])
    lp = model.predict_log_proba(X)
    classes = list(model.classes_)
    rule = DecisionRule.from_dict(env.get("decision"))
    prior = getattr(model, "class_log_prior_", None)
    learnt = model.stats["classes"].as_dict()
    weight = [[learnt.get(c, 0.0) for c in classes]]
    decision = rule.decide(lp, classes, learnt_log_prior=None if prior is None else np.asarray(prior),
                           class_weight=weight)
    label = decision.labels[0]
    score = rule.score_of(decision.log_proba, classes, np.asarray(X.sum(axis=1)).ravel(), weight)
    if score is not None and np.isnan(score[0]):
        score = None
    return {
        "id": msg.id,
        "label": label,
        **({} if score is None else {"score": float(score[0])}),
        "log_proba": {str(c): float(v) for c, v in zip(classes, decision.log_proba[0], strict=True)},
        "model_version": env.get("log_id"),
        "top_tokens": [t for t, _ in top_tokens(model, featurizer, msg, label)],
    }
