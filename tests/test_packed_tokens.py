"""Tokens payloads hashed from the message's bytes (``packed_token_hashes``, C) against
msgpack decoding every token (the reference): the same messages, rows and errors."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb import codec
from streamnb.codec import DEFAULT_LIMITS, InputMessage, Limits, PackedTokens, decode_input
from streamnb.exceptions import MalformedMessage
from streamnb.features import Featurizer, token_hashes
from streamnb.features.hashing import packed_token_hashes
from streamnb.features.text import SPEEDUPS

needs_speedups = pytest.mark.skipif(not SPEEDUPS, reason="streamnb.features._speedups is not built")


@contextmanager
def reference_decoding() -> Iterator[None]:
    """decode_input without the C path: msgpack decodes every token."""
    saved = codec._packed_token_hashes
    codec._packed_token_hashes = lambda data, max_items, max_str_len: None
    try:
        yield
    finally:
        codec._packed_token_hashes = saved


def both_ways(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[object, object]:
    """decode_input's message (or its MalformedMessage) with the C path and without."""
    def one() -> object:
        try:
            return decode_input(data, "1-0", limits)
        except MalformedMessage as exc:
            return exc
    fast = one()
    with reference_decoding():
        ref = one()
    return fast, ref


def fields(msg: InputMessage) -> tuple:
    """A message's fields, its tokens as a list (no token_hashes: not in the reference)."""
    payload = list(msg.payload) if msg.payload_kind == "tokens" else msg.payload
    if isinstance(payload, np.ndarray):
        payload = payload.tolist()
    return (msg.entry_id, msg.id, msg.payload_kind, payload, msg.label, msg.weight, msg.ts,
            msg.ref, msg.meta, msg.unknown_keys)


def assert_same(fast: object, ref: object) -> None:
    if isinstance(ref, MalformedMessage):
        assert isinstance(fast, MalformedMessage), f"C path decoded what msgpack refuses: {ref}"
        assert (fast.reason, fast.detail) == (ref.reason, ref.detail)
        return
    assert isinstance(fast, InputMessage), f"C path refused what msgpack decodes: {fast}"
    assert fields(fast) == fields(ref)
    if fast.token_hashes is not None:
        assert fast.payload_kind == "tokens"
        assert fast.token_hashes.tolist() == token_hashes(list(ref.payload)).tolist()


@needs_speedups
def test_hand_worked_message():
    data = msgpack.packb({"tokens": ["ab", "wörld", "", "ab"], "label": "spam", "id": "m1"})
    # 0x83 map of 3, 0xa6 "tokens", then the array: 0x94, 0xa2 "ab", 0xa6 "wörld" (6 bytes
    # of UTF-8), 0xa0 "", 0xa2 "ab"
    start, end, hashes = packed_token_hashes(data, 100, 100)
    assert (start, end) == (8, 8 + 1 + 3 + 7 + 1 + 3)
    assert data[start:end] == b"\x94\xa2ab\xa6w\xc3\xb6rld\xa0\xa2ab"
    assert hashes.tolist() == token_hashes(["ab", "wörld", "", "ab"]).tolist()
    msg = decode_input(data, "5-0")
    assert isinstance(msg.payload, PackedTokens) and msg.token_hashes is not None
    assert (msg.id, msg.label, msg.payload_kind, len(msg.payload)) == ("m1", "spam", "tokens", 4)
    assert msg.payload == ["ab", "wörld", "", "ab"] and msg.payload[1] == "wörld"


@needs_speedups
def test_every_msgpack_width_of_map_array_and_str():
    """map16/map32, array16/array32, str8/16/32: written by hand (msgpack packs the
    narrowest), read the same as msgpack reads them."""
    def s(text: str, width: int) -> bytes:
        b = text.encode()
        head, fmt = {8: (b"\xd9", ">B"), 16: (b"\xda", ">H"), 32: (b"\xdb", ">I")}[width]
        return head + struct.pack(fmt, len(b)) + b
    items = [s("cheap", 8), s("meds", 16), s("x" * 300, 32), msgpack.packb("now")]
    for array_head in (b"\xdc" + struct.pack(">H", 4), b"\xdd" + struct.pack(">I", 4)):
        for map_head in (b"\xde" + struct.pack(">H", 2), b"\xdf" + struct.pack(">I", 2)):
            data = (map_head + s("label", 32) + msgpack.packb("ham") + s("tokens", 16)
                    + array_head + b"".join(items))
            assert msgpack.unpackb(data)["tokens"] == ["cheap", "meds", "x" * 300, "now"]
            fast, ref = both_ways(data)
            assert isinstance(fast, InputMessage) and fast.token_hashes is not None
            assert_same(fast, ref)


def message_bytes(tokens: list[str], extra: dict, tokens_first: bool) -> bytes:
    obj = {"tokens": tokens, **extra} if tokens_first else {**extra, "tokens": tokens}
    return msgpack.packb(obj)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                    st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
extras = st.fixed_dictionaries({}, optional={
    "label": st.one_of(st.sampled_from(["spam", "ham"]), st.integers(0, 5), values),
    "id": st.one_of(st.text(min_size=1, max_size=12), st.integers(0, 10**6), values),
    "weight": st.one_of(st.floats(0.1, 10), values),
    "ts": st.one_of(st.floats(0, 2e9), values),
    "meta": st.one_of(st.dictionaries(st.text(max_size=5), scalars, max_size=3), values),
    "ref": values,
    "text": values,
    "zzz": values,  # a key the codec does not know
})
token_lists = st.one_of(st.lists(st.text(max_size=12), max_size=40),
                        st.lists(st.sampled_from(["a", "cheap", "meds", "é", "日本", ""]), max_size=40))


