"""Stable hashing: the documented function, collisions summed, the same in another process."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from streamnb.features.hashing import TokenHasher, token_hash64


def documented_bucket(token: str, bits: int) -> int:
    """The function as docs/features.md states it, re-implemented independently."""
    d = hashlib.blake2b(token.encode("utf-8"), digest_size=8, key=b"streamnb-hash-v1").digest()
    return int.from_bytes(d, "little") % (2**bits)


TOKENS = ["viagra", "subject:free", "url:example.com", "skip:x 20", "é8bit", "", "日本語"]


@pytest.mark.parametrize("bits", [1, 8, 20, 31])
def test_bucket_is_the_documented_function(bits):
    h = TokenHasher(bits)
    for t in TOKENS:
        assert h.bucket(t) == documented_bucket(t, bits)
        assert 0 <= h.bucket(t) < 2**bits


def test_hash_counts_sums_repeats_and_collisions():
    h = TokenHasher(bits=2)  # 4 buckets: collisions are certain
    tokens = [f"tok{i}" for i in range(20)] + ["tok0", "tok0"]
    idx, counts = h.hash_counts(tokens)
    expected: dict[int, float] = {}
    for t in tokens:
        b = documented_bucket(t, 2)
        expected[b] = expected.get(b, 0.0) + 1.0
    assert idx.dtype == np.int32 and counts.dtype == np.float64
    assert idx.tolist() == sorted(expected)
    assert counts.tolist() == [expected[b] for b in sorted(expected)]
    assert counts.sum() == len(tokens)


def test_hash_values_keeps_values_and_sorts():
    h = TokenHasher(bits=20)
    idx, vals = h.hash_values({"a": 2.5, "b": 0.25})
    by_bucket = {documented_bucket("a", 20): 2.5, documented_bucket("b", 20): 0.25}
    assert idx.tolist() == sorted(by_bucket)
    assert vals.tolist() == [by_bucket[i] for i in idx.tolist()]
    assert (np.diff(idx) > 0).all()


def test_empty_input():
    idx, vals = TokenHasher(10).hash_counts([])
    assert idx.size == 0 and vals.size == 0


@pytest.mark.parametrize("bits", [0, 32, -1, 2.0, True, "20"])
def test_bits_validated(bits):
    with pytest.raises(ValueError, match="bits must be an int"):
        TokenHasher(bits)


def test_same_indices_in_another_process_with_another_hash_seed():
    code = (
        "import json, sys; from streamnb.features.hashing import TokenHasher; "
        "print(json.dumps([TokenHasher(20).bucket(t) for t in json.loads(sys.argv[1])]))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(TOKENS)], capture_output=True, text=True, env=env, check=True
    )
    assert json.loads(out.stdout) == [TokenHasher(20).bucket(t) for t in TOKENS]


def test_cache_is_bounded():
    info = token_hash64.cache_info()
    assert info.maxsize is not None and info.maxsize > 0


@pytest.mark.parametrize("bits", [2, 20])
def test_hash_unique_many_is_hash_unique_per_list(bits):
    h = TokenHasher(bits)  # bits=2: collisions inside and across lists are certain
    lists = [[f"tok{i % 7}" for i in range(n)] for n in (0, 1, 5, 40)] + [[], ["é8bit", "日本語"]]
    got = h.hash_unique_many(lists)
    assert len(got) == len(lists)
    for idx, tokens in zip(got, lists, strict=True):
        assert idx.dtype == np.int32
        assert idx.tolist() == sorted({documented_bucket(t, bits) for t in tokens})
