"""The TREC spam track measures of benchmarks._trec against hand-worked numbers and
scikit-learn's roc_auc_score."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _trec  # noqa: E402


def test_roc_area_hand_worked_with_ties():
    # spam 0.8, 0.5, 0.5; ham 0.5, 0.2: pairs (spam, ham) above: 0.8>0.5, 0.8>0.2,
    # 0.5=0.5 (half), 0.5>0.2, 0.5=0.5 (half), 0.5>0.2 -> 5 of 6
    area = _trec.roc_area([0.8, 0.5, 0.5, 0.5, 0.2], [True, True, True, False, False])
    assert area == pytest.approx(5 / 6)


def test_roc_area_of_perfect_inverted_and_constant_scores():
    y = [True, False, True, False]
    assert _trec.roc_area([4, 1, 3, 2], y) == 1.0
    assert _trec.roc_area([1, 4, 2, 3], y) == 0.0
    assert _trec.roc_area([7, 7, 7, 7], y) == 0.5


def test_roc_area_matches_sklearn_on_tied_random_scores():
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(10, 400))
        y = rng.random(n) < 0.3
        y[0], y[1] = True, False
        scores = np.round(rng.normal(size=n) + y, 1)  # rounding makes many ties
        assert _trec.roc_area(scores, y) == pytest.approx(roc_auc_score(y, scores), abs=1e-12)


def test_roc_area_takes_infinite_scores():
    y = [True, False, True, False]
    s = [math.inf, -math.inf, math.inf, 0.0]
    assert _trec.roc_area(s, y) == 1.0
    with pytest.raises(ValueError, match="NaN"):
        _trec.roc_area([math.nan, 0, 1, 2], y)


def test_lam_hand_worked():
    # hm = 12/2750, sm = 35/500: logits -5.4302, -2.5867; mean -4.00846 -> 1.784%
    hm, sm = 12 / 2750, 35 / 500
    x = (math.log(hm / (1 - hm)) + math.log(sm / (1 - sm))) / 2
    assert _trec.lam(12, 2750, 35, 500) == pytest.approx(1 / (1 + math.exp(-x)))
    assert _trec.lam(12, 2750, 35, 500) * 100 == pytest.approx(1.784, abs=5e-4)
    # equal rates: lam is that rate
    assert _trec.lam(5, 100, 50, 1000) == pytest.approx(0.05)


def test_lam_corrects_a_rate_of_zero_with_half_a_message():
    # no ham flagged of 2750, 283 of 500 spam missed: hm = 0.5/2750 -> lam% 1.52
    assert _trec.lam(0, 2750, 283, 500) * 100 == pytest.approx(1.517, abs=1e-3)
    assert _trec.lam(0, 100, 0, 100) == pytest.approx(0.005)
    assert _trec.lam(100, 100, 100, 100) == pytest.approx(0.995)


def test_spam_recall_at_ham_fpr_hand_worked():
    # 1000 ham scored 0..999; 10 spam: 5 above every ham, 5 between ham 995 and 996.
    ham = np.arange(1000.0)
    spam = np.array([2000.0] * 5 + [995.5] * 5)
    s = np.concatenate([ham, spam])
    y = np.concatenate([np.zeros(1000, bool), np.ones(10, bool)])
    # 0.1% of 1000 ham = 1 ham may be flagged: the cut-off is the 2nd highest ham (998)
    assert _trec.spam_recall_at(s, y, 0.001) == 0.5
    assert _trec.spam_recall_at(s, y, 0.0) == 0.5  # none: the highest ham (999)
    assert _trec.spam_recall_at(s, y, 0.003) == 0.5  # 3: ham 996
    assert _trec.spam_recall_at(s, y, 0.004) == 1.0  # 4: ham 995, below the 995.5 spam


def test_spam_recall_counts_a_tie_at_the_cut_off_against_the_filter():
    y = [True, True, False, False]
    assert _trec.spam_recall_at([1.0, 0.5, 1.0, 0.0], y, 0.0) == 0.0
    assert _trec.spam_recall_at([1.0, 0.5, 1.0, 0.0], y, 0.5) == 1.0


def test_measure_counts_missing_verdicts_as_errors():
    m = _trec.measure([0.0, 0.0, 5.0, -5.0, 3.0], [None, None, True, False, False],
                      [True, False, True, False, True])
    assert (m.n, m.n_ham, m.n_spam) == (5, 2, 3)
    assert (m.ham_errors, m.spam_errors, m.no_verdict) == (1, 2, 2)
    assert m.accuracy == pytest.approx(2 / 5)
    assert m.ham_fpr == 0.5 and m.spam_fnr == pytest.approx(2 / 3)
    assert m.roca_pct == pytest.approx(100 * (1 - roc_auc_score([1, 0, 1, 0, 1],
                                                                [0.0, 0.0, 5.0, -5.0, 3.0])))
    assert m.lam_pct == pytest.approx(100 * _trec.lam(1, 2, 2, 3))


def test_measure_takes_numpy_verdicts_and_labels():
    scores = np.array([2.0, -1.0, 0.5, -3.0])
    m = _trec.measure(scores, scores > 0, np.array([True, False, False, False]))
    assert (m.ham_errors, m.spam_errors, m.no_verdict) == (1, 0, 0)
    assert m.accuracy == 0.75


def test_measure_of_one_class_has_no_ranking_figures():
    m = _trec.measure([1.0, 2.0], [False, False], [False, False])
    assert m.accuracy == 1.0 and m.ham_fpr == 0.0
    assert math.isnan(m.roca_pct) and math.isnan(m.lam_pct) and math.isnan(m.spam_fnr)


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="one score, verdict and label"):
        _trec.measure([1.0], [True, False], [True, False])
    with pytest.raises(ValueError, match="0 <= errors <= n"):
        _trec.corrected_rate(3, 2)
