"""Stable feature hashing: token -> bucket in ``[0, 2**bits)``, the same everywhere.

The function is keyed BLAKE2b from the standard library (``hashlib.blake2b``), digest
size 8 bytes, key :data:`HASH_KEY` (``b"streamnb-hash-v1"``), over the
token's UTF-8 bytes; the digest is read as a little-endian unsigned 64-bit integer and
its low ``bits`` bits are the bucket. It depends on neither the process (unlike the
built-in ``hash``, salted per process), nor the machine, nor the Python version.
No sign hashing: counts stay non-negative, as count models need.

A per-process table (at most :data:`HASH_CACHE_SIZE` entries, emptied
when full) maps token -> 64-bit hash, so the frequent tokens of a mail stream are hashed
once; a token not in it is hashed by :func:`_blake64`. Where the optional C module is
built (:mod:`streamnb._cmodules`) the table is its flat array of (str hash, length) ->
64-bit hash, written straight into numpy arrays (:data:`C_TABLE`); otherwise a dict
(:data:`REFERENCE_TABLE`). Both give the same hashes.

>>> token_hash64("viagra") == token_hash64("viagra")
True
>>> TokenHasher(bits=4).bucket("viagra") == token_hash64("viagra") % 16
True
>>> idx, counts = TokenHasher(bits=20).hash_counts(["a", "b", "a"])
>>> sorted(counts.tolist())
[1.0, 2.0]
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, pairwise
from typing import NamedTuple

import numpy as np

from streamnb._cmodules import optional_c_module
from streamnb.arrays import sorted_unique

__all__ = ["C_TABLE", "MAX_HASH_BITS", "REFERENCE_TABLE", "TokenHasher", "TokenTable", "token_hash64",
           "token_hashes"]

#: Default number of hash bits for hashed (text, token, mail) input: 2**20 buckets.
DEFAULT_HASH_BITS = 20

#: Key of the stable token hash (blake2b, 8-byte digest). Changing it changes every bucket.
HASH_KEY = b"streamnb-hash-v1"

#: Entries kept in the per-process token -> hash cache (an LRU).
HASH_CACHE_SIZE = 1 << 18

#: Buckets are stored as int32, so at most 2**31 of them.
MAX_HASH_BITS = 31


#: The keyed BLAKE2b state before any data: copying it skips re-keying per token.
_KEYED = hashlib.blake2b(digest_size=8, key=HASH_KEY)


def _blake64(token: str) -> int:
    """The stable hash of one token, computed (no table)."""
    h = _KEYED.copy()
    h.update(token.encode("utf-8", "surrogatepass"))
    return int.from_bytes(h.digest(), "little")


class _HashCache(dict):
    """token -> 64-bit hash; a hit is one C-level dict lookup (no Python frame). When
    full it is emptied (bounded memory under a vocabulary flood; hot tokens come back)."""

    __slots__ = ()

    def __missing__(self, token: str) -> int:
        if len(self) >= HASH_CACHE_SIZE:
            self.clear()
        h = self[token] = _blake64(token)
        return h

    def hash_lists(self, token_lists: list[Iterable[str]], out: np.ndarray) -> None:
        out[:] = np.fromiter(map(self.__getitem__, chain.from_iterable(token_lists)), dtype=np.uint64,
                             count=out.size)


class TokenTable(NamedTuple):
    """A table of token -> stable 64-bit hash, bounded, filled by :func:`_blake64`."""

    name: str
    #: token -> its hash
    lookup: Callable[[str], int]
    #: ``hash_lists(token_lists, out)``: the hashes of the tokens of every list (a list of
    #: sequences of str), one after the other, into ``out`` (uint64, exactly that many)
    hash_lists: Callable[[list, np.ndarray], None]
    size: Callable[[], int]
    clear: Callable[[], None]


def _dict_table() -> TokenTable:
    cache = _HashCache()
    return TokenTable("dict", cache.__getitem__, cache.hash_lists, cache.__len__, cache.clear)


def _c_table() -> TokenTable | None:
    """The C table (the module docstring), its misses hashed by :func:`_blake64`; None
    where it is not built or turned off."""
    c = optional_c_module("streamnb.features._speedups")
    if getattr(c, "hash_cache_init", None) is None:
        return None
    c.hash_cache_init(HASH_CACHE_SIZE, _blake64)
    return TokenTable("C", c.hash_one, c.hash_lists, c.hash_cache_len, c.hash_cache_clear)


#: The dict: the table without the C module, and the reference of the C table.
REFERENCE_TABLE = _dict_table()
#: The C table, or None. Its ``word_hashes`` (the tokenizer's C step) fills it too.
C_TABLE = _c_table()
#: The table in use.
_TABLE = C_TABLE or REFERENCE_TABLE
#: ``unique_buckets`` of the C module (:meth:`TokenHasher.unique_buckets_many`), or None.
_unique_buckets = getattr(optional_c_module("streamnb.features._speedups"), "unique_buckets", None)


def token_hash64(token: str) -> int:
    """The stable 64-bit hash of a token (keyed BLAKE2b, see the module docstring)."""
    return _TABLE.lookup(token)


def _hashes(token_lists: Sequence[Iterable[str]], total: int, out: np.ndarray | None = None,
            table: TokenTable | None = None) -> np.ndarray:
    """The 64-bit hashes of the tokens of every list, one after the other (``total`` of them),
    into ``out`` (a contiguous uint64 array of that size; a new one if None), from ``table``
    (None: the one in use)."""
    if out is None:
        out = np.empty(total, dtype=np.uint64)
    (table or _TABLE).hash_lists(token_lists if type(token_lists) is list else list(token_lists), out)
    return out


def token_hashes(tokens: Iterable[str]) -> np.ndarray:
    """The 64-bit hashes of ``tokens``, in order (uint64): what a producer that tokenizes
    sends as a ``hashes`` payload (docs/protocol.md), so that the workers skip decoding
    and hashing the token strings. Hashes are independent of the model's ``bits``.

    >>> token_hashes(["cheap", "meds"]).tolist() == [token_hash64("cheap"), token_hash64("meds")]
    True
    """
    if not isinstance(tokens, (list, tuple)):
        tokens = list(tokens)
    return _hashes([tokens], len(tokens))


class CacheInfo(NamedTuple):
    maxsize: int
    currsize: int


def _cache_info() -> CacheInfo:
    """Size and bound of the token hash table (like ``functools.lru_cache``'s)."""
    return CacheInfo(HASH_CACHE_SIZE, _TABLE.size())


token_hash64.cache_info = _cache_info  # type: ignore[attr-defined]
token_hash64.cache_clear = _TABLE.clear  # type: ignore[attr-defined]


class TokenHasher:
    """Hash tokens into ``2**bits`` buckets and sum their counts per bucket.

    >>> h = TokenHasher(bits=20)
    >>> h.n_buckets
    1048576
    >>> idx, val = h.hash_values({"size": 2.5, "size ": 1.0})
    >>> idx.dtype.name, val.dtype.name
    ('int32', 'float64')
    """

    __slots__ = ("bits", "mask")

    def __init__(self, bits: int = DEFAULT_HASH_BITS) -> None:
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= MAX_HASH_BITS:
            raise ValueError(f"bits must be an int in 1..{MAX_HASH_BITS}, got {bits!r}")
        self.bits = bits
        self.mask = (1 << bits) - 1

    @property
    def n_buckets(self) -> int:
        return 1 << self.bits

    def bucket(self, token: str) -> int:
        return token_hash64(token) & self.mask

    def hash_counts(self, tokens: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
        """Sorted unique buckets (int32) and how many tokens fell in each (float64)."""
        return self.hash_values(Counter(tokens))

    def hash_unique(self, tokens: Iterable[str]) -> np.ndarray:
        """Sorted unique buckets (int32) of ``tokens``: ``hash_counts`` without the counts
        (binary values), so no per-token counting.

        >>> h = TokenHasher(bits=20)
        >>> bool((h.hash_unique(["a", "b", "a"]) == h.hash_counts(["a", "b", "a"])[0]).all())
        True
        """
        if not isinstance(tokens, (list, tuple)):
            tokens = list(tokens)
        return self.hash_unique_many([tokens])[0]

    def hash_unique_many(self, token_lists: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """:meth:`hash_unique` of every list, in one pass: one lookup per token over the
        whole batch, one sort per list, one split.

        >>> h = TokenHasher(bits=20)
        >>> lists = [["a", "b", "a"], [], ["b"]]
        >>> all(np.array_equal(x, h.hash_counts(t)[0]) for x, t in zip(h.hash_unique_many(lists), lists))
        True
        """
        n = len(token_lists)
        sizes = np.fromiter(map(len, token_lists), dtype=np.int64, count=n)
        total = int(sizes.sum())
        if not total:
            return [np.empty(0, dtype=np.int32) for _ in range(n)]
        return self.unique_buckets_many(_hashes(token_lists, total), sizes)

    def hashes_of(self, tokens: Sequence[str], more: bytes | bytearray | None = None) -> np.ndarray:
        """The 64-bit hashes of ``tokens``, then ``more``: the hashes of more tokens of the
        same message, already computed (native uint64 bytes, as
        :meth:`MailAnalysis.word_hashes <streamnb.features.mail.MailAnalysis>` holds them).
        Hashing a message's tokens as soon as they are made reads them while they are still
        in the CPU's caches.

        >>> h = TokenHasher(bits=20)
        >>> got = h.hashes_of(["a", "b"], token_hashes(["c"]).tobytes())
        >>> got.tolist() == token_hashes(["a", "b", "c"]).tolist()
        True
        """
        n = len(tokens)
        extra = len(more) // 8 if more else 0
        out = np.empty(n + extra, dtype=np.uint64)
        if n:
            _hashes([tokens], n, out[:n])
        if extra:
            out[n:] = np.frombuffer(more, dtype=np.uint64)
        return out

    def unique_buckets_many(self, hashes: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
        """The sorted unique buckets (int32) of each list of 64-bit token hashes, the lists
        end to end in ``hashes`` (``sizes[i]`` hashes for list i; ``hashes`` may be
        modified). One mask, one sort of (list number, bucket) keys, one split
        (:meth:`_unique_buckets_numpy`); with the C module one pass sorts each list apart
        (``unique_buckets``, 5-6x the numpy code on a batch of mail-sized lists: ``python -m
        benchmarks.array_sorts``).

        >>> h = TokenHasher(bits=4)
        >>> [b.tolist() for b in h.unique_buckets_many(np.array([17, 1, 2, 33], np.uint64), np.array([3, 0, 1]))]
        [[1, 2], [], [1]]
        """
        if _unique_buckets is not None:
            out = np.empty(hashes.size, dtype=np.int32)
            counts = np.empty(len(sizes), dtype=np.int64)
            _unique_buckets(hashes, sizes.astype(np.int64, copy=False), self.bits, out, counts)
            bounds = [0, *np.cumsum(counts).tolist()]
            return [out[start:end] for start, end in pairwise(bounds)]
        return self._unique_buckets_numpy(hashes, sizes)

    def _unique_buckets_numpy(self, hashes: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
        """:meth:`unique_buckets_many` in numpy (the reference of the C ``unique_buckets``)."""
        n = len(sizes)
        keys = hashes
        keys &= np.uint64(self.mask)
        # key = list number << bits | bucket: sorting groups by list, then by bucket
        shift = np.uint64(self.bits)
        keys |= np.repeat(np.arange(n, dtype=np.uint64) << shift, sizes)
        keys = sorted_unique(keys)
        bounds = np.searchsorted(keys, np.arange(n + 1, dtype=np.uint64) << shift).tolist()
        buckets = (keys & np.uint64(self.mask)).astype(np.int32)
        return [buckets[bounds[i]:bounds[i + 1]] for i in range(n)]

    def hash_values(self, values: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
        """Sorted unique buckets (int32) and the summed values of the names in each."""
        if not values:
            return np.empty(0, dtype=np.int32), np.empty(0, dtype=np.float64)
        n = len(values)
        # the cached hashes and a numpy mask: no Python frame per token.
        raw = _hashes([values.keys()], n)
        raw &= np.uint64(self.mask)
        vals = np.fromiter(values.values(), dtype=np.float64, count=n)
        order = np.argsort(raw, kind="stable")
        idx = raw[order]
        if n == 1 or bool((idx[1:] != idx[:-1]).all()):  # no collision inside this message
            return idx.astype(np.int32), vals[order]
        idx, inverse = np.unique(raw, return_inverse=True)
        summed = np.bincount(inverse, weights=vals, minlength=idx.size)
        return idx.astype(np.int32), summed
