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


# ------------------------------------------------------------------ the C table's keys
# The C table looks a token up by a key made from its characters as a str stores them (the
# bytes themselves up to 7 one-byte characters, a polynomial hash of 7-byte chunks
# beyond): tokens that share bytes, lengths or chunks must still get their own hashes once
# all of them are in the table (a shared key would give one the other's hash on a hit).


def oracle_hash(token: str) -> int:
    d = hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=8, key=b"streamnb-hash-v1").digest()
    return int.from_bytes(d, "little")


def near_tokens() -> list[str]:
    """Tokens that differ in little: a NUL more, the same bytes in another str width, one
    byte at a chunk's edge, every length from 0 to 40 in each width."""
    out = ["", "\x00", "\x00\x00", "a", "a\x00", "\x00a", "\x00\x01", "\u0100", "\x01\x00",
           "\U00010000", "\x00\x00\x01\x00", "é", "\xc3\xa9", "\x80", "\xc2\x80", "ab" * 3 + "\x00",
           "\u0100\x00\x00", "\x00\x01\x00\x00"]
    for width_char in ("a", "é", "\u20ac", "\U0001f600"):
        for n in range(41):
            base = (width_char + "0123456789abcdefghijklmnopqrstuvwxyz!?" * 2)[:n]
            out.append(base)
            for i in {0, n // 2, max(0, n - 1), 6, 7, 8, 13, 14, 15}:
                if i < n:
                    out.append(base[:i] + chr(ord(base[i]) ^ 1) + base[i + 1:])
                    out.append(base[:i] + chr(ord(base[i]) | 0x80) + base[i + 1:])
            if width_char > "\xff":  # the same bytes as a str of one byte a character
                codec = "utf-16-le" if width_char < "\U00010000" else "utf-32-le"
                out.append(base.encode(codec, "surrogatepass").decode("latin-1"))
    return list(dict.fromkeys(out))


def test_the_c_table_gives_each_near_token_its_own_hash():
    from streamnb.features import hashing

    if hashing.C_TABLE is None:
        pytest.skip("streamnb.features._speedups is not built")
    tokens = near_tokens()
    expected = [oracle_hash(t) for t in tokens]
    hashing.C_TABLE.clear()
    out = np.empty(len(tokens), dtype=np.uint64)
    hashing.C_TABLE.hash_lists([tokens], out)  # every token new: each hashed, then kept
    assert out.tolist() == expected
    hashing.C_TABLE.hash_lists([tokens[::-1]], out)  # every token found in the table
    assert out.tolist() == expected[::-1]
    assert [hashing.C_TABLE.lookup(t) for t in tokens] == expected
    assert hashing.C_TABLE.size() == len(tokens)


def test_the_c_table_keeps_many_random_tokens_apart():
    from streamnb.features import hashing

    if hashing.C_TABLE is None:
        pytest.skip("streamnb.features._speedups is not built")
    rng = np.random.default_rng(52)
    alphabet = "abcdefghij\x00é\u20ac\U0001f600"
    tokens = list(dict.fromkeys("".join(rng.choice(list(alphabet), size=int(n)))
                                for n in rng.integers(0, 30, size=60_000)))
    hashing.C_TABLE.clear()
    out = np.empty(len(tokens), dtype=np.uint64)
    hashing.C_TABLE.hash_lists([tokens], out)
    hashing.C_TABLE.hash_lists([tokens], out)  # (all hits)
    assert out.tolist() == [oracle_hash(t) for t in tokens]
