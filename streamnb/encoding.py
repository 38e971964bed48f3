"""Compact, versioned, pickle-free encoding of statistics: msgpack maps with raw numpy buffers.

Arrays are stored as ``{"dtype": "<f8", "shape": [..], "data": bytes}`` (little-endian,
C order). Decoding validates dtype, dimensionality and buffer length before building an
array, so a corrupted payload raises :class:`~streamnb.exceptions.FormatError` instead of
crashing or allocating unbounded memory.

>>> import numpy as np
>>> a = np.arange(6, dtype=np.float64).reshape(2, 3)
>>> b = unpack_array(pack_array(a), dtype="<f8", ndim=2)
>>> bool((a == b).all())
True
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack
import numpy as np

from streamnb.exceptions import FormatError

_ALLOWED_DTYPES = {"<f8", "<f4", "<i8", "<i4", "<u4", "<u8", "|b1", "|u1", "<u2"}
#: Unsigned types that :func:`pack_counts` narrows whole-number counts to, smallest first.
_COUNT_TYPES = (np.uint8, np.uint16, np.uint32)


def pack_array(a: np.ndarray) -> dict[str, Any]:
    """Encode a numpy array as a msgpack-friendly map (little-endian, C order)."""
    if type(a) is np.ndarray and a.flags.c_contiguous and a.dtype.str in _ALLOWED_DTYPES:
        return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes()}  # as is
    a = np.asarray(a)
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder not in ("|", "<", "=") else a.dtype
    a = np.ascontiguousarray(a, dtype=dt)
    code = a.dtype.str
    if code not in _ALLOWED_DTYPES:
        raise FormatError(f"cannot encode arrays of dtype {a.dtype}")
    return {"dtype": code, "shape": list(a.shape), "data": a.tobytes()}


def unpack_array(obj: Any, dtype: str | None = None, ndim: int | None = None) -> np.ndarray:
    """Decode an array written by :func:`pack_array`, validating dtype, ndim and size."""
    if not isinstance(obj, dict) or set(obj) != {"dtype", "shape", "data"}:
        raise FormatError("expected an encoded array map with keys dtype, shape, data")
    code, shape, data = obj["dtype"], obj["shape"], obj["data"]
    if code not in _ALLOWED_DTYPES:
        raise FormatError(f"unsupported array dtype {code!r}")
    if dtype is not None and code != dtype:
        raise FormatError(f"expected array dtype {dtype}, got {code}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise FormatError(f"bad array shape {shape!r}")
    if ndim is not None and len(shape) != ndim:
        raise FormatError(f"expected a {ndim}-d array, got shape {tuple(shape)}")
    if not isinstance(data, bytes):
        raise FormatError("array data must be bytes")
    itemsize = np.dtype(code).itemsize
    n = 1
    for s in shape:
        n *= s
    if n * itemsize != len(data):
        raise FormatError(
            f"array buffer holds {len(data)} bytes, shape {tuple(shape)} of {code} needs {n * itemsize}"
        )
    return np.frombuffer(data, dtype=code).reshape(shape).copy()


def pack_counts(a: np.ndarray) -> dict[str, Any]:
    """:func:`pack_array` of float64 counts, in the smallest unsigned integer type that
    holds them exactly when they are all whole numbers below 2**32 (counts of unit-weight
    messages: 1 byte per value in a batch's delta instead of 8), else as float64.

    >>> a = np.array([[0.0, 3.0, 255.0]])
    >>> pack_counts(a)["dtype"], pack_counts(a + 0.5)["dtype"], pack_counts(a * 1000)["dtype"]
    ('|u1', '<f8', '<u4')
    >>> bool((unpack_counts(pack_counts(a), ndim=2) == a).all())
    True
    """
    a = np.asarray(a, dtype=np.float64)
    if a.size:
        low, top = float(a.min()), float(a.max())
        if low >= 0.0 and top < 2.0**32:  # False for NaN and inf
            for t in _COUNT_TYPES:
                if top <= np.iinfo(t).max:
                    narrow = a.astype(t)
                    if np.array_equal(narrow, a):  # whole numbers only: exact
                        return pack_array(narrow)
                    break
    return pack_array(a)


def unpack_counts(obj: Any, ndim: int | None = None) -> np.ndarray:
    """The float64 array of :func:`pack_counts` (or of a float64 :func:`pack_array`)."""
    code = obj.get("dtype") if isinstance(obj, dict) else None
    if code not in ("<f8", "|u1", "<u2", "<u4"):
        raise FormatError(f"expected counts as float64 or unsigned integers, got {code!r}")
    return unpack_array(obj, ndim=ndim).astype(np.float64, copy=False)


def pack_index(a: np.ndarray) -> dict[str, Any]:
    """:func:`pack_array` of int64 indices, as uint32 when they fit (half the bytes).

    >>> pack_index(np.array([0, 5, 2**20]))["dtype"], pack_index(np.array([2**40]))["dtype"]
    ('<u4', '<i8')
    """
    a = np.asarray(a, dtype=np.int64)
    if a.size and a.min() >= 0 and a.max() < 2**32:
        return pack_array(a.astype(np.uint32))
    return pack_array(a)


def unpack_index(obj: Any, ndim: int | None = None) -> np.ndarray:
    """The int64 array of :func:`pack_index` (or of an int64 :func:`pack_array`)."""
    code = obj.get("dtype") if isinstance(obj, dict) else None
    if code not in ("<i8", "<u4"):
        raise FormatError(f"expected indices as int64 or uint32, got {code!r}")
    return unpack_array(obj, ndim=ndim).astype(np.int64, copy=False)


#: One msgpack Packer per thread, kept: ``msgpack.packb`` makes one per call, which took
#: half the time of packing a worker's small maps (outputs, cache entries, rows).
_PACKERS = threading.local()
#: A Packer keeps a buffer as large as the largest object it packed: after one larger
#: than this (a snapshot, a delta of a huge batch) the thread's Packer is let go.
PACKER_KEEP_BYTES = 1 << 20


def dumps(obj: Any) -> bytes:
    """msgpack-encode ``obj`` (bin type for bytes, no ext types): ``msgpack.packb(obj,
    use_bin_type=True)``, with this thread's Packer.

    >>> dumps({"a": [1, 2.5, b"x"]}) == msgpack.packb({"a": [1, 2.5, b"x"]}, use_bin_type=True)
    True
    """
    try:
        pack = _PACKERS.pack
    except AttributeError:
        pack = _PACKERS.pack = msgpack.Packer(use_bin_type=True).pack
    out = pack(obj)
    if len(out) > PACKER_KEEP_BYTES:
        del _PACKERS.pack  # (its buffer goes with it)
    return out


def loads(data: bytes, max_size: int = 1 << 31) -> Any:
    """msgpack-decode trusted-format data (statistics, snapshots), refusing ext types."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FormatError("expected bytes")
    if len(data) > max_size:
        raise FormatError(f"encoded statistics of {len(data)} bytes exceed {max_size}")
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=False, ext_hook=_refuse_ext
        )
    except FormatError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types
        raise FormatError(f"not valid msgpack: {exc}") from None


def _refuse_ext(code: int, data: bytes) -> Any:
    raise FormatError(f"msgpack ext type {code} is not allowed")


def check_header(obj: Any, type_tag: str, version: int) -> int:
    """Validate the ``{"type": .., "v": ..}`` header of an encoded object: the type tag and
    the one format version this code writes (and so reads). Returns the version."""
    if not isinstance(obj, dict):
        raise FormatError(f"expected an encoded {type_tag} map, got {type(obj).__name__}")
    if obj.get("type") != type_tag:
        raise FormatError(f"expected encoded {type_tag!r}, got {obj.get('type')!r}")
    v = obj.get("v")
    if not isinstance(v, int) or isinstance(v, bool) or v != version:
        raise FormatError(
            f"{type_tag} format version {v!r} is not {version}, the one this streamnb reads"
        )
    return v
