"""The lecture notes' worked numbers for the count models, computed through the models."""

from __future__ import annotations

import numpy as np
import pytest

from streamnb.models.bernoulli import BernoulliNB
from streamnb.models.multinomial import MultinomialNB
from streamnb.stats import ClassCounts, FeatureCounts, StatsBundle

VOCAB = ["Chinese", "Beijing", "Shanghai", "Macao", "Tokyo", "Japan"]
TRAIN = [
    ("Chinese Beijing Chinese", "China"),
    ("Chinese Chinese Shanghai", "China"),
    ("Chinese Macao", "China"),
    ("Tokyo Japan Chinese", "Japan"),
]
TEST = "Chinese Chinese Chinese Tokyo Japan"


def counts(text: str, vocab: list[str]) -> np.ndarray:
    row = np.zeros(len(vocab))
    for word in text.split():
        row[vocab.index(word)] += 1
    return row


def chinese_tokyo(vocab: list[str]):
    X = np.array([counts(text, vocab) for text, _ in TRAIN])
    y = [label for _, label in TRAIN]
    return X, y, counts(TEST, vocab)[None, :]


def posterior(model, x, label) -> float:
    return float(model.predict_proba(x)[0, model.classes_.tolist().index(label)])


def test_multinomial_chinese_tokyo():
    X, y, x = chinese_tokyo(VOCAB)
    model = MultinomialNB(alpha=1.0).fit(X, y)
    assert posterior(model, x, "China") == pytest.approx(0.6898, abs=5e-5)
    assert model.predict(x).tolist() == ["China"]


def test_multinomial_chinese_tokyo_with_a_seventh_unused_word():
    X, y, x = chinese_tokyo(VOCAB + ["Osaka"])
    model = MultinomialNB(alpha=1.0).fit(X, y)  # m = 7 columns, one never used
    assert posterior(model, x, "China") == pytest.approx(0.727, abs=5e-4)
    # the same through n_features fixed up front ...
    fixed = MultinomialNB(n_features=7).fit(X, y)
    assert posterior(fixed, x, "China") == pytest.approx(0.727, abs=5e-4)
    # ... while smoothing over seen features only brings m back to 6
    seen = MultinomialNB(smoothing_m="seen").fit(X, y)
    assert posterior(seen, x, "China") == pytest.approx(0.6898, abs=5e-5)


def test_bernoulli_chinese_tokyo():
    X, y, x = chinese_tokyo(VOCAB)
    model = BernoulliNB(alpha=1.0).fit(X, y)
    assert posterior(model, x, "Japan") == pytest.approx(0.8089, abs=5e-5)
    assert model.predict(x).tolist() == ["Japan"]


def test_two_hundred_rare_features_decided_in_log_space():
    """200 features at 0.01 under A and 0.02 under B, equal priors: the product of
    probabilities underflows to 0, the log joint likelihoods do not."""
    p_a, p_b, d = 0.01, 0.02, 200
    assert np.prod(np.full(d, p_a)) * 0.5 == 0.0 and np.prod(np.full(d, p_b)) * 0.5 == 0.0
    # Bernoulli statistics giving theta = (N_cj + 1) / (N_c + 2) = p with N_c = 998.
    n_c = 998.0
    stats = StatsBundle(
        classes=ClassCounts(["A", "B"], [n_c, n_c]),
        features=FeatureCounts(
            d, ["A", "B"], np.vstack([np.full(d, p_a * (n_c + 2) - 1), np.full(d, p_b * (n_c + 2) - 1)])
        ),
    )
    model = BernoulliNB.from_stats(stats, alpha=1.0)
    x = np.ones((1, d))  # every feature present: no absent-feature terms
    jll = model.predict_joint_log_proba(x)[0]
    assert jll[0] == pytest.approx(-921.73, abs=5e-3)
    assert jll[1] == pytest.approx(-783.10, abs=5e-3)
    assert model.predict(x).tolist() == ["B"]
    assert np.isfinite(model.predict_log_proba(x)).all()
