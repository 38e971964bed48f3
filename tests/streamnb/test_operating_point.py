"""The operating point: Clopper-Pearson bounds against hand-worked numbers and scipy, the
threshold against a brute-force search, and the calibrators on data of known
probabilities (streamnb/operating_point.py, streamnb/calibration.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta, binom

from streamnb.calibration import expected_calibration_error, fit_calibrator, pav, reliability
from streamnb.exceptions import FormatError
from streamnb.operating_point import (
    N_BINS,
    ScoreWindow,
    fp_upper_bound,
    max_false_positives,
)


def test_clopper_pearson_hand_worked():
    # no false positive in n: (1 - p)^n = 0.05
    assert fp_upper_bound(0, 10) == pytest.approx(1 - 0.05 ** 0.1, abs=1e-15)  # 0.25887
    assert fp_upper_bound(0, 10) == pytest.approx(0.258866, abs=1e-6)
    # one in ten: (1 - p)^10 + 10 p (1 - p)^9 = 0.05 at p = 0.39416 (tables of the exact interval)
    p = fp_upper_bound(1, 10)
    assert p == pytest.approx(0.394163, abs=1e-6)
    assert (1 - p) ** 10 + 10 * p * (1 - p) ** 9 == pytest.approx(0.05, abs=1e-12)
    assert fp_upper_bound(10, 10) == 1.0 and fp_upper_bound(0, 0) == 1.0


@pytest.mark.parametrize(("k", "n"), [(1, 50), (3, 1000), (17, 20_000), (0, 3000), (99, 100)])
def test_clopper_pearson_is_the_binomial_tail(k, n):
    p = fp_upper_bound(k, n)
    assert p == pytest.approx(beta.ppf(0.95, k + 1, n - k), rel=1e-12)
    assert binom.cdf(k, n, p) == pytest.approx(0.05, abs=1e-9)  # P(X <= k) at the bound


def test_max_false_positives_is_the_largest_k_under_the_target():
    for n in (100, 2994, 2995, 5000, 12_345):
        k = max_false_positives(n, 0.001)
        bounds = [fp_upper_bound(j, n) for j in range(0, 40)]
        want = max((j for j, b in enumerate(bounds) if b <= 0.001), default=-1)
        assert k == want, n
    # the smallest n that supports 0.001 with no false positive: ln(0.05) / ln(0.999)
    assert math.ceil(math.log(0.05) / math.log(0.999)) == 2995


def _brute_threshold(neg_scores, target, window):
    """The lowest bin edge whose count of negatives at or above it has a bound <= target."""
    n = len(neg_scores)
    codes = np.array([window.code(s, False) >> 1 for s in neg_scores])
    for j in range(N_BINS + 1):
        k = int(np.sum(codes >= j))
        if fp_upper_bound(k, n) <= target:
            return -math.inf if j == 0 else math.inf if j == N_BINS else window.lo + j * window.width
    raise AssertionError


def test_threshold_is_the_lowest_edge_the_bound_allows():
    rng = np.random.default_rng(3)
    w = ScoreWindow(size=5000, target_fpr=0.01, refit_every=1)
    ham = rng.normal(-1.0, 0.6, size=1500)
    spam = rng.normal(1.0, 0.6, size=300)
    w.add([w.code(s, False) for s in ham] + [w.code(s, True) for s in spam])
    assert w.point.supported and w.point.n_negative == 1500 and w.point.n_positive == 300
    assert w.point.threshold == _brute_threshold(ham, 0.01, w)
    # measured: the ham at or above it, and its bound
    k = int(np.sum(ham >= w.point.threshold))
    assert k <= max_false_positives(1500, 0.01) and fp_upper_bound(k, 1500) <= 0.01


def test_too_few_negatives_hold_above_every_one_and_never_below_the_argmax():
    w = ScoreWindow(size=1000, target_fpr=0.001, refit_every=1)
    w.add([w.code(-2.0, False)] * 100)
    assert not w.point.supported
    assert w.point.threshold == 0.0  # above -2, but not below the argmax
    w.add([w.code(0.7, False)])
    assert not w.point.supported and w.point.threshold == pytest.approx(0.705)


def test_the_window_forgets_the_oldest():
    w = ScoreWindow(size=100, target_fpr=0.5, refit_every=10)
    w.add([w.code(1.0, False)] * 100)
    w.add([w.code(-1.0, True)] * 60)
    assert w.total == 160 and int(w.counts[0].sum()) == 40 and int(w.counts[1].sum()) == 60
    assert (w.ring >= 0).all()


def test_walk_does_not_change_the_window_and_matches_adding_one_at_a_time():
    rng = np.random.default_rng(1)
    w = ScoreWindow(size=300, target_fpr=0.05, calibration="isotonic", refit_every=7)
    w.add([w.code(s, bool(s > 0)) for s in rng.normal(size=250)])
    before = w.to_bytes()
    scores = rng.normal(size=80)
    truth = rng.integers(-1, 2, size=80).tolist()
    points, codes = w.walk(scores, truth)
    assert w.to_bytes() == before
    step = w.copy()
    for s, t, pt, c in zip(scores, truth, points, codes, strict=True):
        assert pt.threshold == step.point.threshold
        assert pt.calibrator(s) == step.point.calibrator(s)
        if t >= 0:
            assert c == step.code(s, t == 1)
            step.add([c])
        else:
            assert c is None


def test_bytes_are_checked():
    w = ScoreWindow(size=10, target_fpr=0.1)
    with pytest.raises(FormatError):
        ScoreWindow(size=11, target_fpr=0.1).load_bytes(w.to_bytes())
    with pytest.raises(FormatError):
        w.add([2 * N_BINS])
    from streamnb.encoding import dumps, loads, pack_array

    obj = loads(w.to_bytes())
    obj["fitted"] = pack_array(np.full((2, N_BINS), -1, dtype=np.int64))
    with pytest.raises(FormatError):
        ScoreWindow(size=10, target_fpr=0.1).load_bytes(dumps(obj))


# ---------------------------------------------------------------------- calibration
def _known(n, seed, a=2.0, b=-0.5):
    """Scores and outcomes with P(positive | s) = sigmoid(a s + b)."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(-3, 3, size=n)
    p = 1 / (1 + np.exp(-(a * s + b)))
    return s, (rng.random(n) < p).astype(int), p


