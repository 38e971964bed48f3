"""Drift detectors on seeded synthetic streams with a known change point."""

from __future__ import annotations

import copy
import math
import random
import struct

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from streamnb.drift import (
    ADWIN,
    GaussianDrift,
    Moments,
    PageHinkley,
    PriorShift,
    TokenDrift,
    j_divergence,
    js_divergence,
)
from streamnb.drift.base import DriftDetector
from streamnb.drift.prior_shift import g_statistic


def first_alarm(detector, stream, *args) -> int | None:
    for i, x in enumerate(stream):
        if detector.update(x, *args):
            return i
    return None


def bernoulli(seed: int, p0: float, p1: float, n0: int, n1: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.random(n0) < p0, rng.random(n1) < p1]).astype(float)


# ------------------------------------------------------------------------------- ADWIN
@pytest.mark.parametrize("seed", range(3))
def test_adwin_detects_error_rate_rise_within_bound(seed):
    stream = bernoulli(seed, 0.05, 0.25, 3000, 2000)
    i = first_alarm(ADWIN(), stream)
    assert i is not None and 3000 <= i < 3000 + 400


def test_adwin_no_alarm_on_stable_stream():
    assert first_alarm(ADWIN(), bernoulli(11, 0.05, 0.05, 20_000, 0)) is None


def test_adwin_matches_river_first_detection():
    river = pytest.importorskip("river.drift")
    for seed in range(3):
        stream = bernoulli(seed, 0.05, 0.25, 3000, 1000)
        ours = first_alarm(ADWIN(), stream)
        theirs = river.ADWIN()
        ref = None
        for i, x in enumerate(stream):
            theirs.update(x)
            if theirs.drift_detected:
                ref = i
                break
        assert ours == ref


def test_adwin_window_statistics_match_numpy():
    rng = np.random.default_rng(5)
    xs = rng.normal(3.0, 2.0, 777)
    d = ADWIN(clock=10**9)          # never checks: the window holds everything
    for x in xs:
        d.update(x)
    assert d.width == 777
    assert d.mean == pytest.approx(xs.mean(), rel=1e-12)
    assert d.variance == pytest.approx(xs.var(), rel=1e-9)
    assert sum(len(r) for r in d._rows) <= 5 * (int(np.log2(777)) + 1)


def test_adwin_direction_increase_ignores_a_fall():
    stream = bernoulli(2, 0.4, 0.02, 3000, 2000)
    assert first_alarm(ADWIN(direction="increase"), stream) is None
    assert first_alarm(ADWIN(direction="decrease"), stream) is not None


def test_cooldown_suppresses_repeated_alarms():
    stream = bernoulli(1, 0.05, 0.6, 2000, 3000)
    quiet, loud = ADWIN(cooldown=100_000), ADWIN(cooldown=0)
    for x in stream:
        quiet.update(x)
        loud.update(x)
    assert quiet.n_alarms == 1 and quiet.n_suppressed == loud.n_alarms - 1 >= 1


@pytest.mark.parametrize("kwargs", [{"delta": 0}, {"delta": 1.5}, {"clock": 0},
                                    {"direction": "up"}, {"cooldown": -1}])
def test_adwin_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        ADWIN(**kwargs)


# ------------------------------------------------------------------------ Page-Hinkley
def test_page_hinkley_hand_worked():
    # constant 0 then constant 1: after the jump at t (n = t + 1 samples), the mean is
    # (k)/(t + k) after k ones; the statistic grows by about 1 - delta per sample.
    d = PageHinkley(delta=0.0, threshold=5.0, min_instances=1, alpha=1.0)
    stream = [0.0] * 100 + [1.0] * 50
    i = first_alarm(d, stream)
    # U_k = sum_{j<=k} (1 - j/(100+j)) exceeds 5 at k = 6 (5.77 > 5; k = 5 gives 4.86)
    terms = [1 - j / (100 + j) for j in range(1, 10)]
    k = int(np.argmax(np.cumsum(terms) > 5.0)) + 1
    assert i == 100 + k - 1


def test_page_hinkley_clip_and_stable_stream():
    rng = np.random.default_rng(0)
    losses = np.where(rng.random(20_000) < 0.05, 30.0, 0.05)   # rare confident errors
    assert first_alarm(PageHinkley(delta=0.05, threshold=100, clip=4.6, alpha=1.0), losses) is None
    worse = np.concatenate([losses[:5000], np.where(rng.random(3000) < 0.3, 30.0, 0.05)])
    i = first_alarm(PageHinkley(delta=0.05, threshold=100, clip=4.6, alpha=1.0), worse)
    assert i is not None and 5000 <= i < 5300


