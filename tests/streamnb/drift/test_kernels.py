"""The drift detectors' C loops (streamnb._kernels: ``adwin_sums``, ``adwin_insert``,
``adwin_find_cut``, ``page_hinkley_run``) against the pure-Python detectors updated one value at a time: the
same alarms and the same state, bit for bit, on random streams in random batches."""

from __future__ import annotations

import copy
import math
import random

import pytest

import streamnb.drift.adwin as adwin
import streamnb.drift.page_hinkley as page_hinkley
from streamnb.drift import ADWIN, PageHinkley, TokenDrift
from tests.streamnb.drift.test_drift import assert_same, regimes

KERNELS = {(adwin, "ADWIN_SUMS"), (adwin, "ADWIN_INSERT"), (adwin, "ADWIN_FIND_CUT"),
           (page_hinkley, "PAGE_HINKLEY_RUN")}
pytestmark = pytest.mark.skipif(
    any(getattr(module, name) is None for module, name in KERNELS),
    reason="streamnb._kernels not built or turned off")


def pure_python_replay(make, values, sizes, monkeypatch) -> list:
    """Per batch of ``sizes``: the alarms and a copy of the state of a detector updated one
    value at a time with every C loop off."""
    with monkeypatch.context() as m:
        for module, name in KERNELS:
            m.setattr(module, name, None)
        one, out, start = make(), [], 0
        for size in sizes:
            batch = values[start:start + size]
            alarms = [(start + i, one.last_change) for i, v in enumerate(batch) if one.update(v)]
            out.append((alarms, copy.deepcopy(one)))
            start += size
    return out


def random_sizes(rng: random.Random, n: int) -> list[int]:
    sizes: list[int] = []
    while sum(sizes) < n:
        sizes.append(rng.choice([1, 2, 31, 32, 33, rng.randint(1, 300)]))
    return sizes


def streams(seed: int) -> list[tuple[object, list[float]]]:
    rng = random.Random(seed)
    level = regimes(seed, 5000, [0.03, 0.3, 0.1, 0.6])
    errors = [float(rng.random() < q) for q in level]
    real = [rng.uniform(0.0, 0.2) + q + rng.gauss(0.0, 0.05) for q in level]
    losses = [min(rng.expovariate(1.0 / (0.2 + q)), 30.0) for q in level]
    with_nan = [x if rng.random() > 0.002 else math.nan for x in losses]
    return [
        (lambda: ADWIN(cooldown=200), errors),
        (lambda: ADWIN(direction="increase", cooldown=0), real),
        (lambda: ADWIN(direction="decrease", clock=7, max_buckets=2, cooldown=50), real),
        (lambda: ADWIN(clock=1, min_window=2, grace_period=3, cooldown=0), real[:2000]),
        (lambda: TokenDrift(warmup=300, cooldown=100), [q * rng.random() for q in level]),
        (lambda: PageHinkley(delta=0.05, threshold=20.0, clip=4.6, alpha=1.0), losses),
        (lambda: PageHinkley(delta=0.01, threshold=8.0, mode="both", cooldown=100), losses),
        (lambda: PageHinkley(threshold=5.0, mode="down", alpha=0.99, cooldown=0), real),
        (lambda: PageHinkley(threshold=10.0, clip=3, min_instances=5, cooldown=0), with_nan),
    ]


@pytest.mark.parametrize("seed", range(3))
def test_c_loops_give_the_pure_python_updates_bit_for_bit(seed, monkeypatch):
    rng = random.Random(100 + seed)
    for make, values in streams(seed):
        sizes = random_sizes(rng, len(values))
        expected = pure_python_replay(make, values, sizes, monkeypatch)
        many, start, alarms = make(), 0, 0
        for size, (want, state) in zip(sizes, expected, strict=True):
            got = [(start + i, c) for i, c in many.update_many(values[start:start + size])]
            assert_same(got, want, f"{many.name}: alarms of the batch at {start}")
            assert_same(many, state, f"{many.name}: state after the batch at {start}")
            start += size
            alarms += len(got)
        assert alarms >= 1, many.name
