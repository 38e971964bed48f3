"""``streamnb._kernels.multinomial_jll`` bit for bit against a plain Python loop over the
rows in order (math.log, the same libm log): its kept tables (the column table cleared
after each call, the logs of whole counts kept with their alpha) must give the bits of
taking every log afresh, whatever came before (another alpha, another batch)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from streamnb.models import prequential

JLL = prequential.MULTINOMIAL_JLL
pytestmark = pytest.mark.skipif(JLL is None, reason="streamnb._kernels is not built")


def loop_jll(X, codes, w, counts, totals, alpha, seen_mode, n_seen, m_fixed):
    """The C loop's definition (streamnb/_kernels.c, 1.), one log per use."""
    k0, n_features = counts.shape
    K = totals.size
    base = lambda k, j: float(counts[k, j]) if k < k0 and j < n_features else 0.0  # noqa: E731
    added: dict[tuple[int, int], float] = {}
    adder: set[int] = set()
    T = [float(t) for t in totals]
    out = np.empty((X.shape[0], K))
    unseen = np.empty(X.shape[0], dtype=np.int64)
    new_before = 0
    for i in range(X.shape[0]):
        lo, hi = X.indptr[i], X.indptr[i + 1]
        S0, S1, row_sum, new = 0.0, [0.0] * K, 0.0, 0
        for p in range(lo, hi):
            j, x = int(X.indices[p]), float(X.data[p])
            row_sum += x
            model_seen = any(base(k, j) != 0.0 for k in range(K))
            new += not model_seen
            if seen_mode and not (model_seen or j in adder):
                continue
            S0 += x
            for k in range(K):
                S1[k] += x * math.log(base(k, j) + added.get((k, j), 0.0) + alpha)
        unseen[i] = new
        m = float(n_seen + new_before if seen_mode else m_fixed)
        for k in range(K):
            den = T[k] + alpha * m
            out[i, k] = S1[k] - S0 * (math.log(den) if den > 0 else 0.0)
        c = int(codes[i])
        if c < 0:
            continue
        T[c] += row_sum * float(w[i])
        for p in range(lo, hi):
            j, a = int(X.indices[p]), float(w[i]) * float(X.data[p])
            added[c, j] = added.get((c, j), 0.0) + a
            if a > 0 and j not in adder:
                if seen_mode and not any(base(k, j) != 0.0 for k in range(K)):
                    new_before += 1
                adder.add(j)
    return out, unseen


def c_jll(X, codes, w, counts, totals, alpha, seen_mode, n_seen, m_fixed):
    out = np.empty((X.shape[0], totals.size))
    unseen = np.empty(X.shape[0], dtype=np.int64)
    JLL(X.indptr, X.indices, X.data, codes, w, np.ascontiguousarray(counts), counts.shape[0],
        counts.shape[1], totals, alpha, seen_mode, n_seen, m_fixed, out, unseen)
    return out, unseen


@pytest.mark.parametrize("K", [2, 3])
def test_c_loop_gives_the_bits_of_fresh_logs_whatever_came_before(K):
    rng = np.random.default_rng(7)
    for trial in range(24):
        n, width = int(rng.integers(1, 25)), int(rng.choice([8, 60]))
        X = sp.random(n, width, density=0.3, format="csr", random_state=trial,
                      data_rvs=lambda s: rng.choice([1.0, 2.0, 0.5], size=s))
        X.sum_duplicates()
        k0 = K - int(rng.integers(0, 2))  # (a class new in the batch)
        # whole counts about the kept table's end (8192), fractional ones, zeros
        counts = rng.choice([0.0, 1.0, 3.0, 8190.0, 8191.0, 8192.0, 1e6, 2.5], size=(k0, width - 3))
        totals = np.zeros(K)
        totals[:k0] = counts.sum(axis=1)
        codes = rng.integers(-1, K, size=n).astype(np.int64)
        w = rng.choice([1.0, 2.0, 0.3], size=n)
        alpha = float(rng.choice([1.0, 0.1, 0.5]))  # (alternating: the kept logs' alpha)
        seen = bool(trial % 2)
        n_seen = int(np.count_nonzero(counts.any(axis=0)))
        args = (X, codes, w, counts, totals, alpha, seen, n_seen, width)
        got, got_unseen = c_jll(*args)
        want, want_unseen = loop_jll(*args)
        assert np.array_equal(got.view(np.int64), want.view(np.int64)), trial  # bit for bit
        assert np.array_equal(got_unseen, want_unseen)


def test_a_refused_batch_leaves_the_column_table_clear():
    counts = np.array([[1.0, 0.0, 2.0, 5.0], [0.0, 3.0, 1.0, 1.0]])
    totals = counts.sum(axis=1)
    good = sp.csr_matrix(np.array([[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]]))
    bad = sp.csr_matrix((np.ones(3), np.array([0, 2, -1]), np.array([0, 3])), shape=(1, 4))
    codes, w = np.array([0, -1]), np.ones(2)
    with pytest.raises(ValueError, match="column"):
        c_jll(bad, codes[:1], w[:1], counts, totals, 1.0, False, 4, 4)
    args = (good, codes, w, counts, totals, 1.0, False, 4, 4)
    assert np.array_equal(c_jll(*args)[0], loop_jll(*args)[0])
