"""Tokens payloads hashed from the entry's bytes (C, streamnb.features.wire_tokens) and
through msgpack's str per token (Python), both against msgpack and hashlib.

The oracle decodes the entry with ``msgpack.unpackb`` and hashes each token with
``hashlib.blake2b`` (key ``streamnb-hash-v1``, 8 bytes, little-endian): a row's buckets are
those hashes' low bits, sorted and distinct; the learn-once key is ``tokens:`` + the 16-byte
BLAKE2b of the tokens' UTF-8 joined by NUL. Neither path is compared with the other: each
is compared with the oracle, on generated entries, hand-worked encodings (str8/16/32,
array16/32, map16) and every malformed entry the C step declines.
"""

from __future__ import annotations

import hashlib
import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb.exceptions import MalformedMessage
from streamnb.features import Featurizer
from streamnb.features import wire_tokens as wire
from streamnb.features.hashing import HASH_KEY
from streamnb_workers.wire import codec
from streamnb_workers.wire.codec import Limits, decode_input

needs_c = pytest.mark.skipif(wire._WIRE_TOKENS is None, reason="streamnb.features._speedups is not built")
BITS = 12
FEATURIZER = Featurizer(bits=BITS)


def oracle_row(tokens: list[str]) -> list[int]:
    """Sorted distinct buckets of ``tokens`` by hashlib alone."""
    mask = (1 << BITS) - 1
    return sorted({int.from_bytes(hashlib.blake2b(t.encode("utf-8"), key=HASH_KEY, digest_size=8).digest(),
                                  "little") & mask for t in tokens})


def oracle_key(tokens: list[str]) -> str:
    return "tokens:" + hashlib.blake2b("\x00".join(tokens).encode("utf-8"), digest_size=16).hexdigest()


def decode(data: bytes, c: bool, monkeypatch: pytest.MonkeyPatch, limits: Limits = codec.DEFAULT_LIMITS):
    """decode_input with the C step (``c``) or msgpack's path alone; the message or its
    MalformedMessage."""
    with monkeypatch.context() as m:
        if not c:
            m.setattr(codec, "split_tokens", lambda *a, **k: None)
        try:
            return decode_input(data, "1-0", limits)
        except MalformedMessage as exc:
            return exc


def check_against_oracle(data: bytes, msg) -> None:
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    tokens = obj["tokens"]
    assert list(msg.payload) == tokens and len(msg.payload) == len(tokens)
    row = FEATURIZER.featurize(msg.as_payload())
    assert row.indices.tolist() == oracle_row(tokens)
    assert row.n_tokens == len(tokens)
    if obj.get("label") is not None and obj.get("key") is None:
        assert msg.key == oracle_key(tokens)
    assert (msg.id, msg.label, msg.weight) == (str(obj.get("id", "1-0")), obj.get("label"),
                                               float(obj.get("weight", 1.0)))
    assert msg.meta == obj.get("meta") and msg.unknown_keys == len(set(obj) - codec._KNOWN_KEYS)


token_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
others = st.fixed_dictionaries({}, optional={
    "id": st.text(min_size=1, max_size=20), "label": st.sampled_from(["spam", "ham"]),
    "weight": st.floats(0.5, 3.0), "meta": st.dictionaries(st.text(max_size=5), st.integers(-2**63, 2**64 - 1), max_size=3),
    "zz": st.binary(max_size=5), "key": st.text(min_size=1, max_size=8)})


@pytest.mark.parametrize("c", [pytest.param(True, marks=needs_c), False], ids=["C", "msgpack"])
@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(token_text, max_size=60), fields=others, tokens_first=st.booleans())
def test_tokens_payload_equals_msgpack_and_hashlib(c, tokens, fields, tokens_first, monkeypatch_session):
    body = {"tokens": tokens, **fields} if tokens_first else {**fields, "tokens": tokens}
    data = msgpack.packb(body)
    msg = decode(data, c, monkeypatch_session)
    assert not isinstance(msg, MalformedMessage)
    assert (type(msg.payload) is wire.WireTokens) == c
    check_against_oracle(data, msg)


@pytest.fixture(scope="module")
def monkeypatch_session():
    with pytest.MonkeyPatch.context() as m:
        yield m


def str_item(b: bytes, width: int) -> bytes:
    """A msgpack str of ``b`` in the given header: 0 (fixstr), 8, 16 or 32."""
    if width == 0:
        return bytes([0xA0 | len(b)]) + b
    code, fmt = {8: (0xD9, ">B"), 16: (0xDA, ">H"), 32: (0xDB, ">I")}[width]
    return bytes([code]) + struct.pack(fmt, len(b)) + b


def array(items: list[bytes], width: int) -> bytes:
    head = bytes([0x90 | len(items)]) if width == 0 else (
        b"\xdc" + struct.pack(">H", len(items)) if width == 16 else b"\xdd" + struct.pack(">I", len(items)))
    return head + b"".join(items)