# ------------------------------------------------------------------------- prior shift
def test_g_statistic_matches_scipy():
    recent, reference = np.array([30.0, 70.0, 5.0]), np.array([50.0, 900.0, 40.0])
    expected = chi2_contingency(np.vstack([recent, reference]), correction=False,
                                lambda_="log-likelihood")[0]
    assert g_statistic(recent, reference) == pytest.approx(expected, rel=1e-12)


def test_js_divergence_closed_form():
    p, q = np.array([0.2, 0.8]), np.array([0.5, 0.5])
    m = (p + q) / 2
    expected = 0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m))
    assert js_divergence(p, q) == pytest.approx(expected)


@pytest.mark.parametrize("seed", range(3))
def test_prior_shift_detects_share_jump(seed):
    rng = np.random.default_rng(seed)
    labels = np.where(np.concatenate([rng.random(3000) < 0.15, rng.random(1000) < 0.5]),
                      "spam", "ham")
    d = PriorShift()
    i = first_alarm(d, labels.tolist())
    assert i is not None and 3000 <= i < 3150
    assert d.last_change["recent_shares"]["spam"] > 0.3
    assert abs(d.last_change["reference_shares"]["spam"] - 0.15) < 0.05


def test_prior_shift_quiet_on_stable_three_classes():
    rng = np.random.default_rng(9)
    labels = rng.choice(["a", "b", "c"], p=[0.7, 0.2, 0.1], size=20_000).tolist()
    d = PriorShift()
    assert first_alarm(d, labels) is None
    assert d.divergence < 0.05
    assert d.state()["shares"]["a"] == pytest.approx(labels.count("a") / len(labels), abs=1e-9)


def test_prior_shift_new_class_is_a_shift():
    labels = ["a", "b"] * 1000 + ["c"] * 100
    i = first_alarm(PriorShift(), labels)
    assert i is not None and 2000 <= i < 2040


# ---------------------------------------------------------------------- gaussian drift
def test_moments_match_numpy_and_minus_inverts_merge():
    rng = np.random.default_rng(1)
    a, b = rng.normal(1, 2, (40, 3)), rng.normal(-1, 1, (25, 3))
    ma, mb = Moments(), Moments()
    for x in a:
        ma.add(x)
    for x in b:
        mb.add(x)
    whole = Moments(ma.n, ma.mean.copy(), ma.m2.copy())
    whole.merge(mb)
    both = np.vstack([a, b])
    np.testing.assert_allclose(whole.mean, both.mean(axis=0))
    np.testing.assert_allclose(whole.var, both.var(axis=0))
    rest = whole.minus(ma)
    assert rest.n == 25
    np.testing.assert_allclose(rest.mean, b.mean(axis=0))
    np.testing.assert_allclose(rest.var, b.var(axis=0), rtol=1e-9)


def test_j_divergence_is_sum_of_both_kls():
    m1, v1, m2, v2 = np.array([0.0, 1.0]), np.array([1.0, 2.0]), np.array([0.5, 1.0]), np.array([3.0, 2.0])

    def kl(ma, va, mb, vb):   # KL(N(ma, va) || N(mb, vb)) per feature
        return 0.5 * (np.log(vb / va) + (va + (ma - mb) ** 2) / vb - 1)

    expected = np.sum(kl(m1, v1, m2, v2) + kl(m2, v2, m1, v1))
    assert j_divergence(m1, v1, m2, v2) == pytest.approx(expected)


@pytest.mark.parametrize("seed", range(3))
def test_gaussian_drift_detects_one_sd_mean_shift(seed):
    rng = np.random.default_rng(seed)
    xs = np.concatenate([rng.normal(0, 1, (2000, 3)), rng.normal([0, 1, 0], 1, (500, 3))])
    d = GaussianDrift()
    i = first_alarm(d, list(xs), "c")
    assert i is not None and 2000 <= i < 2100
    assert d.last_change["feature"] == 1 and d.last_change["moved"] == "mean"


