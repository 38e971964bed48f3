"""The sorts of a batch's column indices (streamnb.arrays), next to numpy's own.

Before the rows exist, the featurizer makes each message's distinct buckets from its
token hashes (``TokenHasher.unique_buckets_many``: the C ``unique_buckets`` where the C
module is built, against its numpy reference; here ``--per-row`` hashes per row, a third
of them repeats). Then the count models sort the column indices of a batch's rows: the
prequential plan (``sort_with_order``) and the class sums of the statistics
(``unique_inverse``) where ``streamnb._kernels`` is not built, and the union of column
sets when deltas merge (``sorted_unique(runs=True)``). The input here has the
shape of a batch of mail: ``--rows`` CSR rows of ``--per-row`` sorted distinct buckets of
2**20 (the rows' indices end to end: sorted runs), and a union of ``--columns`` known
columns with one row's. Each figure is the best of ``--repeat`` timings of 20 calls.

    python -m benchmarks.array_sorts [--rows 100] [--per-row 320] [--columns 200000]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from benchmarks._common import best_ms, format_table, print_header
from streamnb.arrays import sort_with_order, sorted_unique, unique_inverse
from streamnb.features.hashing import TokenHasher

BUCKETS = 2**20


def batch_indices(rows: int, per_row: int, seed: int = 1) -> np.ndarray:
    """The CSR indices of ``rows`` rows of ``per_row`` sorted distinct buckets (int32)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([np.sort(rng.choice(BUCKETS, size=per_row, replace=False))
                           for _ in range(rows)]).astype(np.int32)


def measure(rows: int = 100, per_row: int = 320, columns: int = 200_000,
            repeat: int = 5) -> list[tuple[str, str, float, float]]:
    """(step, what, numpy ms, streamnb ms) per step; the results are checked equal."""
    keys = batch_indices(rows, per_row)
    ref_order = np.argsort(keys, kind="stable")
    got_keys, got_order = sort_with_order(keys, BUCKETS)
    assert np.array_equal(got_order, ref_order) and np.array_equal(got_keys, keys[ref_order])
    ref_unique, ref_inverse = np.unique(keys, return_inverse=True)
    got_unique, got_inverse = unique_inverse(keys, BUCKETS)
    assert np.array_equal(got_unique, ref_unique) and np.array_equal(got_inverse, ref_inverse)
    rng = np.random.default_rng(2)
    union = np.concatenate([np.sort(rng.choice(BUCKETS, size=columns, replace=False)),
                            keys[:per_row]])
    assert np.array_equal(sorted_unique(union, runs=True), np.unique(union))

    hasher = TokenHasher(20)
    hashes = rng.integers(0, 2**63, size=(rows, per_row), dtype=np.uint64)
    hashes[:, ::3] = hashes[:, 1::3][:, : hashes[:, ::3].shape[1]]  # repeated tokens
    hashes = hashes.ravel()
    sizes = np.full(rows, per_row, dtype=np.int64)
    got = hasher.unique_buckets_many(hashes.copy(), sizes)
    want = hasher._unique_buckets_numpy(hashes.copy(), sizes)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))

    words = (keys.astype(np.int64) << 15) | np.arange(keys.size, dtype=np.int64)
    return [
        ("featurize: each row's distinct buckets", "sort of (row, bucket) keys",
         best_ms(lambda: hasher._unique_buckets_numpy(hashes.copy(), sizes), repeat),
         best_ms(lambda: hasher.unique_buckets_many(hashes.copy(), sizes), repeat)),
        ("plan: sort the batch's indices with their order", "np.argsort(kind='stable')",
         best_ms(lambda: np.argsort(keys, kind="stable"), repeat),
         best_ms(lambda: sort_with_order(keys, BUCKETS), repeat)),
        ("  (its packed words: quicksort, stable sort)", "np.sort, quicksort",
         best_ms(lambda: np.sort(words), repeat), best_ms(lambda: np.sort(words, kind="stable"), repeat)),
        ("class sums: distinct columns and inverse", "np.unique(return_inverse=True)",
         best_ms(lambda: np.unique(keys, return_inverse=True), repeat),
         best_ms(lambda: unique_inverse(keys, BUCKETS), repeat)),
        ("delta merge: union of sorted column sets", "sorted_unique (quicksort)",
         best_ms(lambda: sorted_unique(union), repeat), best_ms(lambda: sorted_unique(union, runs=True), repeat)),
    ]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--per-row", type=int, default=320)
    ap.add_argument("--columns", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    print_header("sorting a batch's column indices", "benchmarks.array_sorts", argv)
    print(f"{args.rows} rows of {args.per_row} sorted buckets of 2**20 "
          f"({args.rows * args.per_row:,} indices); union with {args.columns:,} columns")
    rows = measure(args.rows, args.per_row, args.columns, args.repeat)
    print(format_table(["step", "numpy's way", "numpy ms", "streamnb ms", "speed-up"],
                       [[step, what, ref, ours, f"{ref / ours:.2f}x"] for step, what, ref, ours in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
