"""streamnb.bounds against the lecture's worked numbers and numerical integration."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import dblquad, quad
from scipy.stats import multivariate_normal, norm

from streamnb.bounds import (
    bayes_error,
    bayes_thresholds,
    bhattacharyya_bound,
    bhattacharyya_distance,
    chernoff_bound,
    chernoff_exponent,
)


# ------------------------------------------------------------- lecture numbers
def test_lecture_threshold_and_error_equal_variance():
    t = bayes_thresholds(0, 1, 2, 1, priors=(0.8, 0.2))
    assert t.shape == (1,)
    assert round(float(t[0]), 4) == 1.6931
    assert round(bayes_error(0, 1, 2, 1, priors=(0.8, 0.2)), 4) == 0.1121


def test_lecture_chernoff_and_bhattacharyya():
    b = chernoff_bound(0, 1, 2, 1, priors=(0.8, 0.2))
    assert round(b.bound, 4) == 0.1908
    assert round(b.alpha, 4) == 0.1534
    assert round(bhattacharyya_bound(0, 1, 2, 1, priors=(0.8, 0.2)), 4) == 0.2426


def test_lecture_bhattacharyya_equal_means():
    assert round(bhattacharyya_bound(0, 1, 0, 4), 4) == 0.4472


def test_chernoff_alpha_closed_form_equal_variance():
    # log bound = a ln p1 + (1-a) ln p2 - a(1-a) dm^2 / 2 is minimal at
    # a = 1/2 - ln(p1/p2) / dm^2.
    for p1, dm in [(0.8, 2.0), (0.3, 3.0), (0.5, 1.0)]:
        b = chernoff_bound(0, 1, dm, 1, priors=(p1, 1 - p1))
        assert b.alpha == pytest.approx(0.5 - np.log(p1 / (1 - p1)) / dm**2, abs=1e-7)


# ------------------------------------------------------- against integration
@pytest.mark.parametrize(
    "m1,v1,m2,v2,p1",
    [(0, 1, 2, 1, 0.8), (0, 1, 0, 4, 0.5), (1, 0.5, -1, 3, 0.3), (0, 2, 4, 1, 0.6), (0, 1, 5, 1.2, 0.99)],
)
def test_bayes_error_matches_integral_of_min(m1, v1, m2, v2, p1):
    p2 = 1 - p1
    t = bayes_thresholds(m1, v1, m2, v2, (p1, p2))
    for x in t:  # the weighted densities are equal at every threshold
        assert np.log(p1) + norm.logpdf(x, m1, np.sqrt(v1)) == pytest.approx(
            np.log(p2) + norm.logpdf(x, m2, np.sqrt(v2)), abs=1e-9)
    integrand = lambda x: min(p1 * norm.pdf(x, m1, np.sqrt(v1)), p2 * norm.pdf(x, m2, np.sqrt(v2)))  # noqa: E731
    expected, _ = quad(integrand, -40, 40, points=list(t), limit=500)
    assert bayes_error(m1, v1, m2, v2, (p1, p2)) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.77])
def test_chernoff_exponent_matches_integral_1d(alpha):
    m1, v1, m2, v2 = 0.3, 0.7, -1.2, 2.5
    f = lambda x: norm.pdf(x, m1, np.sqrt(v1)) ** alpha * norm.pdf(x, m2, np.sqrt(v2)) ** (1 - alpha)  # noqa: E731
    integral, _ = quad(f, -40, 40, limit=200)
    assert chernoff_exponent(alpha, m1, v1, m2, v2) == pytest.approx(-np.log(integral), abs=1e-9)


def test_bhattacharyya_matches_integral_2d():
    m1, c1 = np.array([0.0, 1.0]), np.array([[1.0, 0.3], [0.3, 0.5]])
    m2, c2 = np.array([1.0, -0.5]), np.array([[2.0, -0.4], [-0.4, 1.0]])
    p, q = multivariate_normal(m1, c1), multivariate_normal(m2, c2)
    integral, _ = dblquad(lambda y, x: np.sqrt(p.pdf([x, y]) * q.pdf([x, y])), -12, 12, -12, 12,
                          epsabs=1e-11)
    assert bhattacharyya_distance(m1, c1, m2, c2) == pytest.approx(-np.log(integral), abs=1e-7)


def test_bounds_are_ordered():
    rng = np.random.default_rng(3)
    for _ in range(20):
        m1, m2 = rng.normal(size=2) * 2
        v1, v2 = rng.uniform(0.2, 4, size=2)
        p1 = rng.uniform(0.05, 0.95)
        pri = (p1, 1 - p1)
        err = bayes_error(m1, v1, m2, v2, pri)
        ch = chernoff_bound(m1, v1, m2, v2, pri)
        bh = bhattacharyya_bound(m1, v1, m2, v2, pri)
        assert err <= ch.bound + 1e-12
        assert ch.bound <= bh + 1e-12
        assert 0.0 <= ch.alpha <= 1.0


def test_diagonal_vector_equals_full_matrix():
    m1, m2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    v1, v2 = np.array([1.0, 2.0, 0.5]), np.array([3.0, 1.0, 1.0])
    assert bhattacharyya_distance(m1, v1, m2, v2) == pytest.approx(
        bhattacharyya_distance(m1, np.diag(v1), m2, np.diag(v2)), abs=1e-12)
    # Independent features: the distance is the sum of the 1-D distances.
    assert bhattacharyya_distance(m1, v1, m2, v2) == pytest.approx(
        sum(bhattacharyya_distance(a, b, c, d) for a, b, c, d in zip(m1, v1, m2, v2, strict=True)))


def test_identical_classes_and_zero_prior():
    assert bayes_thresholds(1, 2, 1, 2).size == 0
    assert bayes_error(1, 2, 1, 2, (0.3, 0.7)) == pytest.approx(0.3)
    assert bhattacharyya_distance(1, 2, 1, 2) == 0.0
    assert bayes_error(0, 1, 1, 1, (1.0, 0.0)) == 0.0
    assert chernoff_bound(0, 1, 1, 1, (1.0, 0.0)).bound == 0.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: bayes_error(0, 0, 1, 1),
        lambda: bayes_error(0, -1, 1, 1),
        lambda: bayes_thresholds(0, 1, 1, 1, priors=(0.5, 0.6)),
        lambda: bayes_thresholds(0, 1, 1, 1, priors=(1.2, -0.2)),
        lambda: bayes_error(np.nan, 1, 1, 1),
        lambda: bhattacharyya_distance([0, 0], [1, 1], [0, 0, 0], [1, 1, 1]),
        lambda: bhattacharyya_distance([0, 0], [[1, 2], [2, 1]], [0, 0], [1, 1]),
        lambda: chernoff_bound([0, 0], [1, 1, 1], [0, 0], [1, 1]),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()
