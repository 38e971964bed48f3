"""The decision rule, on hand-worked numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamnb.decision import UNSURE, DecisionRule
from streamnb.decision_parsing import parse_class_prior, parse_loss_matrix, parse_unsure_band

CLASSES = ["ham", "spam"]


def logp(rows):
    return np.log(np.asarray(rows, dtype=np.float64))


def test_default_is_argmax_of_numpy():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(4), size=200)
    classes = ["a", "b", "c", "d"]
    d = DecisionRule().decide(np.log(p), classes)
    assert d.labels == [classes[i] for i in np.argmax(p, axis=1)]
    assert not d.unsure.any()
    assert DecisionRule().is_default


def test_class_prior_override_with_learnt_priors():
    # learnt priors ham 0.8 / spam 0.2, posterior 0.5 / 0.5. New priors 0.5 / 0.5:
    # spam  ∝ 0.5 * 0.5/0.2 = 1.25, ham ∝ 0.5 * 0.5/0.8 = 0.3125 -> P(spam) = 1.25/1.5625 = 0.8
    rule = DecisionRule(class_prior={"ham": 0.5, "spam": 0.5})
    d = rule.decide(logp([[0.5, 0.5]]), CLASSES, learnt_log_prior=np.log([0.8, 0.2]))
    np.testing.assert_allclose(np.exp(d.log_proba), [[0.2, 0.8]], rtol=1e-12)
    assert d.labels == ["spam"]


def test_class_prior_override_without_learnt_priors_reweights():
    # [0.5, 0.5] * [0.1, 0.9] = [0.05, 0.45] -> normalised [0.1, 0.9]
    rule = DecisionRule(class_prior={"ham": 0.1, "spam": 0.9})
    d = rule.decide(logp([[0.5, 0.5], [0.95, 0.05]]), CLASSES)
    # second row: [0.095, 0.045] / 0.14
    np.testing.assert_allclose(
        np.exp(d.log_proba), [[0.1, 0.9], [0.095 / 0.14, 0.045 / 0.14]], rtol=1e-12)
    assert d.labels == ["spam", "ham"]


def test_class_prior_names_only_some_classes():
    # c keeps its weight; a is tripled: [0.2, 0.3, 0.5] -> [0.6, 0.3, 0.5] / 1.4
    rule = DecisionRule(class_prior={"a": 3.0})
    d = rule.decide(logp([[0.2, 0.3, 0.5]]), ["a", "b", "c"])
    np.testing.assert_allclose(np.exp(d.log_proba), [[0.6 / 1.4, 0.3 / 1.4, 0.5 / 1.4]])
    assert d.labels == ["a"]


def test_loss_matrix_two_classes():
    # losing a ham costs 10. P(spam)=0.9: E[spam] = 0.1*10 = 1.0 > E[ham] = 0.9 -> ham.
    # P(spam)=0.95: E[spam] = 0.5 < E[ham] = 0.95 -> spam.
    rule = DecisionRule(loss_matrix={"ham": {"spam": 10}})
    d = rule.decide(logp([[0.1, 0.9], [0.05, 0.95]]), CLASSES)
    assert d.labels == ["ham", "spam"]


def test_loss_matrix_three_classes():
    # P = [0.5, 0.3, 0.2]; predicting a when truth is b or c costs 5:
    # E[a] = 0.3*5 + 0.2*5 = 2.5, E[b] = 0.5 + 0.2 = 0.7, E[c] = 0.5 + 0.3 = 0.8 -> b
    rule = DecisionRule(loss_matrix={"b": {"a": 5}, "c": {"a": 5}})
    assert rule.decide(logp([[0.5, 0.3, 0.2]]), ["a", "b", "c"]).labels == ["b"]
    assert DecisionRule(loss_matrix={}).decide(logp([[0.5, 0.3, 0.2]]), ["a", "b", "c"]).labels == ["a"]


def test_loss_matrix_with_a_zero_probability_class():
    lp = np.array([[0.0, -np.inf]])
    d = DecisionRule(loss_matrix={"ham": {"spam": 10}}).decide(lp, CLASSES)
    assert d.labels == ["ham"]


def test_threshold_on_log_odds():
    # log-odds log(0.89/0.11) = 2.090 < log 9 = 2.197 < log(0.91/0.09) = 2.314
    rule = DecisionRule(threshold=np.log(9.0))
    assert rule.decide(logp([[0.11, 0.89], [0.09, 0.91]]), CLASSES).labels == ["ham", "spam"]
    # a negative threshold favours the positive class: P(spam) = 0.3 has log-odds -0.847 > -1
    assert DecisionRule(threshold=-1.0).decide(logp([[0.7, 0.3]]), CLASSES).labels == ["spam"]


def test_positive_class_default_and_explicit():
    # columns in learnt order [spam, ham]: the positive class is still "spam" (sorted last)
    rule = DecisionRule(threshold=2.0)
    assert rule.decide(logp([[0.85, 0.15]]), ["spam", "ham"]).labels == ["ham"]  # log-odds 1.73
    assert rule.decide(logp([[0.9, 0.1]]), ["spam", "ham"]).labels == ["spam"]  # 2.197
    # integer classes: 1 is positive
    assert DecisionRule(threshold=2.0).decide(logp([[0.1, 0.9]]), [0, 1]).labels == [1]
    # explicit positive "ham": ham needs log-odds > 2, here log(0.8/0.2) = 1.39 -> spam
    assert DecisionRule(threshold=2.0, positive="ham").decide(logp([[0.8, 0.2]]), CLASSES).labels == ["spam"]
    with pytest.raises(ValueError, match="positive class 'eggs' is not one of"):
        DecisionRule(threshold=0.0, positive="eggs").decide(logp([[0.5, 0.5]]), CLASSES)


def test_unsure_band_is_inclusive():
    rule = DecisionRule(unsure_band=(0.4, 0.6))
    d = rule.decide(logp([[0.6, 0.4], [0.39, 0.61], [0.5, 0.5], [0.7, 0.3]]), CLASSES)
    assert d.labels == [UNSURE, "spam", UNSURE, "ham"]
    assert d.unsure.tolist() == [True, False, True, False]


def test_threshold_and_band_ignored_unless_two_classes():
    rule = DecisionRule(threshold=5.0, unsure_band=(0.0, 1.0))
    d = rule.decide(logp([[0.2, 0.3, 0.5]]), ["a", "b", "c"])
    assert d.labels == ["c"] and not d.unsure.any()
    one = rule.decide(np.zeros((2, 1)), ["ham"])
    assert one.labels == ["ham", "ham"]


def test_empty_batch():
    d = DecisionRule(unsure_band=(0.4, 0.6)).decide(np.zeros((0, 2)), CLASSES)
    assert d.labels == [] and d.unsure.shape == (0,)


def test_bad_options_and_shapes():
    with pytest.raises(ValueError, match="either a loss matrix or a threshold"):
        DecisionRule(threshold=1.0, loss_matrix={"ham": {"spam": 2}})
    with pytest.raises(ValueError, match="0 <= lo <= hi <= 1"):
        DecisionRule(unsure_band=(0.7, 0.3))
    with pytest.raises(ValueError, match="class priors must be finite numbers > 0"):
        DecisionRule(class_prior={"spam": 0.0})
    with pytest.raises(ValueError, match="losses must be finite numbers >= 0"):
        DecisionRule(loss_matrix={"ham": {"spam": -1}})
    with pytest.raises(ValueError, match=r"shape \(n_samples, 2\).*got \(1, 3\)"):
        DecisionRule().decide(np.zeros((1, 3)), CLASSES)
    with pytest.raises(ValueError, match="unknown decision options"):
        DecisionRule.from_dict({"treshold": 1})


def test_round_trip_and_int_labels_match_text_options():
    rule = DecisionRule(class_prior={"0": 0.5, "1": 0.5}, unsure_band=(0.45, 0.55), positive=1)
    assert DecisionRule.from_dict(rule.to_dict()) == rule
    d = rule.decide(logp([[0.5, 0.5]]), [0, 1], learnt_log_prior=np.log([0.5, 0.5]))
    assert d.labels == [UNSURE]


def test_parsers():
    assert parse_class_prior("spam=0.3,ham=0.7") == {"spam": 0.3, "ham": 0.7}
    assert parse_loss_matrix("ham:spam=10") == {"ham": {"spam": 10.0}}
    assert parse_unsure_band(" 0.2 , 0.8 ") == (0.2, 0.8)
    with pytest.raises(ValueError, match="--class-prior expects entries like"):
        parse_class_prior("spam")
    with pytest.raises(ValueError, match="--class-prior expects a number, got 'x'"):
        parse_class_prior("spam=x")
    with pytest.raises(ValueError, match="true:predicted=loss"):
        parse_loss_matrix("ham=3")
    with pytest.raises(ValueError, match="two probabilities"):
        parse_unsure_band("0.5")


def test_a_class_with_no_weight_takes_no_part_in_verdicts_nor_scores():
    """A third class at weight 0 (a typo learnt, then forgotten): the labels, the unsure
    mask, the posteriors and the per-feature score are those of the two-class model."""
    two = np.log([[0.3, 0.7], [0.9, 0.1], [0.45, 0.55]])
    # the same rows with an empty "Spam" column the model still gives some mass to
    three = np.log(np.column_stack([np.exp(two) * 0.8, [0.2, 0.2, 0.2]]))[:, [0, 2, 1]]
    rule = DecisionRule(min_class_weight=3.0, unsure_band=(0.5, 0.6), score="per_feature")
    n_values = [4.0, 10.0, 1.0]
    ref = rule.decide(two, ["ham", "spam"], class_weight=[[5.0, 6.0]] * 3)
    got = rule.decide(three, ["ham", "Spam", "spam"], class_weight=[[5.0, 0.0, 6.0]] * 3)
    assert got.labels == ref.labels == ["spam", "ham", "unsure"]
    assert got.unsure.tolist() == ref.unsure.tolist()
    np.testing.assert_allclose(got.log_proba[:, [0, 2]], ref.log_proba, rtol=1e-12)
    assert np.isneginf(got.log_proba[:, 1]).all()
    ref_score = rule.score_of(ref.log_proba, ["ham", "spam"], n_values)
    got_score = rule.score_of(got.log_proba, ["ham", "Spam", "spam"], n_values,
                              [[5.0, 0.0, 6.0]] * 3)
    np.testing.assert_allclose(got_score, ref_score, rtol=1e-12)
    # hand-worked: log(0.7/0.3) / 4 features
    assert got_score[0] == pytest.approx(math.log(0.7 / 0.3) / 4)
    # with weight, the third class counts: three classes, too little of one -> unsure; the
    # score is spam against the other two together, on the same per-feature scale
    cold = rule.decide(three, ["ham", "Spam", "spam"], class_weight=[[5.0, 1.0, 6.0]] * 3)
    assert cold.labels == ["unsure"] * 3
    cold_score = rule.score_of(cold.log_proba, ["ham", "Spam", "spam"], n_values,
                               [[5.0, 1.0, 6.0]] * 3)
    p = np.exp(cold.log_proba)
    np.testing.assert_allclose(cold_score, np.log(p[:, 2] / (p[:, 0] + p[:, 1])) / n_values,
                               rtol=1e-12)


def test_rows_whose_classes_with_weight_differ_are_decided_apart():
    lp = np.log([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]])
    rule = DecisionRule()
    d = rule.decide(lp, ["a", "b", "c"], class_weight=[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert d.labels == ["b", "unsure"] and d.unsure.tolist() == [False, True]
    np.testing.assert_allclose(np.exp(d.log_proba[0]), [0.4, 0.6, 0.0])
    s = rule.score_of(d.log_proba, ["a", "b", "c"], [1.0, 1.0], [[1.0, 1.0, 0.0], [0.0] * 3])
    assert s[0] == pytest.approx(math.log(0.6 / 0.4)) and math.isnan(s[1])


def test_operating_point_options_round_trip_and_are_checked():
    rule = DecisionRule(score="per_feature", target_fpr=0.001, calibration="isotonic",
                        score_window=5000)
    assert rule.uses_window and not rule.is_default
    assert DecisionRule.from_dict(rule.to_dict()) == rule
    assert DecisionRule(calibration="platt").uses_window
    assert not DecisionRule().uses_window
    for bad in ({"target_fpr": 0.0}, {"target_fpr": 1.0}, {"target_fpr": True},
                {"calibration": "beta"}, {"score_window": 99}, {"score_window": 1.5},
                {"target_fpr": 0.01, "threshold": 1.0}):
        with pytest.raises(ValueError):
            DecisionRule(**bad)
