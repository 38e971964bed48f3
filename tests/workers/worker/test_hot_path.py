"""The worker's faster hot-path helpers give exactly what the straightforward code gives."""

from __future__ import annotations

import hashlib
import random

import msgpack
import numpy as np
import pytest
import scipy.sparse as sp

from streamnb.exceptions import MalformedMessage
from streamnb.features.featurizer import Featurizer
from streamnb.features.hashing import HASH_KEY, TokenHasher, token_hash64
from streamnb.features.rows import Row
from streamnb.stats.feature_counts import _class_sums
from streamnb_workers.wire.codec import decode_input


def _words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice("abcdefé") for _ in range(rng.randint(1, 6))) for _ in range(n)]


def test_token_hash_is_keyed_blake2b_little_endian():
    for tok in ["viagra", "é", "", "a" * 100]:
        d = hashlib.blake2b(tok.encode("utf-8"), digest_size=8, key=HASH_KEY).digest()
        assert token_hash64(tok) == int.from_bytes(d, "little")
        assert token_hash64(tok) == token_hash64(tok)  # cached path


@pytest.mark.parametrize("bits", [3, 8, 20])
def test_hash_unique_equals_buckets_of_hash_counts(bits):
    rng = random.Random(bits)
    h = TokenHasher(bits)
    for _ in range(50):
        toks = _words(rng, rng.randint(0, 60))
        idx, _ = h.hash_counts(toks)
        expected = np.array(sorted({token_hash64(t) % (1 << bits) for t in toks}), dtype=np.int32)
        assert np.array_equal(h.hash_unique(toks), expected)
        assert np.array_equal(idx, expected)


def test_binary_featurize_matches_counted_buckets_with_ones():
    rng = random.Random(1)
    f = Featurizer(bits=6)  # counts="binary", collisions frequent at 64 buckets
    for _ in range(30):
        toks = _words(rng, rng.randint(1, 80))
        msg = decode_input(msgpack.packb({"tokens": toks}), "1-0")
        row = f.featurize(msg.as_payload())
        idx, _ = f.hasher.hash_counts(toks)
        assert np.array_equal(row.indices, idx) and np.array_equal(row.values, np.ones(idx.size))
        assert row.n_tokens == len(toks)


def test_tokens_must_all_be_str():

    with pytest.raises(MalformedMessage, match="tokens must be a list of str"):
        decode_input(msgpack.packb({"tokens": ["a", 3]}), "1-0")
    assert decode_input(msgpack.packb({"tokens": []}), "1-0").payload == []


def test_stack_equals_vstack_of_rows():
    rng = np.random.default_rng(0)
    f = Featurizer(bits=8)
    rows = []
    for k in range(20):
        idx = np.sort(rng.choice(256, size=k % 7, replace=False)).astype(np.int32)
        rows.append(Row(indices=idx, values=rng.random(idx.size) + 0.5, n_tokens=idx.size))
    X = f.stack(rows)
    dense = np.zeros((20, 256))
    for i, r in enumerate(rows):
        dense[i, r.indices] = r.values
    assert X.shape == (20, 256) and np.array_equal(X.toarray(), dense)
    with pytest.raises(ValueError, match="out of range"):
        f.stack([Row(indices=np.array([300], dtype=np.int32), values=np.ones(1))])


def test_class_sums_match_dense_onehot_product():
    rng = np.random.default_rng(3)
    X = sp.random(40, 500, density=0.05, format="csr", random_state=4)
    rows = rng.integers(0, 3, size=40)
    w = rng.random(40) + 0.1
    cols, sums = _class_sums(X, rows, w, 3)
    dense = X.toarray()
    onehot = np.zeros((3, 40))
    onehot[rows, np.arange(40)] = w
    full = onehot @ dense
    assert np.array_equal(cols, np.flatnonzero(dense.any(axis=0)))
    np.testing.assert_allclose(sums, full[:, cols], rtol=1e-12)


