"""Small numpy helpers shared by the statistics and models."""

from __future__ import annotations

import numpy as np


def sorted_unique(a: np.ndarray, runs: bool = False) -> np.ndarray:
    """The sorted distinct values of a 1-d integer array.

    Same result as ``np.unique(a)``, by sorting: numpy 2.x's hash-based ``unique`` was 7x
    slower on the batch column indices (20,000 int32 of 2**20 buckets) this is used for.
    ``runs``: ``a`` is a few sorted arrays end to end (a union of column sets), which
    numpy's stable sort merges (its quicksort takes them as shuffled: 25x slower on a
    union of 200,000 columns, ``python -m benchmarks.array_sorts``).

    >>> sorted_unique(np.array([5, 1, 5, 3, 1])).tolist()
    [1, 3, 5]
    """
    b = np.sort(a, kind="stable" if runs or a.dtype.kind not in "iu" else None)
    if b.size == 0:
        return b
    keep = np.empty(b.size, dtype=bool)
    keep[0] = True
    np.not_equal(b[1:], b[:-1], out=keep[1:])
    return b[keep]


def nonzero_columns(values: np.ndarray) -> np.ndarray:
    """Columns of a 2-d array with a nonzero entry in some row, as a boolean mask.

    ``values.any(axis=0)``, which it calls on C-ordered input; on F-ordered input (what
    fancy indexing ``values[:, cols]`` returns) one row at a time, 10-30x faster.

    >>> nonzero_columns(np.array([[0.0, 2.0, 0.0], [0.0, 0.0, 1.0]])).tolist()
    [False, True, True]
    """
    if values.flags.c_contiguous:
        return values.any(axis=0)
    out = np.zeros(values.shape[1], dtype=bool)
    for row in values:  # rows are classes: a handful
        out |= row != 0
    return out


def put_rows(table: np.ndarray, index: np.ndarray, rows: np.ndarray) -> None:
    """``table[index] = rows`` for a C-ordered 2-d ``table``, each row moved as one item
    (numpy's row-wise fancy assignment is 3x slower on narrow tables).

    >>> t = np.zeros((4, 2)); put_rows(t, np.array([3, 1]), np.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> t.tolist()
    [[0.0, 0.0], [3.0, 4.0], [0.0, 0.0], [1.0, 2.0]]
    """
    if not table.flags.c_contiguous or table.ndim != 2 or table.shape[1] == 0:
        table[index] = rows
        return
    item = np.dtype((np.void, table.dtype.itemsize * table.shape[1]))
    src = np.ascontiguousarray(rows, dtype=table.dtype).reshape(-1, table.shape[1])
    np.put(table.view(item).reshape(-1), index, src.view(item).reshape(-1))


def sort_with_order(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``(keys[order], order)`` with ``order = np.argsort(keys, kind="stable")``, for
    integer keys in ``[0, bound)``; both int64.

    One sort of int64 words holding the key in the high bits and the position in the low
    bits, or numpy's stable argsort when the two do not fit in 63 bits. The keys are the
    column indices of CSR rows (sorted runs, one per row), and so are the words: numpy's
    stable sort merges the runs, about 1.6x faster than its quicksort on a batch of mail
    rows and 1.2x faster than its stable argsort of the keys (``python -m
    benchmarks.array_sorts``).

    >>> [a.tolist() for a in sort_with_order(np.array([3, 1, 3, 0, 1]), 4)]
    [[0, 1, 1, 3, 3], [3, 1, 4, 0, 2]]
    """
    shift = max(int(keys.size - 1).bit_length(), 1)
    if keys.size == 0 or max(int(bound) - 1, 1).bit_length() + shift > 63:
        order = np.argsort(keys, kind="stable").astype(np.int64)
        return keys[order].astype(np.int64), order
    words = keys.astype(np.int64) << shift
    words |= np.arange(keys.size, dtype=np.int64)
    words.sort(kind="stable")  # (the words are distinct: any sort gives this order)
    order = words & ((1 << shift) - 1)
    words >>= shift
    return words, order


def unique_inverse(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for integer keys in ``[0, bound)`` (both
    int64), by :func:`sort_with_order`, for the column indices of CSR rows: about 1.6x
    faster than ``np.unique`` on a batch of mail rows (``python -m benchmarks.array_sorts``).

    >>> [a.tolist() for a in unique_inverse(np.array([7, 2, 7, 5]), 8)]
    [[2, 5, 7], [2, 0, 2, 1]]
    """
    ordered, order = sort_with_order(keys, bound)
    if ordered.size == 0:
        return ordered, order
    first = np.empty(ordered.size, dtype=bool)  # where each distinct key starts
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    inverse = np.empty(ordered.size, dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return ordered[first], inverse