@needs_speedups
@settings(max_examples=400, deadline=None)
@given(token_lists, extras, st.booleans())
def test_any_message_decodes_as_msgpack_decodes_it(tokens, extra, tokens_first):
    fast, ref = both_ways(message_bytes(tokens, extra, tokens_first))
    assert_same(fast, ref)
    if isinstance(ref, InputMessage):  # a valid tokens message: the C path took it
        assert ref.payload_kind == "tokens" and fast.token_hashes is not None


@needs_speedups
@settings(max_examples=400, deadline=None)
@given(token_lists, extras, st.booleans(), st.data())
def test_damaged_bytes_give_the_same_message_or_the_same_error(tokens, extra, tokens_first, data):
    """Bytes changed, cut or added anywhere: both ways agree on the result or the error."""
    raw = bytearray(message_bytes(tokens, extra, tokens_first))
    for _ in range(data.draw(st.integers(1, 3))):
        what = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, len(raw)))
        if what == "flip" and at < len(raw):
            raw[at] = data.draw(st.integers(0, 255))
        elif what == "cut":
            del raw[at:]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=3))
    assert_same(*both_ways(bytes(raw)))


@needs_speedups
@pytest.mark.parametrize("data", [
    msgpack.packb({"tokens": ["a", 1]}),                          # an item that is not a str
    msgpack.packb({"tokens": "a b"}),                             # not an array
    msgpack.packb({"tokens": ["a"], "text": "a"}),                # two payloads
    b"\x82\xa6tokens\x91\xa1a\xa6tokens\x91\xa1b",                # "tokens" twice (msgpack keeps the last)
    msgpack.packb({"tokens": ["a"]}) + b"\x00",                   # bytes after the map
    msgpack.packb({"tokens": ["a"]})[:-1],                        # cut short
    b"\x81\xa6tokens\x91\xa2\xff\xfe",                             # a token that is not UTF-8
    b"\x81\xa6tokens\x91\xa3\xed\xa0\x80",                         # a UTF-8 surrogate
    msgpack.packb({"tokens": ["a"], "x": msgpack.ExtType(1, b"z")}),  # an ext elsewhere
    msgpack.packb({"tokens": ["a"], 7: "int key"}),               # a key that is not a str
    b"\x82\xa6tokens\x91\xa1a\xa4deep" + b"\x91" * 70 + b"\x01",          # nested deeper than the C skip goes
    msgpack.packb(["tokens", ["a"]]),                             # not a map
    msgpack.packb({"tokens": ["a"], "label": "x" * 300}),         # a str over the limit elsewhere
])
def test_what_the_c_path_leaves_to_msgpack(data):
    """Each of these is not a plain tokens message: the C path declines (None) or, where
    only the rest of the map is wrong, msgpack's decoding of that rest gives the error."""
    limits = Limits(max_str_len=256)
    assert_same(*both_ways(data, limits))


@needs_speedups
def test_limits_on_the_tokens_array():
    long_token = msgpack.packb({"tokens": ["a", "b" * 40]})
    assert packed_token_hashes(long_token, 10, 39) is None
    assert packed_token_hashes(long_token, 10, 40) is not None
    many = msgpack.packb({"tokens": ["a"] * 11})
    assert packed_token_hashes(many, 10, 40) is None and packed_token_hashes(many, 11, 40) is not None
    for limits in (Limits(max_tokens=10), Limits(max_str_len=39), Limits(max_array_len=10)):
        for data in (long_token, many):
            fast, ref = both_ways(data, limits)
            assert_same(fast, ref)
    fast, _ = both_ways(many, Limits(max_tokens=10))
    assert isinstance(fast, MalformedMessage) and fast.reason == "too_large"


def test_without_the_c_path_tokens_are_a_list():
    with reference_decoding():
        msg = decode_input(msgpack.packb({"tokens": ["cheap", "meds"]}), "1-0")
    assert type(msg.payload) is list and msg.token_hashes is None


@needs_speedups
def test_rows_equal_both_ways_in_every_featurizer_mode():
    data = [msgpack.packb({"tokens": ["cheap", "meds", "cheap", "日本", f"t{i}"], "label": "spam"})
            for i in range(30)]
    fast = [decode_input(d, f"{i}-0") for i, d in enumerate(data)]
    with reference_decoding():
        ref = [decode_input(d, f"{i}-0") for i, d in enumerate(data)]
    for options in ({}, {"counts": "raw"}, {"counts": "log"}, {"meta": True}):
        f = Featurizer(bits=12, **options)
        assert f.featurize_batch(fast) == f.featurize_batch(ref)
        assert [f.featurize(m) for m in fast] == [f.featurize(m) for m in ref]
        assert [f.tokens(m) for m in fast] == [f.tokens(m) for m in ref]


@needs_speedups
@pytest.mark.corpus
def test_corpus_tokens_payloads_decode_and_featurize_the_same(corpus_dir):
    from benchmarks._common import load_corpus
    from benchmarks.end_to_end import repeated_messages

    data = repeated_messages(load_corpus(corpus_dir), "tokens", 1)
    fast = [decode_input(d, f"{i}-0") for i, d in enumerate(data)]
    with reference_decoding():
        ref = [decode_input(d, f"{i}-0") for i, d in enumerate(data)]
    assert len(data) == 3250 and all(m.token_hashes is not None for m in fast)
    assert sum(len(m.payload) for m in ref) > 1_000_000
    for a, b in zip(fast, ref, strict=True):
        assert_same(a, b)
    f = Featurizer()
    for i in range(0, len(data), 200):
        assert f.featurize_batch(fast[i:i + 200]) == f.featurize_batch(ref[i:i + 200])
