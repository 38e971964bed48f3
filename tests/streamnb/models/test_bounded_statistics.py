"""No sequence of entries the daemon accepts makes a statistic non-finite.

The wire bounds a message's ``weight`` (``Limits.max_weight``, 1e6) and the magnitude of
its values (``Limits.max_value``, 1e100; docs/protocol.md). Within them, any sequence of
learnt batches, decays and forgets leaves every statistic of every model kind finite, and
the model encodes and loads back (a snapshot stays loadable). The weights drawn go up to
the bound times an error weight of 1000 (the default is 2); count values up to the bound
times the 100,000 features of one entry hashed into one bucket.
"""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamnb.models import make_model
from streamnb.models.io import dumps, loads
from streamnb_workers.wire.codec import DEFAULT_MAX_VALUE, DEFAULT_MAX_WEIGHT

KINDS = ("multinomial", "bernoulli", "categorical", "gaussian", "lda", "qda", "hybrid")
MAX_EFFECTIVE_WEIGHT = DEFAULT_MAX_WEIGHT * 1000.0
MAX_COUNT = DEFAULT_MAX_VALUE * 100_000

_weights = st.one_of(
    st.sampled_from([5e-324, 1e-300, 1.0, DEFAULT_MAX_WEIGHT, MAX_EFFECTIVE_WEIGHT]),
    st.floats(min_value=0.0, max_value=MAX_EFFECTIVE_WEIGHT, exclude_min=True))
_counts = st.one_of(st.sampled_from([0.0, 1.0, 8.4e6, DEFAULT_MAX_VALUE, MAX_COUNT]),
                    st.floats(min_value=0.0, max_value=MAX_COUNT))
_reals = st.one_of(st.sampled_from([0.0, DEFAULT_MAX_VALUE, -DEFAULT_MAX_VALUE, 1e-300]),
                   st.floats(min_value=-DEFAULT_MAX_VALUE, max_value=DEFAULT_MAX_VALUE))
_decays = st.one_of(st.sampled_from([0.5 ** (1 / 20), 0.5, 1e-300, 1.0]),
                    st.floats(min_value=1e-3, max_value=1.0))


def _row(kind: str, d: int) -> st.SearchStrategy:
    if kind == "categorical":
        return st.lists(st.integers(0, 5).map(float), min_size=d, max_size=d)
    if kind in ("multinomial", "bernoulli"):
        return st.lists(_counts, min_size=d, max_size=d)
    if kind == "hybrid":  # counts, then one meta feature
        return st.tuples(st.lists(_counts, min_size=d - 1, max_size=d - 1), _reals).map(
            lambda t: [*t[0], t[1]])
    return st.lists(_reals, min_size=d, max_size=d)


@st.composite
def _histories(draw):
    kind = draw(st.sampled_from(KINDS))
    d = draw(st.integers(2, 3))
    ops = []
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["learn", "learn", "decay", "forget"]))
        if op == "learn":
            n = draw(st.integers(1, 4))
            X = np.array(draw(st.lists(_row(kind, d), min_size=n, max_size=n)))
            y = draw(st.lists(st.sampled_from(["ham", "spam"]), min_size=n, max_size=n))
            w = np.array(draw(st.lists(_weights, min_size=n, max_size=n)))
            ops.append(("learn", (X, y, w)))
        elif op == "decay":
            ops.append(("decay", draw(_decays)))
        else:
            ops.append(("forget", draw(st.integers(0, 7))))
    return kind, ops


def _arrays(model):
    for part in model.stats.parts.values():
        for value in vars(part).values():
            if isinstance(value, np.ndarray):
                yield value
            elif isinstance(value, list):
                yield from (v for v in value if isinstance(v, np.ndarray))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_histories())
def test_no_history_of_bounded_entries_makes_a_statistic_non_finite(history):
    kind, ops = history
    model = make_model(kind, **({"n_meta": 1} if kind == "hybrid" else {}))
    learnt: list[tuple] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (what is kept is checked: intermediate steps of
        # a clipped forget may overflow in a class it empties)
        for op, arg in ops:
            if op == "learn":
                model.partial_fit(*arg[:2], sample_weight=arg[2])
                learnt.append(arg)
            elif op == "decay":
                model.decay(arg)
            elif learnt:  # forget one learnt batch, clipped as a worker's correction is
                X, y, w = learnt.pop(arg % len(learnt))
                model.subtract_stats(model.batch_stats(X, y, w), clip=True)
            for a in _arrays(model):
                assert np.isfinite(a).all(), (kind, ops)
            data = dumps(model)
            assert dumps(loads(data)) == data  # a snapshot of it loads, whole