def test_gaussian_drift_detects_variance_change_and_is_quiet_when_stable():
    rng = np.random.default_rng(4)
    stable = rng.normal(0, 1, (20_000, 2))
    assert first_alarm(GaussianDrift(), list(stable), 0) is None
    wider = np.concatenate([stable[:2000], rng.normal(0, 3, (500, 2))])
    d = GaussianDrift()
    i = first_alarm(d, list(wider), 0)
    assert i is not None and 2000 <= i < 2100 and d.last_change["moved"] == "variance"


def test_gaussian_drift_classes_are_separate():
    rng = np.random.default_rng(2)
    d = GaussianDrift()
    for i in range(3000):   # two classes with different but stable distributions
        label = "a" if i % 3 else "b"
        assert not d.update(rng.normal(0 if label == "a" else 5, 1, 2), label)


# ------------------------------------------------------------------------- token drift
def test_token_drift_ignores_the_learning_fall_and_catches_a_rise():
    rng = np.random.default_rng(0)
    learning = np.clip(np.exp(-np.arange(3000) / 300) + rng.uniform(0, 0.05, 3000), 0, 1)
    d = TokenDrift(warmup=500)
    assert first_alarm(d, learning.tolist()) is None
    rise = rng.uniform(0.3, 0.6, 500)
    i = first_alarm(d, rise.tolist())
    assert i is not None and i < 150
    assert d.last_change["new_rate"] > d.last_change["old_rate"]


def test_update_many_matches_update_one_at_a_time():
    """Bulk updates (as the observer does per batch): the same alarms, changes and state."""
    import random

    from streamnb.drift import ADWIN, PageHinkley, PriorShift, TokenDrift

    rng = random.Random(7)
    errors = [float(rng.random() < (0.05 if i < 3000 else 0.5)) for i in range(4000)]
    losses = [rng.expovariate(5.0 if i < 3000 else 0.5) for i in range(4000)]
    shares = [rng.uniform(0.0, 0.1 if i < 3000 else 0.6) for i in range(4000)]
    labels = ["spam" if rng.random() < (0.05 if i < 3000 else 0.5) else "ham" for i in range(4000)]
    cases = [(lambda: ADWIN(direction="increase", cooldown=0), errors),
             (lambda: PageHinkley(delta=0.05, threshold=20.0, clip=4.6, alpha=1.0), losses),
             (lambda: PageHinkley(delta=0.01, threshold=5.0, mode="both", alpha=0.999), losses),
             (lambda: TokenDrift(warmup=500, cooldown=0), shares), (PriorShift, labels)]
    for make, values in cases:
        one, many = make(), make()
        expected = []
        for i, v in enumerate(values):
            if one.update(v):
                expected.append((i, one.last_change, one.n_seen))
        got = []
        for start in range(0, len(values), 97):  # batches, as the worker's
            seen = many.n_seen
            got += [(start + i, c, seen + i + 1) for i, c in many.update_many(values[start:start + 97])]
        assert expected, f"{type(one).__name__}: the stream should alarm"
        assert got == expected
        assert one.state() == many.state()
        assert one.drift_detected == many.drift_detected


