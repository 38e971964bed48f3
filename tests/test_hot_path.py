"""The worker's faster hot-path helpers give exactly what the straightforward code gives."""

from __future__ import annotations

import hashlib
import random

import msgpack
import numpy as np
import pytest
import scipy.sparse as sp

from streamnb.codec import decode_input
from streamnb.constants import HASH_KEY
from streamnb.exceptions import MalformedMessage
from streamnb.features.featurizer import Featurizer, Row
from streamnb.features.hashing import TokenHasher, token_hash64
from streamnb.stats.feature_counts import _class_sums


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
        row = f.featurize(msg)
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


def test_oov_share_per_message_by_hand():
    from types import SimpleNamespace

    from streamnb.models.io import make_model
    from workers.worker import Worker

    model = make_model("multinomial", n_features=16)
    X = sp.csr_matrix((np.ones(3), np.array([1, 2, 3]), np.array([0, 2, 3])), shape=(2, 16))
    model.partial_fit(X, ["a", "b"])  # seen columns: 1, 2, 3

    def item(cols: list[int]) -> SimpleNamespace:
        idx = np.array(cols, dtype=np.int32)
        return SimpleNamespace(row=Row(indices=idx, values=np.ones(idx.size)))

    items = [item([1, 5]), item([]), item([2, 3]), item([7, 8, 9, 1])]
    # unseen/total by hand: 1/2, none, 0/2, 3/4
    np.testing.assert_allclose(Worker._oov_share(model, items), [0.5, 0.0, 0.0, 0.75])
    assert Worker._oov_share(model, []).shape == (0,)
