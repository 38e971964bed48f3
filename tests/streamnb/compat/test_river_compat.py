"""streamnb.compat.river: a model driven by River's progressive validation, pipelines and
metrics gives what the model's own test-then-train loop gives."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from river import compose, datasets, evaluate, metrics, preprocessing

from streamnb.compat.river import Classifier
from streamnb.exceptions import NotFittedError, SingularCovarianceWarning
from streamnb.models import BernoulliNB, GaussianNB, MultinomialNB, QuadraticDiscriminantAnalysis


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingularCovarianceWarning)  # one-sample classes at first
        yield


def phishing() -> tuple[list[dict], list[bool]]:
    pairs = list(datasets.Phishing())
    return [x for x, _ in pairs], [y for _, y in pairs]


def own_loop(model, rows: np.ndarray, y: list) -> float:
    """Test-then-train with the model's own API: predict row i (once a class is known),
    then learn it; accuracy over the rows predicted."""
    right = done = 0
    for i in range(rows.shape[0]):
        try:
            right += int(model.predict(rows[i:i + 1])[0] == int(y[i]))
            done += 1
        except NotFittedError:
            pass
        model.partial_fit(rows[i:i + 1], [int(y[i])])
    return right / done


@pytest.mark.parametrize("make", [GaussianNB, lambda: QuadraticDiscriminantAnalysis(reg_param=0.1),
                                  lambda: MultinomialNB(n_features=64, smoothing_m="seen"),
                                  lambda: BernoulliNB(binarize=0.4, n_features=64, smoothing_m="seen")],
                         ids=["gaussian", "qda", "multinomial", "bernoulli"])
def test_progressive_val_score_equals_the_models_own_loop(make):
    xs, y = phishing()
    names = sorted(xs[0])
    rows = np.array([[x.get(f, 0.0) for f in names] for x in xs], dtype=np.float64)
    if make().accepts_sparse:  # the adapter gives each new name the next column
        first_seen = list(dict.fromkeys(f for x in xs for f, v in x.items() if v != 0))
        rows = np.array([[x.get(f, 0.0) for f in first_seen] + [0.0] * (64 - len(first_seen))
                         for x in xs])
    expected = own_loop(make(), rows, y)
    got = evaluate.progressive_val_score(datasets.Phishing(), Classifier(make()), metrics.Accuracy())
    assert got.get() == pytest.approx(expected, abs=1e-12)
    assert 0.7 < expected < 1.0


def test_labels_come_back_as_river_gave_them_and_probabilities_feed_river_metrics():
    xs, y = phishing()
    model = Classifier(GaussianNB())
    assert model.predict_proba_one(xs[0]) == {} and model.predict_one(xs[0]) is None
    loss = metrics.LogLoss()
    for x, label in zip(xs[:300], y[:300], strict=True):
        proba = model.predict_proba_one(x)
        if proba:
            assert set(proba) <= {True, False} and sum(proba.values()) == pytest.approx(1.0)
            loss.update(label, proba)
        model.learn_one(x, label)
    assert model.predict_one(xs[300]) in (True, False)
    assert np.isfinite(loss.get())
    assert model.model.classes_.tolist() == [0, 1]


def test_a_river_pipeline_drives_the_model():
    pipeline = compose.Pipeline(preprocessing.StandardScaler(), Classifier(GaussianNB()))
    score = evaluate.progressive_val_score(datasets.Phishing(), pipeline, metrics.Accuracy())
    assert score.get() > 0.8


def test_fixed_features_and_their_errors():
    xs, y = phishing()
    names = sorted(xs[0])
    model = Classifier(GaussianNB(), features=names)
    for x, label in zip(xs[:50], y[:50], strict=True):
        model.learn_one(x, label)
    assert model.model.n_features_in_ == len(names)
    with pytest.raises(ValueError, match="give the model n_features"):
        Classifier(MultinomialNB()).learn_one(xs[0], y[0])
    with pytest.raises(ValueError, match="more feature names than the model's n_features"):
        Classifier(MultinomialNB(n_features=3)).learn_one(xs[0], y[0])