# ----------------------------------------------------------- count-model helpers
def test_array_helpers_equal_the_numpy_reference():
    from streamnb.arrays import (
        nonzero_columns,
        put_rows,
        sort_with_order,
        sorted_unique,
        unique_inverse,
    )

    rng = np.random.default_rng(11)
    for size, bound in ((0, 5), (1, 1), (50, 3), (5000, 2**20), (20000, 70000)):
        keys = rng.integers(0, bound, size=size).astype(np.int32)
        order = np.argsort(keys, kind="stable")
        got_keys, got_order = sort_with_order(keys, bound)
        assert np.array_equal(got_order, order) and np.array_equal(got_keys, keys[order])
        got_unique, got_inverse = unique_inverse(keys, bound)
        ref_unique, ref_inverse = np.unique(keys, return_inverse=True)
        assert np.array_equal(got_unique, ref_unique) and np.array_equal(got_inverse, ref_inverse)
        for runs in (False, True):  # (any input: runs only makes sorted pieces cheaper)
            assert np.array_equal(sorted_unique(keys, runs=runs), np.unique(keys))
        pieces = np.concatenate([np.sort(keys[: size // 2]), np.sort(keys[size // 2 :])])
        assert np.array_equal(sorted_unique(pieces, runs=True), np.unique(keys))
    # too wide for the packed sort: numpy's stable argsort, same answer
    wide = np.array([2**40, 3, 2**40, 0], dtype=np.int64)
    assert sort_with_order(wide, 2**41)[1].tolist() == [3, 1, 0, 2]
    values = rng.poisson(0.3, size=(3, 400)).astype(float)
    for block in (values, values[:, rng.permutation(400)], np.asfortranarray(values), values[:0]):
        assert np.array_equal(nonzero_columns(block), block.any(axis=0))
    table = rng.random((300, 3))
    expect = table.copy()
    index = rng.choice(300, size=120, replace=False)
    rows = rng.random((120, 3))
    expect[index] = rows
    put_rows(table, index, np.asfortranarray(rows))
    assert np.array_equal(table, expect)


def _class_sums_reference(X: sp.csr_matrix, rows: np.ndarray, w: np.ndarray, k: int):
    """The previous implementation: np.unique with the inverse, then one bincount."""
    cols, pos = np.unique(X.indices, return_inverse=True)
    per_row = np.diff(X.indptr)
    cell = np.repeat(rows.astype(np.int64) * cols.size, per_row) + pos.ravel()
    weighted = np.repeat(w, per_row) * X.data
    return cols.astype(np.int64), np.bincount(cell, weights=weighted,
                                              minlength=k * cols.size).reshape(k, cols.size)


@pytest.mark.parametrize("weighted", [False, True])
def test_class_sums_bit_identical_to_the_previous_implementation(weighted):
    """Deltas must not change bits between versions (replicas apply what writers built)."""
    rng = np.random.default_rng(12)
    cols = [np.sort(rng.choice(2**20, size=180, replace=False)) for _ in range(100)]
    X = sp.csr_matrix((rng.integers(1, 4, size=18000) * 0.37, np.concatenate(cols),
                       np.arange(0, 18001, 180)), shape=(100, 2**20))
    rows = rng.integers(0, 2, size=100)
    w = rng.random(100) + 0.1 if weighted else np.ones(100)
    cols, sums = _class_sums(X, rows, w, 2)
    ref_cols, ref_sums = _class_sums_reference(X, rows, w, 2)
    assert np.array_equal(cols, ref_cols)
    assert np.array_equal(sums, ref_sums)  # exactly, not approximately


def _table_reference(model) -> np.ndarray:
    """The multinomial scoring table derived from scratch over every column, the way it
    was before the lazy derivation: log(F + alpha), 0 rows for unseen columns ("seen")."""
    F = model.stats["features"].values
    table = np.empty((F.shape[1], F.shape[0] + 1))
    table[:, :-1] = np.log(F.T + model.alpha)
    if model.smoothing_m == "seen":
        seen = F.any(axis=0)
        table[~seen] = 0.0
        table[:, -1] = seen
    else:
        table[:, -1] = 1.0
    return table


@pytest.mark.parametrize("smoothing_m", ["seen", "columns"])
def test_multinomial_table_derived_lazily_equals_full_derivation(smoothing_m):
    from streamnb.models.multinomial import MultinomialNB

    rng = np.random.default_rng(13)
    d = 3000
    X = sp.random(300, d, density=0.01, format="csr", random_state=6)
    X.data = np.ceil(X.data * 3)
    y = ["spam" if v else "ham" for v in rng.random(300) < 0.4]
    model = MultinomialNB(alpha=0.3, n_features=d, smoothing_m=smoothing_m)
    steps = [lambda: model.partial_fit(X[:100], y[:100]),
             lambda: model.partial_fit(X[100:150], y[100:150]),
             lambda: model.merge_stats(model.batch_stats(X[150:200], y[150:200])),
             lambda: model.unlearn(X[100:150], y[100:150]),  # columns back to unseen
             lambda: model.decay(0.5),                        # a full refresh, table reused
             lambda: model.partial_fit(X[200:], y[200:], classes=["spam", "ham", "eggs"])]
    for step in steps:
        step()
        got = model._scoring_table()
        np.testing.assert_allclose(got, _table_reference(model), rtol=1e-15, atol=0)
        assert got.flags.c_contiguous


def test_label_fast_paths_equal_the_per_label_rules():
    from streamnb.stats.base import ClassIndex, normalize_label, normalize_labels

    cases = [["spam", "ham"], [3, 1, 3], [], [np.str_("a"), "b"], [np.int64(2), 1],
             np.array(["x", "y"]), (v for v in ["g", "g"])]
    for labels in cases:
        labels = list(labels)
        got = normalize_labels(labels)
        assert got == [normalize_label(v) for v in labels]
        assert [type(v) for v in got] == [str if isinstance(v, str) else int for v in labels]
    for bad, message in (([True, 1], "bool"), (["a", 1], "mixed"), ([1.5], "float"),
                         ([None], "NoneType")):
        with pytest.raises(ValueError, match=message):
            normalize_labels(bad)
    idx = ClassIndex(["b"])
    assert idx.add(["a", "b", "c", "a"]).tolist() == [1]  # b moved to row 1
    assert idx.rows_for(["a", "b", "c", "a"]).tolist() == [0, 1, 2, 0]
    assert idx.labels == ["a", "b", "c"] and idx.add(["c"]) is None
    with pytest.raises(KeyError):
        idx.rows_for(["a", "z"])
    assert idx.labels == ["a", "b", "c"] and idx.rows_for([]).tolist() == []