def _binned(s, y, w):
    codes = np.array([w.code(x, bool(t)) for x, t in zip(s, y, strict=True)])
    pos = np.bincount(codes[codes % 2 == 1] // 2, minlength=N_BINS)
    neg = np.bincount(codes[codes % 2 == 0] // 2, minlength=N_BINS)
    return pos, neg


@pytest.mark.parametrize("kind", ["platt", "isotonic"])
def test_calibrators_recover_known_probabilities(kind):
    w = ScoreWindow(size=100)
    s, y, _ = _known(40_000, seed=0)
    pos, neg = _binned(s, y, w)
    cal = fit_calibrator(kind, w.centres, pos, neg)
    s2, y2, p2 = _known(20_000, seed=1)
    got = cal(s2)
    assert np.abs(got - p2).mean() < (0.01 if kind == "platt" else 0.03)
    assert expected_calibration_error(got, y2) < 0.02
    assert expected_calibration_error(np.where(s2 > 0, 0.99, 0.01), y2) > 0.1  # (not calibrated)
    if kind == "platt":
        assert cal.xs[0] == pytest.approx(2.0, rel=0.05) and cal.xs[1] == pytest.approx(-0.5, abs=0.05)


def test_isotonic_is_scikit_learns_on_the_bins():
    from sklearn.isotonic import IsotonicRegression

    w = ScoreWindow(size=100)
    s, y, _ = _known(3000, seed=4)
    pos, neg = _binned(s, y, w)
    cal = fit_calibrator("isotonic", w.centres, pos, neg)
    held = (pos + neg) > 0
    n = (pos + neg)[held]
    ref = IsotonicRegression().fit(w.centres[held], pos[held] / n, sample_weight=n)
    total = n.sum()
    want = np.clip(ref.predict(w.centres[held]), 1 / (total + 2), (total + 1) / (total + 2))
    np.testing.assert_allclose(cal.ys, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(pav([3, 1, 2], [1, 1, 2]), [2.0, 2.0, 2.0])  # (3 + 1 + 2 x 2) / 4


def test_reliability_and_ece_by_hand():
    mp, share, n = reliability([0.05, 0.15, 0.55, 0.65], [0, 0, 1, 0], bins=2)
    assert n.tolist() == [2, 2]
    assert mp.tolist() == pytest.approx([0.1, 0.6]) and share.tolist() == [0.0, 0.5]
    assert expected_calibration_error([0.05, 0.15, 0.55, 0.65], [0, 0, 1, 0], bins=2) == \
        pytest.approx((0.1 * 2 + 0.1 * 2) / 4)