# ------------------------------------------------ bulk updates: bit-identical to update()
def assert_same(a, b, path: str = "state") -> None:
    """a and b are identical: floats bit for bit (NaN included), arrays by dtype, shape and
    bytes, containers in order, detectors (and the ADWIN inside TokenDrift) by vars()."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a!r} != {b!r}"
        assert a.tobytes() == b.tobytes(), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, DriftDetector):
        assert_same(vars(a), vars(b), path)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def replay_in_batches(make, values, seed: int, as_array: bool = False) -> list:
    """Feed ``values`` to one detector an update at a time and to another in random batches
    of 1..300 (``update_many``); after every batch the alarms (position and last_change) and
    the whole state must be identical. Returns the per-update detector."""
    rng = random.Random(seed)
    one, many = make(), make()
    start = 0
    while start < len(values):
        batch = values[start:start + rng.randint(1, 300)]
        expected = [(i, one.last_change) for i, v in enumerate(batch) if one.update(v)]
        got = many.update_many(np.asarray(batch) if as_array else iter(batch))
        assert_same(got, expected, f"alarms of the batch at {start}")
        assert_same(many, one, f"state after the batch at {start}")
        start += len(batch)
    return one


def regimes(seed: int, n: int, levels: list[float]) -> list[float]:
    """A level per regime of random length 150..900, cycling through ``levels``."""
    rng = random.Random(seed)
    out: list[float] = []
    while len(out) < n:
        out += [levels[len(out) % len(levels)]] * rng.randint(150, 900)
    return out[:n]


@pytest.mark.parametrize("seed", range(4))
def test_prior_shift_update_many_is_update_bit_for_bit(seed):
    rng = random.Random(seed)
    spam = regimes(seed, 6000, [0.05, 0.45, 0.15, 0.7])
    labels = ["spam" if rng.random() < p else "ham" for p in spam]
    for i in range(2500, 6000):              # new classes first seen mid-stream (mid-batch)
        r = rng.random()
        labels[i] = "virus" if r < 0.03 else "phish" if i > 4000 and r < 0.06 else labels[i]
    cases = [lambda: PriorShift(cooldown=300),
             lambda: PriorShift(windows=(5, 17, 40), check_every=3, min_reference=30, cooldown=40),
             lambda: PriorShift(windows=(8, 24), check_every=1, min_reference=8, cooldown=2000)]
    for make in cases:                       # alarms, and regimes restarted in cool-down
        one = replay_in_batches(make, labels, seed)
        assert one.n_alarms >= 2 and one.labels[2:] == ["virus", "phish"]
        assert sorted(one._thresholds) == [1, 2, 3]
    assert one.n_suppressed >= 1


def test_prior_shift_update_many_new_classes_in_one_batch():
    labels = ["a"] * 250 + ["b", "c", "a", "b", "c", "d"] * 20 + ["a", "d"] * 100
    for size in (1, 7, 64, len(labels)):
        one, many = PriorShift(check_every=2), PriorShift(check_every=2)
        expected = [(i, one.last_change) for i, y in enumerate(labels) if one.update(y)]
        got = []
        for start in range(0, len(labels), size):
            got += [(start + i, c) for i, c in many.update_many(labels[start:start + size])]
        assert expected and one.labels == ["a", "b", "c", "d"]
        assert_same(got, expected)
        assert_same(many, one)


@pytest.mark.parametrize("seed", range(4))
def test_adwin_update_many_is_update_bit_for_bit(seed):
    rng = random.Random(seed)
    p = regimes(seed, 8000, [0.03, 0.3, 0.1, 0.01])
    errors = [float(rng.random() < q) for q in p]
    # not 0/1: x ** 2 (libm pow) and x * x round differently now and then, so the merges
    # must square as update() does
    real = [rng.uniform(0.0, 0.2) + q + rng.gauss(0.0, 0.05) for q in p]
    cases = [(lambda: ADWIN(cooldown=200), errors, True),
             (lambda: ADWIN(direction="increase", cooldown=0), errors, False),
             (lambda: ADWIN(direction="decrease", clock=7, max_buckets=2, cooldown=50), real, True),
             (lambda: ADWIN(clock=1, min_window=2, grace_period=3, cooldown=0), real[:3000], False)]
    for make, values, as_array in cases:
        one = replay_in_batches(make, values, seed, as_array=as_array)
        assert one.n_alarms >= 1


def test_adwin_update_many_is_update_on_small_random_windows():
    """Narrow windows, tiny rows and clocks, outliers and random batch sizes, where the
    edge cases of the cut and of the merges come often: update_many gives the alarms and
    the state of update one value at a time, bit for bit."""
    for seed in range(600):
        rng = random.Random(seed)
        params = dict(clock=rng.randint(1, 3), min_window=rng.randint(1, 3), max_buckets=rng.randint(2, 3),
                      grace_period=rng.randint(1, 6), delta=rng.choice([0.002, 0.05, 0.3]), cooldown=0,
                      direction=rng.choice(["both", "increase", "decrease"]))
        one, many = ADWIN(**params), ADWIN(**params)
        p = rng.random()
        values = [float(rng.random() < (p if i < 60 else 1 - p)) if seed % 2 else
                  rng.uniform(0, 1 if i < 60 else 40) * (1 if rng.random() < 0.9 else 30)
                  for i in range(160)]
        expected = [(i, one.last_change) for i, v in enumerate(values) if one.update(v)]
        got, start = [], 0
        while start < len(values):
            size = rng.randint(1, 20)
            got += [(start + i, change) for i, change in many.update_many(values[start:start + size])]
            start += size
        assert_same(got, expected, f"seed {seed}")
        assert_same(many, one, f"seed {seed}")


@pytest.mark.parametrize("seed", range(4))
def test_page_hinkley_update_many_is_update_bit_for_bit(seed):
    rng = random.Random(seed)
    scale = regimes(seed, 6000, [5.0, 0.6, 2.0, 0.4])
    losses = [min(rng.expovariate(s), 30.0) for s in scale]
    with_nan = [x if rng.random() > 0.002 else math.nan for x in losses]
    cases = [(lambda: PageHinkley(delta=0.05, threshold=20.0, clip=4.6, alpha=1.0), losses),
             (lambda: PageHinkley(delta=0.01, threshold=8.0, mode="both", cooldown=100), losses),
             (lambda: PageHinkley(threshold=5.0, mode="down", alpha=0.99, cooldown=0), losses),
             (lambda: PageHinkley(threshold=10.0, clip=3, min_instances=5, cooldown=0), with_nan)]
    for make, values in cases:
        one = replay_in_batches(make, values, seed, as_array=True)
        assert one.n_alarms >= 1


@pytest.mark.parametrize("seed", range(3))
def test_token_drift_update_many_is_update_bit_for_bit(seed):
    rng = random.Random(seed)
    top = regimes(seed, 6000, [0.1, 0.3, 0.05, 0.6])
    shares = [rng.uniform(0.0, t) for t in top]
    for make in (lambda: TokenDrift(warmup=500, cooldown=150), lambda: TokenDrift(clock=5, cooldown=0)):
        one = replay_in_batches(make, shares, seed)
        assert one.n_alarms >= 1


@pytest.mark.parametrize("seed", range(2))
def test_update_many_with_a_whole_stream_at_once(seed):
    """One call far longer than PriorShift's 1,024-label blocks and ADWIN's clock."""
    rng = random.Random(seed)
    level = regimes(seed, 5000, [0.05, 0.5, 0.2])
    labels = ["spam" if rng.random() < q else "ham" if rng.random() < 0.97 else "x" for q in level]
    for make, values in [(lambda: PriorShift(cooldown=200), labels),
                         (lambda: ADWIN(cooldown=0), [float(rng.random() < q) for q in level]),
                         (lambda: PageHinkley(threshold=10.0, mode="both"), level),
                         (lambda: TokenDrift(warmup=300, cooldown=0), [q * rng.random() for q in level])]:
        one, many = make(), make()
        expected = [(i, one.last_change) for i, v in enumerate(values) if one.update(v)]
        assert len(expected) >= 2
        assert_same(many.update_many(values), expected)
        assert_same(many, one)


def test_update_many_on_no_values_changes_nothing():
    for det, values in [(ADWIN(cooldown=0), [0.0] * 1000 + [1.0] * 1000),
                        (PageHinkley(threshold=5.0), [0.0] * 100 + [1.0] * 20),
                        (PriorShift(), ["a"] * 300 + ["b"] * 40),
                        (TokenDrift(warmup=10), [0.0] * 1000 + [1.0] * 200)]:
        while not det.update(values[det.n_seen % len(values)]):
            pass
        before = copy.deepcopy(vars(det))
        assert det.update_many([]) == [] and det.drift_detected
        assert_same(vars(det), before)


def test_chi2_quantiles_equal_scipy_stats_bit_for_bit():
    """The drift tests' thresholds come from scipy.special (streamnb/drift/quantiles.py),
    so that workers need not import scipy.stats: the same floats as scipy.stats.chi2."""
    from scipy.stats import chi2

    from streamnb.drift.quantiles import chi2_isf, chi2_ppf

    rng = np.random.default_rng(7)
    for _ in range(2000):
        df = float(rng.uniform(1.0, 500.0)) if rng.random() < 0.5 else int(rng.integers(1, 60))
        q = float(10 ** rng.uniform(-12, -0.01))
        assert chi2_isf(q, df) == float(chi2.isf(q, df))
        assert chi2_ppf(q, df) == float(chi2.ppf(q, df))


def test_a_worker_imports_neither_scipy_stats_nor_scipy_optimize():
    """Half a second and tens of MB per worker process (docs/performance.md)."""
    import subprocess
    import sys

    code = ("import sys, streamnb_workers.worker, streamnb_workers.cli.main, streamnb_workers.observe.observer; "
            "print(sorted(m for m in ('scipy.stats', 'scipy.optimize') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
