"""``streamnb._kernels.pack_map`` and ``pack_array`` against msgpack, the oracle: the bytes
of ``msgpack.packb(obj, use_bin_type=True)`` for the dict and list they stand for, on
generated nested values, every header width and the errors."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb._cmodules import optional_c_module

_k = optional_c_module("streamnb._kernels")
pytestmark = pytest.mark.skipif(
    getattr(_k, "pack_map", None) is None, reason="streamnb._kernels is not built"
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=40)
    | st.sampled_from(
        [
            math.nan,
            -0.0,
            math.inf,
            2**63,
            -(2**63),
            127,
            128,
            -32,
            -33,
            255,
            256,
            65535,
            65536,
            2**32 - 1,
            2**32,
            -128,
            -129,
            -32768,
            -32769,
            -(2**31),
            -(2**31) - 1,
        ]
    )
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=20)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8) | st.integers(-5, 300), inner, max_size=20)
    ),
    max_leaves=60,
)


def oracle(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.text(max_size=40), values | st.none()), max_size=20, unique_by=lambda kv: kv[0]
    ),
    required=st.integers(0, 20),
)
def test_pack_map_is_msgpacks_dict_without_the_optional_nones(pairs, required):
    keys, vals = tuple(k for k, _ in pairs), tuple(v for _, v in pairs)
    want = {k: v for i, (k, v) in enumerate(pairs) if i < required or v is not None}
    assert _k.pack_map(keys, vals, required) == oracle(want)


@settings(max_examples=300, deadline=None)
@given(items=st.lists(values, max_size=20), prefix=st.binary(max_size=10))
def test_pack_array_is_msgpacks_list_after_the_prefix(items, prefix):
    assert _k.pack_array(items, prefix) == prefix + oracle(items)
    assert _k.pack_array(tuple(items), b"") == oracle(items)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536])
def test_every_header_width(n):
    text, blob = "x" * n, b"y" * n
    many = list(range(n))
    assert _k.pack_array([text, blob, bytearray(blob), memoryview(blob)], b"") == oracle(
        [text, blob, bytearray(blob), memoryview(blob)]
    )
    assert _k.pack_array(many, b"") == oracle(many)
    d = {str(i): i for i in range(n)}
    assert _k.pack_map(("d",), (d,), 1) == oracle({"d": d})
    keys = tuple(str(i) for i in range(n))
    assert _k.pack_map(keys, tuple(range(n)), n) == oracle(d)


def test_subclasses_pack_as_their_base():
    class D(dict):
        pass

    class L(list):
        pass

    class F(float):
        pass

    obj = [D(a=1), L([1, 2]), F(2.5), True, "é", "日本\U0001f600"]
    assert _k.pack_array(obj, b"") == oracle(obj)


def test_errors_are_msgpacks():
    for bad in (object(), {1, 2}, 2**64, -(2**63) - 1, "\ud800"):
        with pytest.raises(Exception) as theirs:
            oracle([bad])
        with pytest.raises(type(theirs.value)):
            _k.pack_array([bad], b"")
    deep: list = []
    for _ in range(1024):
        deep = [deep]
    assert _k.pack_array(deep, b"") == oracle(deep)  # (1,025 levels: the most)
    for _ in range(2):
        deep = [deep]
        with pytest.raises(ValueError):
            oracle(deep)
        with pytest.raises(ValueError):
            _k.pack_array(deep, b"")
    with pytest.raises(TypeError):
        _k.pack_map(("a", "b"), (1,), 1)
    with pytest.raises(TypeError):
        _k.pack_map((1,), (1,), 1)