def pairs_map(pairs: list[tuple[bytes, bytes]], width: int) -> bytes:
    head = bytes([0x80 | len(pairs)]) if width == 0 else (
        b"\xde" + struct.pack(">H", len(pairs)) if width == 16 else b"\xdf" + struct.pack(">I", len(pairs)))
    return head + b"".join(k + v for k, v in pairs)


@pytest.mark.parametrize("c", [pytest.param(True, marks=needs_c), False], ids=["C", "msgpack"])
@pytest.mark.parametrize(("str_width", "array_width", "map_width"),
                         [(0, 0, 0), (8, 16, 16), (16, 32, 32), (32, 0, 16)])
def test_every_msgpack_header_width(c, str_width, array_width, map_width, monkeypatch):
    # (a fixstr holds up to 31 bytes, a fixarray 15 items)
    tokens = (["cheap", "x" * {0: 31, 8: 255}.get(str_width, 300), "ümlaut", "", "meds"] * 4
              )[:15 if array_width == 0 else None]
    items = [str_item(t.encode(), str_width) for t in tokens]
    pairs = [(str_item(b"label", 0), str_item(b"spam", 8)),
             (str_item(b"tokens", str_width), array(items, array_width)),
             (str_item(b"id", 0), msgpack.packb(17)), (str_item(b"ts", 0), msgpack.packb(1.5))]
    pairs += [(msgpack.packb(f"k{i}"), msgpack.packb([i, {"a": None}])) for i in range(20 if map_width else 0)]
    data = pairs_map(pairs, map_width)
    msg = decode(data, c, monkeypatch)
    assert (type(msg.payload) is wire.WireTokens) == c
    check_against_oracle(data, msg)
    assert (msg.id, msg.ts, msg.unknown_keys) == ("17", 1.5, 20 if map_width else 0)


def with_tokens(items: bytes, n: int, extra: bytes = b"") -> bytes:
    return b"\x82" + str_item(b"label", 0) + str_item(b"ham", 0) + str_item(b"tokens", 0) + \
        bytes([0x90 | n]) + items + extra


DECLINED = {
    "not UTF-8": (with_tokens(str_item(b"ok", 0) + str_item(b"\xff\xfe", 0), 2), "not_msgpack"),
    "a surrogate": (with_tokens(str_item("\ud800".encode("utf-8", "surrogatepass"), 0), 1), "not_msgpack"),
    "an int item": (with_tokens(str_item(b"ok", 0) + b"\x05", 2), "bad_type"),
    "a bin item": (with_tokens(b"\xc4\x02ok", 1), "bad_type"),
    "cut short": (with_tokens(str_item(b"ok", 0), 2), "not_msgpack"),
    "bytes after the map": (with_tokens(str_item(b"ok", 0), 1, b"\x00"), "not_msgpack"),
    "an ext field": (b"\x82" + str_item(b"tokens", 0) + b"\x91" + str_item(b"a", 0) +
                     str_item(b"meta", 0) + b"\xd4\x01\x00", "bad_type"),
    "tokens not an array": (msgpack.packb({"tokens": "a b"}), "bad_type"),
    "tokens twice": (b"\x82" + str_item(b"tokens", 0) + b"\x91" + str_item(b"a", 0) +
                     str_item(b"tokens", 0) + b"\x91\x05", "bad_type"),
    "not a map": (msgpack.packb([["tokens"]]), "not_a_map"),
    "0xc1": (b"\x82" + str_item(b"tokens", 0) + b"\x90" + str_item(b"id", 0) + b"\xc1", "not_msgpack"),
}


@pytest.mark.parametrize("c", [pytest.param(True, marks=needs_c), False], ids=["C", "msgpack"])
@pytest.mark.parametrize("case", sorted(DECLINED))
def test_a_malformed_entry_gets_its_reason_either_way(c, case, monkeypatch):
    data, reason = DECLINED[case]
    got = decode(data, c, monkeypatch)
    assert isinstance(got, MalformedMessage) and got.reason == reason


@pytest.mark.parametrize("c", [pytest.param(True, marks=needs_c), False], ids=["C", "msgpack"])
@pytest.mark.parametrize(("limits", "reason"), [
    (Limits(max_tokens=3), "too_large"), (Limits(max_array_len=3), "too_large"),
    (Limits(max_str_len=4), "too_large"), (Limits(max_map_len=1), "too_large")])
def test_limits_hold_either_way(c, limits, reason, monkeypatch):
    data = msgpack.packb({"tokens": ["a", "bb", "cc", "dddd", "eeeee"], "label": "ham"})
    got = decode(data, c, monkeypatch, limits)
    assert isinstance(got, MalformedMessage) and got.reason == reason


@needs_c
def test_the_c_step_declines_what_msgpack_must_judge():
    for data, _ in DECLINED.values():
        assert wire.split_tokens(data, max_tokens=100, max_str_len=100, max_map_len=100) is None
    assert wire.split_tokens(msgpack.packb({"text": "hi"}), max_tokens=9, max_str_len=9, max_map_len=9) is None


