"""A featurized message (:class:`Row`) and its encoding for the delayed-label cache and
the log: what every worker must read back as the same row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamnb._cmodules import optional_c_module
from streamnb.encoding import dumps, loads, pack_array, unpack_array
from streamnb.exceptions import FormatError

__all__ = ["FEATURIZER_FORMAT_VERSION", "Row", "binary_rows", "ones_like", "rows_to_bytes"]

#: Version of the featurizer config and of encoded feature rows.
FEATURIZER_FORMAT_VERSION = 1

#: The first element of a gap-encoded row (:meth:`Row.to_bytes`), and the largest gap + 1.
_GAPS_FORM = 2
_MAX_GAP = 1 << 16
_INT32 = np.dtype("<i4")
#: ``streamnb._kernels.gap_rows`` (the gaps form of :func:`rows_to_bytes` in C), or None:
#: then numpy and msgpack do the same (tests/streamnb/features/test_gap_rows.py).
GAP_ROWS = getattr(optional_c_module("streamnb._kernels"), "gap_rows", None)


@dataclass(slots=True)
class Row:
    """One featurized message: sparse (buckets + values [+ meta]) or dense (``x``).

    >>> r = Row(indices=np.array([3, 9], dtype=np.int32), values=np.array([1.0, 2.0]), n_tokens=3)
    >>> Row.from_bytes(r.to_bytes()) == r
    True
    """

    indices: np.ndarray | None = None
    values: np.ndarray | None = None
    meta: np.ndarray | None = None
    x: np.ndarray | None = None
    n_tokens: int = 0
    #: The values are all 1, as made (binary counts): :meth:`to_bytes` need not look.
    binary: bool = False
    #: The message's tokens, where :meth:`Featurizer.featurize_batch
    #: <streamnb.features.featurizer.Featurizer.featurize_batch>` was asked to keep them
    #: (``keep_tokens``); else None. Not part of the row's value: neither encoded nor compared.
    tokens: list[str] | None = None

    @property
    def is_dense(self) -> bool:
        return self.x is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Row):
            return NotImplemented
        return self.n_tokens == other.n_tokens and all(
            (a is None and b is None)
            or (a is not None and b is not None and a.shape == b.shape and bool((a == b).all()))
            for a, b in (
                (self.indices, other.indices),
                (self.values, other.values),
                (self.meta, other.meta),
                (self.x, other.x),
            )
        )

    def fits(self, dim: int | None, n_buckets: int, n_meta: int) -> bool:
        """True if this row can be stacked with ``dim`` values (dense) or, for ``dim`` None,
        in ``n_buckets`` buckets and ``n_meta`` meta columns (sparse); what
        :meth:`Featurizer.fits <streamnb.features.featurizer.Featurizer.fits>` checks."""
        if dim is not None:
            return self.x is not None and self.x.shape == (dim,) and bool(np.isfinite(self.x).all())
        idx, values = self.indices, self.values
        if idx is None or values is None or idx.shape != values.shape:
            return False
        if idx.size and not 0 <= int(idx[0]) <= int(idx[-1]) < n_buckets:
            return False
        if not np.isfinite(values).all() or (values < 0).any():
            return False
        return not n_meta or self.meta is None or self.meta.shape == (n_meta,)

    def to_bytes(self) -> bytes:
        """Compact msgpack encoding (for the worker's cache of rows awaiting a label).

        Values that are all 1 (binary counts, the mail default) are not stored. A sparse
        row of such values, without meta, whose buckets are less than 65,536 apart (with
        2**20 buckets, 82% of the SpamAssassin corpus's rows: all but the shortest), is
        stored as its first bucket and the gaps to the next ones in 2 bytes each: ``[2,
        n_tokens, first, gaps]``, half of the 4 bytes a bucket takes as int32 (a cached
        row is most of a cache entry's bytes in Redis). Other rows are a map of their arrays.

        >>> r = Row(indices=np.arange(100, dtype=np.int32), values=np.ones(100), n_tokens=100)
        >>> Row.from_bytes(r.to_bytes()) == r, len(r.to_bytes()) < 100 * 2 + 20
        (True, True)
        """
        return rows_to_bytes([self])[0]

    def _map_bytes(self, ones: bool | None = None) -> bytes:
        """The map form of :meth:`to_bytes` (``ones``: a row of :meth:`_gap_encodable`'s
        kind, whose values are all 1)."""
        idx = self.indices
        if ones and self.meta is None and self.x is None:  # the common row: as below
            return dumps({"type": "row", "v": FEATURIZER_FORMAT_VERSION, "n": self.n_tokens,
                          "ones": True, "indices": {"dtype": "<i4", "shape": [idx.size],
                                                    "data": idx.tobytes()}})
        values = self.values
        if ones is None:
            ones = values is not None and values.size and (self.binary or bool((values == 1.0).all()))
        body: dict[str, Any] = {"type": "row", "v": FEATURIZER_FORMAT_VERSION, "n": self.n_tokens}
        if ones:
            body["ones"] = True
            values = None
        for name, a in (("indices", self.indices), ("values", values), ("meta", self.meta),
                        ("x", self.x)):
            if a is not None:
                body[name] = pack_array(a)
        return dumps(body)

    def _gap_encodable(self) -> bool:
        """A sparse row of binary values, without meta, with at least one bucket: the kind
        :meth:`to_bytes` may store as gaps (if they fit in 2 bytes)."""
        idx, values = self.indices, self.values
        return (self.meta is None and self.x is None and type(idx) is np.ndarray
                and idx.dtype == _INT32 and idx.ndim == 1 and idx.size > 0
                and values is not None and (self.binary or bool((values == 1.0).all())))

    @classmethod
    def from_bytes(cls, data: bytes) -> Row:
        """Decode and validate a row written by :meth:`to_bytes` (FormatError if corrupt)."""
        obj = loads(data, max_size=1 << 28)
        if isinstance(obj, list) and obj and obj[0] == _GAPS_FORM:
            return cls._from_gaps(obj)
        if not isinstance(obj, dict) or obj.get("type") != "row":
            raise FormatError("not an encoded feature row")
        if obj.get("v") != FEATURIZER_FORMAT_VERSION:
            raise FormatError(f"feature row version {obj.get('v')!r} is not {FEATURIZER_FORMAT_VERSION}")
        n = obj.get("n")
        if not isinstance(n, int) or n < 0:
            raise FormatError("feature row without a token count")
        get = obj.get
        idx = unpack_array(get("indices"), "<i4", 1) if "indices" in obj else None
        val = unpack_array(get("values"), "<f8", 1) if "values" in obj else None
        if "ones" in obj:  # binary values, not stored (to_bytes)
            if obj["ones"] is not True or val is not None or idx is None:
                raise FormatError("'ones' stands for the values of a sparse row, alone")
            val = np.ones(idx.size, dtype=np.float64)
        meta = unpack_array(get("meta"), "<f8", 1) if "meta" in obj else None
        x = unpack_array(get("x"), "<f8", 1) if "x" in obj else None
        if x is None:
            if idx is None or val is None or idx.shape != val.shape:
                raise FormatError("sparse feature row needs indices and values of one length")
            if idx.size and ((idx[:-1] >= idx[1:]).any() or idx[0] < 0):
                raise FormatError("sparse feature row indices must be sorted, unique, >= 0")
        elif idx is not None or val is not None:
            raise FormatError("a feature row is either sparse or dense")
        return cls(indices=idx, values=val, meta=meta, x=x, n_tokens=n, binary="ones" in obj)

    @classmethod
    def _from_gaps(cls, obj: list) -> Row:
        """The row of ``[2, n_tokens, first, gaps]`` (see :meth:`to_bytes`)."""
        if len(obj) != 4:
            raise FormatError("a gap-encoded feature row is [2, n_tokens, first, gaps]")
        _, n, first, gaps = obj
        if not isinstance(n, int) or n < 0 or not isinstance(first, int) or not 0 <= first < 2**31:
            raise FormatError("gap-encoded feature row without a token count or first bucket")
        if not isinstance(gaps, bytes) or len(gaps) % 2:
            raise FormatError("the gaps of a feature row are 2 bytes each")
        steps = np.frombuffer(gaps, dtype="<u2")
        if steps.size and not steps.all():
            raise FormatError("sparse feature row indices must be sorted, unique, >= 0")
        idx = np.empty(steps.size + 1, dtype=np.int64)
        idx[0] = first
        np.cumsum(steps, out=idx[1:])
        idx[1:] += first
        if idx[-1] >= 2**31:
            raise FormatError("a feature row's bucket does not fit in int32")
        return cls(indices=idx.astype(np.int32), values=np.ones(idx.size), n_tokens=n, binary=True)


def rows_to_bytes(rows: Sequence[Row]) -> list[bytes]:
    """``[row.to_bytes() for row in rows]`` (:meth:`Row.to_bytes` is this for one row): the
    gaps of the gap-encodable rows (the mail default) computed for the whole batch in a few
    numpy calls.

    >>> rows = [Row(indices=np.array([3, 9], dtype=np.int32), values=np.ones(2), n_tokens=2),
    ...         Row(indices=np.array([1, 70000], dtype=np.int32), values=np.ones(2), n_tokens=5)]
    >>> rows_to_bytes(rows) == [r.to_bytes() for r in rows]
    True
    """
    out: list[bytes | None] = [None] * len(rows)
    fast = [i for i, r in enumerate(rows) if r._gap_encodable()]
    if fast and GAP_ROWS is not None:  # (the C form of what follows)
        indices = [rows[i].indices for i in fast]
        n_tokens = np.fromiter((rows[i].n_tokens for i in fast), dtype=np.int64, count=len(fast))
        for i, data in zip(fast, GAP_ROWS(np.concatenate(indices), np.fromiter(
                map(len, indices), dtype=np.int64, count=len(fast)), n_tokens), strict=True):
            out[i] = rows[i]._map_bytes(ones=True) if data is None else data
    elif fast:
        indices = [rows[i].indices for i in fast]
        sizes = np.fromiter(map(len, indices), dtype=np.int64, count=len(fast))
        cat = np.concatenate(indices).astype(np.int64)  # (int32 gaps would wrap)
        gaps = np.diff(cat)
        ends = np.cumsum(sizes) - 1  # each row's last position; its gaps end there
        starts = ends - sizes + 1
        too_far = (gaps >= _MAX_GAP) | (gaps <= 0)  # (<= 0: not sorted: as to_bytes does)
        too_far[ends[:-1]] = False  # (from one row's last bucket to the next row's first)
        packed = gaps.astype("<u2").tobytes()
        far_rows = set(np.searchsorted(ends, np.flatnonzero(too_far)).tolist()) if too_far.any() else set()
        firsts = cat[starts].tolist()
        far_rows.update(j for j, (i, first) in enumerate(zip(fast, firsts, strict=True))
                        if first < 0 or rows[i].n_tokens < 0)  # (gaps form: from_bytes refuses)
        for j, (i, a, b, first) in enumerate(zip(fast, starts.tolist(), ends.tolist(), firsts,
                                                 strict=True)):
            if j not in far_rows:
                out[i] = dumps([_GAPS_FORM, rows[i].n_tokens, first, packed[2 * a:2 * b]])
            else:
                out[i] = rows[i]._map_bytes(ones=True)
    return [r._map_bytes() if b is None else b for r, b in zip(rows, out, strict=True)]


def binary_rows(out: list, unique: Sequence[np.ndarray],
                made: Sequence[tuple[int, np.ndarray | None, int, list[str] | None]]) -> None:
    """``out[i]`` for each ``(i, meta, n_tokens, tokens)`` of ``made``: the row of binary
    values over the buckets ``unique`` holds for it (in the same order)."""
    for (i, meta, n, tokens), idx, ones in zip(made, unique, ones_like(unique), strict=True):
        out[i] = Row(indices=idx, values=ones, meta=meta, n_tokens=n, binary=True, tokens=tokens)


def ones_like(rows: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The binary values of rows of buckets: read-only views of one array of ones, a view
    the size of each row (one allocation for a batch, not one a row).

    >>> [v.tolist() for v in ones_like([np.arange(2), np.arange(0), np.arange(1)])]
    [[1.0, 1.0], [], [1.0]]
    """
    sizes = [r.size for r in rows]
    ones = np.ones(sum(sizes))
    ones.flags.writeable = False
    views, end = [], 0
    for size in sizes:
        views.append(ones[end:end + size])
        end += size
    return views
