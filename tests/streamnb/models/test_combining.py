"""Robinson's f(w) and Fisher's chi-square combining (SpamBayes, bogofilter) against
hand-worked numbers and scipy.stats.chi2."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import chi2

from streamnb.models import make_model
from streamnb.models.combining import chi2_indicators, chi2_q, fisher_indicator, robinson_f


@pytest.mark.parametrize("dof", [2, 4, 10, 60, 300])
@pytest.mark.parametrize("x2", [0.01, 0.5, 3.0, 20.0, 150.0, 900.0, 3000.0])
def test_chi2_q_is_the_chi_square_survival_function(x2, dof):
    assert chi2_q(x2, dof) == pytest.approx(chi2.sf(x2, dof), rel=1e-9, abs=1e-300)


def test_chi2_q_by_hand_and_at_the_edges():
    # dof 2: exp(-x/2); dof 4: exp(-x/2) (1 + x/2)
    assert chi2_q(4.0, 2) == pytest.approx(math.exp(-2.0), rel=1e-15)
    assert chi2_q(10.0, 4) == pytest.approx(math.exp(-5.0) * 6.0, rel=1e-15)
    assert chi2_q(0.0, 8) == 1.0 and chi2_q(math.inf, 8) == 0.0
    assert 0.0 < chi2_q(3000.0, 2) < 1e-600 or chi2_q(3000.0, 2) == 0.0  # no error, no NaN
    with pytest.raises(ValueError):
        chi2_q(1.0, 3)


def test_robinson_f_by_hand():
    # b=3 of 10 spam, g=1 of 20 ham: p = .3/(.3+.05) = 6/7, f = (.45*.5 + 4*6/7)/4.45
    f = robinson_f([3.0, 0.0, 0.0, 5.0], [1.0, 2.0, 0.0, 0.0], 10.0, 20.0)
    assert f[0] == pytest.approx((0.225 + 4 * 6 / 7) / 4.45, rel=1e-15)
    assert f[1] == pytest.approx(0.225 / 2.45, rel=1e-15)  # ham only: p = 0
    assert f[2] == 0.5  # never seen: x
    assert f[3] == pytest.approx((0.225 + 5.0) / 5.45, rel=1e-15)
    # bogofilter's one-division form (src/prob.c) gives the same p
    b, g, nb, ng = 3.0, 1.0, 10.0, 20.0
    assert b * ng / (b * ng + g * nb) == pytest.approx(6 / 7, rel=1e-15)


def test_fisher_indicator_by_hand():
    f = np.array([0.99, 0.98, 0.2])
    ln_spam = math.log(0.01) + math.log(0.02) + math.log(0.8)
    ln_ham = math.log(0.99) + math.log(0.98) + math.log(0.2)
    s = 1.0 - chi2.sf(-2.0 * ln_spam, 6)
    h = 1.0 - chi2.sf(-2.0 * ln_ham, 6)
    assert fisher_indicator(f) == pytest.approx((1.0 + s - h) / 2.0, rel=1e-12)
    assert fisher_indicator(f) == pytest.approx(0.8827, abs=5e-5)
    # symmetric: the mirrored probabilities give 1 - I
    assert fisher_indicator(1.0 - f) == pytest.approx(1.0 - fisher_indicator(f), rel=1e-12)
    # clues weaker than 0.1 from 0.5 are left out; none left: 0.5
    assert fisher_indicator(np.array([0.99, 0.98, 0.2, 0.55, 0.45])) == fisher_indicator(f)
    assert fisher_indicator(np.array([0.55, 0.41])) == 0.5
    # at most max_clues, the strongest
    assert fisher_indicator(np.array([0.99, 0.7, 0.3]), max_clues=1) == \
        fisher_indicator(np.array([0.99]))


def test_many_strong_clues_neither_underflow_nor_nan():
    f = np.full(150, 1e-6)
    assert fisher_indicator(f) == pytest.approx(0.0, abs=1e-12)
    assert fisher_indicator(1.0 - f) == pytest.approx(1.0, abs=1e-12)
    both = np.concatenate([f, 1.0 - f])  # S and H near 1 alike: unsure
    assert fisher_indicator(both, max_clues=300) == pytest.approx(0.5, abs=1e-12)


def test_indicators_from_a_model_match_the_counts_by_hand():
    # 3 buckets; spam messages: {0}, {0, 1}; ham: {1}, {2}, {2}
    X = sp.csr_matrix(np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [0, 0, 1]], float))
    y = ["spam", "spam", "ham", "ham", "ham"]
    model = make_model("multinomial", n_features=3).partial_fit(X, y)
    rows = sp.csr_matrix(np.array([[1, 0, 0], [0, 1, 1], [0, 0, 0]], float))
    got = chi2_indicators(model, rows, "spam")
    f = robinson_f([2.0, 1.0, 0.0], [0.0, 1.0, 2.0], 2.0, 3.0)
    assert got[0] == pytest.approx(fisher_indicator(f[[0]]), rel=1e-15)
    assert got[1] == pytest.approx(fisher_indicator(f[[1, 2]]), rel=1e-15)
    assert got[2] == 0.5
    assert got[0] > 0.9 and got[1] < 0.5
    one_class = make_model("multinomial", n_features=3).partial_fit(X[:2], y[:2])
    assert chi2_indicators(one_class, rows, "spam").tolist() == [0.5, 0.5, 0.5]


def test_prequential_equals_one_message_at_a_time():
    from streamnb.models.combining import chi2_prequential

    rng = np.random.default_rng(7)
    n, width = 60, 40
    dense = (rng.random((n, width)) < 0.2) * rng.integers(1, 3, (n, width))
    X = sp.csr_matrix(dense.astype(float))
    labels = [("spam", "ham", None)[int(k)] for k in rng.integers(0, 3, n)]
    weights = rng.choice([1.0, 2.0], n)
    warm = make_model("multinomial", n_features=width).partial_fit(X[:5], ["ham"] * 5)
    got = chi2_prequential(warm, X, labels, weights)
    assert warm.stats.parts["classes"].as_dict() == {"ham": 5.0}  # left unchanged
    one = make_model("multinomial", n_features=width).partial_fit(X[:5], ["ham"] * 5)
    expected = []
    for i in range(n):
        expected.append(chi2_indicators(one, X[i], "spam")[0])
        if labels[i] is not None:
            one.partial_fit(X[i], [labels[i]], sample_weight=[weights[i]])
    np.testing.assert_array_equal(got, np.array(expected))
    first_spam = labels.index("spam")
    assert (got[:first_spam + 1] == 0.5).all() and (got[first_spam + 1:] != 0.5).any()
