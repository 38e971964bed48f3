"""ModelObserver on a fresh CollectorRegistry: after known calls, known counter values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from sklearn.metrics import log_loss

from streamnb_workers.observe.metrics import CONFIDENCE_BUCKETS, DELAY_BUCKETS, Metrics
from streamnb_workers.observe.observer import LOG_LOSS_CAP, ModelObserver

MW = {"model": "mail", "worker": "w1"}
CLASSES = ["ham", "spam"]


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(events=None, **kw):
    reg = CollectorRegistry()
    return reg, ModelObserver(Metrics(reg), "mail", "w1", events=events, **kw)


def value(reg, name, **labels):
    v = reg.get_sample_value(name, {**MW, **labels})
    return 0.0 if v is None else v


def test_prequential_counters_hold_hand_computed_values():
    reg, obs = make()
    proba = np.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
    truth = ["ham", "spam", "spam", "ham"]
    obs.score_labelled(CLASSES, np.log(proba[:2]), truth[:2])
    obs.score_labelled(CLASSES, np.log(proba[2:]), truth[2:])
    cell = "streamnb_prequential_predictions_total"
    assert value(reg, cell, **{"class": "ham", "predicted": "ham"}) == 1
    assert value(reg, cell, **{"class": "spam", "predicted": "spam"}) == 1
    assert value(reg, cell, **{"class": "spam", "predicted": "ham"}) == 1
    assert value(reg, cell, **{"class": "ham", "predicted": "spam"}) == 1
    # log-loss by hand: -ln .9 - ln .7 - ln .4 - ln .2, and against scikit-learn's mean
    hand = -(math.log(0.9) + math.log(0.7) + math.log(0.4) + math.log(0.2))
    assert value(reg, "streamnb_prequential_log_loss_sum_total") == pytest.approx(hand)
    assert value(reg, "streamnb_prequential_log_loss_sum_total") == pytest.approx(
        4 * log_loss(truth, proba, labels=CLASSES))
    # Brier by hand: 2 * (1 - p_true)^2 per binary message: .01, .09, .36, .64 -> 2.2
    assert value(reg, "streamnb_prequential_brier_sum_total") == pytest.approx(2 * 1.10)
    assert value(reg, "streamnb_prequential_correct_total", **{"class": "ham"}) == 1
    assert value(reg, "streamnb_prequential_correct_total", **{"class": "spam"}) == 1
    # accuracy as PromQL computes it: diagonal cells / all cells
    assert obs.error_detector.mean == pytest.approx(0.5)


def test_int_labels_and_unknown_true_class():
    reg, obs = make()
    lp = np.log(np.array([[0.25, 0.75], [0.5, 0.5]]))
    obs.score_labelled([0, 1], lp, [1, 7])
    cell = "streamnb_prequential_predictions_total"
    assert value(reg, cell, **{"class": "1", "predicted": "1"}) == 1
    assert value(reg, cell, **{"class": "7", "predicted": "0"}) == 1   # argmax tie -> first
    assert value(reg, "streamnb_prequential_correct_total", **{"class": "1"}) == 1
    assert reg.get_sample_value("streamnb_prequential_correct_total",
                                {**MW, "class": "7"}) == 0.0
    assert value(reg, "streamnb_prequential_log_loss_sum_total") == pytest.approx(
        -math.log(0.75) + LOG_LOSS_CAP)
    # Brier: (.25^2 + .25^2) + (.5^2 + .5^2 + 1 for the class the model does not know)
    assert value(reg, "streamnb_prequential_brier_sum_total") == pytest.approx(0.125 + 1.5)


def test_shape_mismatch_is_a_clear_error_and_counts_nothing():
    reg, obs = make()
    with pytest.raises(ValueError, match=r"shape \(3, 2\), but 2 labels"):
        obs.score_labelled(CLASSES, np.zeros((3, 2)), ["ham", "spam"])
    assert value(reg, "streamnb_prequential_log_loss_sum_total") == 0


def test_minus_infinity_posteriors_are_capped_not_nan():
    reg, obs = make()
    lp = np.array([[0.0, -np.inf]])
    obs.score_labelled(CLASSES, lp, ["spam"])
    assert value(reg, "streamnb_prequential_log_loss_sum_total") == pytest.approx(LOG_LOSS_CAP)
    assert value(reg, "streamnb_prequential_brier_sum_total") == pytest.approx(2.0)


def test_delayed_labels_and_label_delay_histogram():
    reg, obs = make()
    lp = np.log(np.array([[0.8, 0.2], [0.1, 0.9], [0.7, 0.3]]))
    obs.score_delayed(CLASSES, lp, ["ham", "ham", "spam"], np.array([0.5, 30.0, 7200.0]))
    cell = "streamnb_delayed_predictions_total"
    assert value(reg, cell, **{"class": "ham", "predicted": "ham"}) == 1
    assert value(reg, cell, **{"class": "ham", "predicted": "spam"}) == 1
    assert value(reg, cell, **{"class": "spam", "predicted": "ham"}) == 1
    assert value(reg, "streamnb_delayed_log_loss_sum_total") == pytest.approx(
        -(math.log(0.8) + math.log(0.1) + math.log(0.3)))
    # no test-then-train counts from delayed labels
    assert value(reg, "streamnb_prequential_log_loss_sum_total") == 0
    bucket = "streamnb_label_delay_seconds_bucket"
    expected = {b: sum(d <= b for d in (0.5, 30.0, 7200.0)) for b in DELAY_BUCKETS}
    for b, n in expected.items():
        assert value(reg, bucket, le=str(float(b))) == n
    assert value(reg, "streamnb_label_delay_seconds_sum") == pytest.approx(7230.5)


def test_observe_predictions_confidence_unsure_and_oov():
    reg, obs = make()
    proba = np.array([[0.55, 0.45], [0.02, 0.98], [0.5, 0.5]])
    obs.observe_predictions(CLASSES, np.log(proba), np.array([0.0, 0.25, 1.0]),
                            np.array([0.1, 0.2, 0.3]), np.array([True, False, True]))
    assert value(reg, "streamnb_unsure_predictions_total") == 2
    conf = np.array([0.55, 0.98, 0.5])
    for b in CONFIDENCE_BUCKETS:
        assert value(reg, "streamnb_posterior_confidence_bucket", le=str(float(b))) == (
            np.count_nonzero(conf <= b + 1e-12))
    assert value(reg, "streamnb_oov_share_sum") == pytest.approx(1.25)
    assert value(reg, "streamnb_oov_share_count") == 3
    assert value(reg, "streamnb_oov_rate_recent") == pytest.approx(1.25 / 3)
    # ages are the worker's to record (no double counting)
    assert value(reg, "streamnb_message_age_seconds_count") == 0


def test_error_drift_counts_and_emits_one_event_per_cooldown():
    events = []
    clock = FakeClock()
    reg, obs = make(events=lambda kind, fields: events.append((kind, fields)), clock=clock)
    rng = np.random.default_rng(0)
    good = np.log(np.array([[0.99, 0.01]]))
    bad = np.log(np.array([[0.01, 0.99]]))

    def feed(n, p_err):
        for _ in range(n // 50):
            wrong = rng.random(50) < p_err
            lp = np.vstack([bad if w else good for w in wrong])
            obs.score_labelled(CLASSES, lp, ["ham"] * 50)

    assert reg.get_sample_value("streamnb_drift_events_total", {**MW, "detector": "adwin"}) == 0.0
    feed(3000, 0.05)
    assert value(reg, "streamnb_drift_events_total", detector="adwin") == 0
    feed(2000, 0.4)
    assert value(reg, "streamnb_drift_events_total", detector="adwin") == 1
    kinds = {f["detector"] for _, f in events}
    assert "adwin" in kinds and all(k == "drift" for k, _ in events)
    adwin = next(f for _, f in events if f["detector"] == "adwin")
    assert adwin["model"] == "mail" and adwin["change"]["new_mean"] > adwin["change"]["old_mean"]
    assert value(reg, "streamnb_error_rate_recent") > 0.2
    clock.t += 3600                               # after the cool-down a new alarm may pass
    feed(3000, 0.9)
    assert value(reg, "streamnb_drift_events_total", detector="adwin") == 2


def test_prior_shift_event_names_the_shares():
    events = []
    reg, obs = make(events=lambda kind, fields: events.append(fields))
    rng = np.random.default_rng(1)
    lp = np.log(np.full((1, 2), 0.5))
    for p in (0.05,) * 40 + (0.5,) * 10:
        truth = np.where(rng.random(50) < p, "spam", "ham").tolist()
        obs.score_labelled(CLASSES, np.repeat(lp, 50, axis=0), truth)
    prior = [f for f in events if f["detector"] == "prior_shift"]
    assert len(prior) == 1
    assert prior[0]["change"]["recent_shares"]["spam"] > 0.3
    assert value(reg, "streamnb_prior_shift_divergence") > 0


def test_failing_event_sink_does_not_break_scoring():
    def sink(kind, fields):
        raise ConnectionError("redis down")

    reg, obs = make(events=sink)
    lp = np.log(np.full((1, 2), 0.5))
    for p in (0.0,) * 40 + (1.0,) * 10:
        obs.score_labelled(CLASSES, np.repeat(lp, 50, axis=0), ["spam" if p else "ham"] * 50)
    assert value(reg, "streamnb_drift_events_total", detector="prior_shift") == 1


def test_observe_model_gaussian_weights_bhattacharyya_and_feature_drift():
    models = pytest.importorskip("streamnb.models")
    from streamnb.bounds import bhattacharyya_distance

    events = []
    reg, obs = make(events=lambda kind, fields: events.append(fields))
    rng = np.random.default_rng(0)
    model = models.GaussianNB()
    for _ in range(10):
        X = np.vstack([rng.normal(0, 1, (50, 2)), rng.normal(3, 1, (50, 2))])
        model.partial_fit(X, ["a"] * 50 + ["b"] * 50)
        obs.observe_model(model)
    assert reg.get_sample_value("streamnb_model_class_weight", {"model": "mail", "class": "a"}) == 500
    mom = model.stats["moments"]
    cov = mom.covariances()
    expected = bhattacharyya_distance(mom.mean[0], np.diag(cov[0]), mom.mean[1], np.diag(cov[1]))
    got = reg.get_sample_value("streamnb_bhattacharyya_distance",
                               {"model": "mail", "class": "a", "other": "b"})
    assert got == pytest.approx(expected, rel=1e-6)
    assert not events
    model.partial_fit(rng.normal([0, 1.5], 1, (100, 2)), ["a"] * 100)   # class a moves
    obs.observe_model(model)
    assert [f["detector"] for f in events] == ["gaussian"]
    assert events[0]["change"]["label"] == "a" and events[0]["change"]["feature"] == 1
    assert value(reg, "streamnb_feature_drift_divergence") > 1.0


def test_observe_model_counts_features_seen():
    models = pytest.importorskip("streamnb.models")
    reg, obs = make()
    model = models.MultinomialNB()
    X = np.array([[1, 0, 0, 2], [0, 0, 0, 1]])
    model.partial_fit(X, ["a", "b"])
    obs.observe_model(model)
    assert reg.get_sample_value("streamnb_model_features_seen", {"model": "mail"}) == 2
    assert reg.get_sample_value("streamnb_model_class_weight", {"model": "mail", "class": "b"}) == 1