@needs_c
def test_the_rest_of_the_map_is_the_map_without_its_tokens():
    body = {"id": "m1", "label": "spam", "tokens": ["a", "é"], "weight": 2.0, "meta": {"x": [1, 2]}}
    data = msgpack.packb(body)
    rest, tokens = wire.split_tokens(data, max_tokens=10, max_str_len=10, max_map_len=10)
    assert msgpack.unpackb(rest) == {k: v for k, v in body.items() if k != "tokens"}
    assert tokens.hashes.tolist() == [int.from_bytes(hashlib.blake2b(t.encode(), key=HASH_KEY, digest_size=8)
                                                     .digest(), "little") for t in ["a", "é"]]
    assert tokens.joined_utf8() == "a\x00é".encode() and tokens == ["a", "é"] and tokens[1] == "é"
    assert msgpack.unpackb(data[tokens.start:tokens.end]) == ["a", "é"]


@needs_c
def test_joined_refuses_what_is_not_an_array_of_str():
    joined = wire._JOINED
    assert joined(msgpack.packb([]), 0, 1) == b""
    for data, start, end in [(msgpack.packb([1]), 0, 2), (msgpack.packb(["a"]), 0, 1),
                             (msgpack.packb({"a": 1}), 0, 3), (msgpack.packb(["a"]) + b"x", 0, 4)]:
        with pytest.raises(ValueError):
            joined(data, start, end)
    with pytest.raises(ValueError):
        joined(b"\x90", 0, 5)


@needs_c
def test_a_token_new_to_the_table_is_hashed_by_hashlib():
    fresh = [f"never-seen-{i}-{np.random.default_rng().integers(1 << 60)}" for i in range(40)]
    data = msgpack.packb({"tokens": fresh, "label": "ham"})
    _, tokens = wire.split_tokens(data, max_tokens=100, max_str_len=100, max_map_len=100)
    assert FEATURIZER.featurize(("tokens", tokens)).indices.tolist() == oracle_row(fresh)


@needs_c
def test_near_tokens_from_the_wire_get_their_own_hashes():
    """Tokens that differ in a byte at a chunk's edge, in their length or in a NUL, read
    from the wire after the same tokens were looked up as str and the other way round:
    each gets the hashlib hash of its own bytes (the table's key is the same for a str
    token and its bytes, and different for any two tokens)."""
    from streamnb.features import hashing
    from tests.streamnb.features.test_hashing import near_tokens, oracle_hash

    tokens = near_tokens()
    expected = [oracle_hash(t) for t in tokens]
    ascii_short = [t for t in tokens if t.isascii() and len(t) <= 7]
    # (the short tokens last too: the array's end leaves fewer than 8 bytes to read there)
    for listed in (tokens, tokens + ascii_short):
        data = msgpack.packb({"tokens": listed})
        want = [oracle_hash(t) for t in listed]
        for first_as_str in (True, False):
            hashing.C_TABLE.clear()
            if first_as_str:
                assert hashing.token_hashes(tokens).tolist() == expected
            for _ in range(2):  # new to the table, then found in it
                _, wired = wire.split_tokens(data, max_tokens=10_000, max_str_len=1000, max_map_len=10)
                assert wired.hashes.tolist() == want
            assert hashing.token_hashes(tokens).tolist() == expected
            # each token entered once: its key from the wire is its str's
            assert hashing.C_TABLE.size() == len(tokens)


@needs_c
@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(st.sampled_from(["a", "", "é", "日本", "a\x00", "\U0001f600", "long-token-" * 3]) | token_text,
                       max_size=80))
def test_distinct_tokens_are_msgpacks_tokens_each_once(tokens):
    """What token names count: each distinct token once, in the order of its first
    appearance, as msgpack's list gives them (only the first of each decoded)."""
    data = msgpack.packb({"tokens": tokens, "label": "ham"})
    _, wired = wire.split_tokens(data, max_tokens=1000, max_str_len=1000, max_map_len=10)
    expected = list(dict.fromkeys(msgpack.unpackb(data, raw=False)["tokens"]))
    assert wired.distinct() == expected
    assert wired.tokens() == msgpack.unpackb(data, raw=False)["tokens"]
    assert wired.distinct() == expected  # (decoded by then: from the list)


@needs_c
def test_distinct_refuses_what_is_not_its_array():
    distinct = wire._c.wire_tokens_distinct
    data = msgpack.packb(["a", "b"])
    assert distinct(data, 0, len(data), np.array([1, 1], np.uint64)) == ["a"]
    assert distinct(data, 0, len(data), np.array([0, 0], np.uint64)) == ["a"]  # (0: a hash too)
    for bad in (np.array([1], np.uint64), np.array([1, 2, 3], np.uint64)):
        with pytest.raises(ValueError):
            distinct(data, 0, len(data), bad)
    with pytest.raises(ValueError):
        distinct(msgpack.packb(["a", 1]), 0, 5, np.array([1, 2], np.uint64))
    with pytest.raises(ValueError):
        distinct(data, 0, len(data) + 1, np.array([1, 2], np.uint64))
