"""A prior that follows the traffic (``prior_half_life``): Saerens et al.'s adjustment
against hand-worked numbers and Bayes' rule, their EM against the prior a sample was
drawn with, and the score window's followed prior and verdicts worked by hand
(streamnb/calibration.py, streamnb/operating_point.py, streamnb/decision.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamnb.calibration import adjust_to_prior, em_prior
from streamnb.decision import DecisionRule
from streamnb.exceptions import FormatError
from streamnb.operating_point import ScoreWindow


def test_adjustment_hand_worked():
    # odds 0.8/0.2 = 4, times (0.5/0.5) / (0.2/0.8) = 4: 16, so 16/17
    assert adjust_to_prior(0.8, 0.2, 0.5) == pytest.approx(16 / 17, abs=1e-15)
    # odds 0.3/0.7, times (0.25/0.75) / (0.5/0.5): 1/7, so 1/8
    assert adjust_to_prior(0.3, 0.5, 0.25) == pytest.approx(0.125, abs=1e-15)
    # the same prior: unchanged; 0 and 1 stay
    assert adjust_to_prior(0.37, 0.2, 0.2) == pytest.approx(0.37, abs=1e-15)
    assert adjust_to_prior(np.array([0.0, 1.0]), 0.3, 0.9).tolist() == [0.0, 1.0]


def test_adjustment_is_bayes_rule_with_the_new_prior():
    """Two Gaussian classes: the posterior at the fitted prior, moved, is the posterior
    at the new prior (the class densities unchanged: label shift)."""
    x = np.linspace(-4, 4, 81)
    f_pos, f_neg = np.exp(-0.5 * (x - 1) ** 2), np.exp(-0.5 * (x + 1) ** 2)

    def posterior(prior: float) -> np.ndarray:
        return prior * f_pos / (prior * f_pos + (1 - prior) * f_neg)

    for fitted, new in ((0.15, 0.5), (0.5, 0.03), (0.9, 0.2)):
        moved = adjust_to_prior(posterior(fitted), fitted, new)
        np.testing.assert_allclose(moved, posterior(new), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(adjust_to_prior(moved, new, fitted), posterior(fitted),
                                   rtol=1e-12, atol=1e-15)


def test_em_finds_the_prior_a_sample_was_drawn_with():
    rng = np.random.default_rng(3)
    for true_prior in (0.1, 0.5, 0.8):
        n = 20_000
        y = rng.random(n) < true_prior
        x = np.where(y, rng.normal(1.5, 1.0, n), rng.normal(-1.5, 1.0, n))
        # posteriors made where the positive share was 0.2
        f_pos, f_neg = np.exp(-0.5 * (x - 1.5) ** 2), np.exp(-0.5 * (x + 1.5) ** 2)
        p = 0.2 * f_pos / (0.2 * f_pos + 0.8 * f_neg)
        est = em_prior(p, 0.2)
        assert abs(est - y.mean()) < 0.01, (true_prior, est, y.mean())
        # the fixed point: the mean of the moved posteriors is the share
        assert float(np.mean(adjust_to_prior(p, 0.2, est))) == pytest.approx(est, abs=1e-8)


def _window(**kw) -> ScoreWindow:
    """Labels by hand: at score -1, 3 negatives and 1 positive; at +1, 1 and 3. Added
    negatives first, then positives; half-life 1 (each weighs half at the next)."""
    w = ScoreWindow(size=100, score="per_feature", calibration="isotonic", refit_every=8,
                    prior_half_life=1.0, **kw)
    w.add([w.code(-1.0, False)] * 3 + [w.code(1.0, False)] + [w.code(-1.0, True)]
          + [w.code(1.0, True)] * 3)
    return w


def test_the_followed_prior_by_hand():
    w = _window()
    # weights of the 8 labels, last first: 1, 1/2, 1/4, 1/8 (positives), 1/16 ... 1/128
    pos, neg = 1 + 1 / 2 + 1 / 4 + 1 / 8, 1 / 16 + 1 / 32 + 1 / 64 + 1 / 128
    assert w.recent == (neg, pos)
    assert w.prior == (pos + 1) / (pos + neg + 2)  # 2.875 / 3.9921875
    assert w.point.n_negative == w.point.n_positive == 4  # the window's mix: 5/10


def test_verdicts_by_the_moved_probability_by_hand():
    w = _window()
    prior = w.prior  # 0.72016 (the window fitted at 1/2)
    # isotonic: 1/4 at bin centre -0.9975, 3/4 at 1.0025, a straight line between
    p = 0.25 + 0.5 * (-0.5 + 0.9975) / 2.0
    assert w.point.calibrator(-0.5) == pytest.approx(p, abs=1e-12)
    odds = p / (1 - p) * prior / (1 - prior)  # x (prior / (1 - prior)) / (1/2 / 1/2)
    j = w.judge([-0.5, -1.0, 2.0, -0.5], ["ham", "ham", "spam", "unsure"],
                [None, "ham", None, None], "spam", "ham")
    assert j.probas[0] == pytest.approx(odds / (1 + odds), abs=1e-12)  # 0.606
    assert j.labels[0] == "spam"  # the score says ham; the followed prior, spam
    assert j.priors[0] == prior
    # p = 1/4 at -1: odds 1/3 x 2.5735 = 0.858: ham
    assert j.labels[1] == "ham" and j.probas[1] < 0.5
    # the third sees the second (a ham) added: its prior moves toward ham
    neg, pos = w.recent
    assert j.priors[2] == (w.decay * pos + 1) / (w.decay * (neg + pos) + 1 + 2)
    assert j.labels[2] == "spam"
    assert j.labels[3] == "unsure"  # an unsure verdict stays unsure
    assert w.total == 8  # judging changes nothing


def test_with_a_target_the_threshold_decides_not_the_prior():
    w = _window(target_fpr=0.5)
    j = w.judge([-0.5], ["ham"], [None], "spam", "ham")
    assert j.probas[0] > 0.5 and j.priors[0] == w.prior  # moved
    assert j.labels[0] == ("spam" if -0.5 >= j.thresholds[0] else "ham")


def test_no_move_before_the_calibrator_has_seen_both_classes():
    w = ScoreWindow(size=100, calibration="isotonic", refit_every=1, prior_half_life=10.0)
    w.add([w.code(-1.0, False)] * 5)
    j = w.judge([0.3], ["spam"], [None], "spam", "ham")
    assert j.labels == ["spam"] and j.priors == [None] and j.probas[0] is not None


def test_the_followed_prior_travels_in_the_bytes():
    w = _window()
    v = ScoreWindow(size=100, score="per_feature", calibration="isotonic", refit_every=8,
                    prior_half_life=1.0).load_bytes(w.to_bytes())
    assert v.recent == w.recent and v.prior == w.prior
    plain = ScoreWindow(size=100, score="per_feature", calibration="isotonic", refit_every=8)
    with pytest.raises(FormatError):  # a window kept without it
        _window().load_bytes(plain.to_bytes())
    # and one without a followed prior ignores it (its bytes unchanged by the setting)
    assert "recent" not in plain.to_bytes().decode("latin-1")
    plain.load_bytes(w.to_bytes())
    assert plain.prior is None


def test_the_decision_rule_takes_the_half_life_with_a_calibration():
    rule = DecisionRule(calibration="isotonic", prior_half_life=200)
    assert rule.to_dict() == {"calibration": "isotonic", "prior_half_life": 200}
    assert DecisionRule.from_dict(rule.to_dict()) == rule
    for bad in (dict(prior_half_life=200),
                dict(calibration="platt", prior_half_life=0.5),
                dict(calibration="platt", prior_half_life=math.inf),
                dict(calibration="platt", prior_half_life=True),
                dict(calibration="platt", prior_half_life=10, class_prior={"spam": 0.5})):
        with pytest.raises(ValueError):
            DecisionRule(**bad)
