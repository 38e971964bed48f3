"""The strict wire codec: one test per reason code, valid messages, outputs, fuzzing."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb.exceptions import MalformedMessage
from streamnb_workers.wire.codec import (
    DEFAULT_LIMITS,
    InputMessage,
    Limits,
    decode_input,
    encode_input,
)
from streamnb_workers.wire.outputs import decode_output, encode_dead, encode_output, output_for


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def reason_of(data, **kw) -> str:
    with pytest.raises(MalformedMessage) as info:
        decode_input(data, "1-0", **kw)
    assert info.value.detail  # every rejection says what was expected
    return info.value.reason


# ------------------------------------------------------------------ valid input
def test_each_payload_kind_decodes():
    raw = decode_input(pack({"raw": b"Subject: x\n\nhi", "id": "m1"}), "5-0")
    assert (raw.payload_kind, raw.payload, raw.id, raw.entry_id) == ("raw", b"Subject: x\n\nhi", "m1", "5-0")
    assert decode_input(pack({"text": "hello"}), "1-0").payload == "hello"
    assert decode_input(pack({"tokens": ["a", "b"]}), "1-0").payload == ["a", "b"]
    assert decode_input(pack({"features": {"f": 2, "g": 0.5}}), "1-0").payload == {"f": 2.0, "g": 0.5}
    x = decode_input(pack({"x": [1, 2.5, -3]}), "1-0").payload
    assert x.dtype == np.float64 and x.tolist() == [1.0, 2.5, -3.0]


def test_defaults_and_optional_fields():
    m = decode_input(pack({"text": "t"}), "7-1")
    assert (m.id, m.label, m.weight, m.ts, m.ref, m.meta, m.unknown_keys) == ("7-1", None, 1.0, None, None, None, 0)
    m = decode_input(
        pack({"text": "t", "label": "spam", "weight": 2, "ts": 1700000000, "meta": {"k": [1]}}), "7-1"
    )
    assert (m.label, m.weight, m.ts, m.meta) == ("spam", 2.0, 1.7e9, {"k": [1]})
    assert decode_input(pack({"text": "t", "label": 3}), "1-0").label == 3
    assert decode_input(pack({"text": "t", "id": 42}), "1-0").id == "42"


def test_raw_given_as_str_is_encoded_utf8():
    assert decode_input(pack({"raw": "Subject: é\n\nx"}), "1-0").payload == "Subject: é\n\nx".encode()


def test_unknown_keys_are_ignored_but_counted():
    m = decode_input(pack({"text": "t", "future": 1, "other": {"a": 1}, 7: 1}), "1-0")
    assert m.unknown_keys == 3 and m.payload == "t"


def test_delayed_label_with_ref_is_valid():
    m = decode_input(pack({"ref": "m1", "label": "ham"}), "9-0")
    assert (m.payload_kind, m.payload, m.ref, m.label) == (None, None, "m1", "ham")


def test_nil_payload_counts_as_absent():
    assert decode_input(pack({"text": "t", "x": None}), "1-0").payload_kind == "text"


# ------------------------------------------------------------------ reason codes
@pytest.mark.parametrize(
    "data",
    [b"\xc1", b"", pack({"text": "t"}) + b"\x00", b"\x81\xa4text", b"\xa3\xff\xfe\xfd", "not bytes"],
)
def test_not_msgpack(data):
    assert reason_of(data) == "not_msgpack"


def test_deeply_nested_msgpack_is_not_msgpack_not_a_crash():
    assert reason_of(b"\x91" * 100_000 + b"\xc0") in ("not_msgpack", "too_large")


def test_ext_types_are_refused():
    data = msgpack.packb({"text": "t", "meta": msgpack.ExtType(5, b"abc")})
    assert reason_of(data) in ("bad_type", "too_large")


@pytest.mark.parametrize("obj", [[1, 2], "text", 3, None, b"raw"])
def test_not_a_map(obj):
    assert reason_of(pack(obj)) == "not_a_map"


def test_too_large_message_50_mib_raw():
    data = pack({"raw": b"x" * (50 << 20)})
    assert reason_of(data) == "too_large"


def test_too_large_item_inside_the_size_limit():
    limits = Limits(max_str_len=10)
    assert reason_of(pack({"text": "x" * 11}), limits=limits) == "too_large"
    assert reason_of(pack({"tokens": ["a"] * 20}), limits=Limits(max_array_len=5)) == "too_large"
    assert reason_of(pack({"tokens": ["a"] * 20}), limits=Limits(max_tokens=5)) == "too_large"
    assert reason_of(pack({"features": {str(i): 1 for i in range(9)}}), limits=Limits(max_features=8)) == "too_large"


def test_no_payload():
    assert reason_of(pack({"id": "m1", "label": "spam"})) == "no_payload"
    assert reason_of(pack({})) == "no_payload"


@pytest.mark.parametrize(
    "obj", [{"raw": b"a", "text": "b"}, {"tokens": ["a"], "x": [1.0]}, {"text": "a", "ref": "m1", "label": "ham"}]
)
def test_several_payloads(obj):
    assert reason_of(pack(obj)) == "several_payloads"


@pytest.mark.parametrize(
    ("obj", "key"),
    [
        ({"raw": 12}, "raw"),
        ({"text": b"bytes"}, "text"),
        ({"tokens": ["a", 1]}, "tokens"),
        ({"tokens": "a b"}, "tokens"),
        ({"features": {"a": "1"}}, "features"),
        ({"features": {"a": True}}, "features"),
        ({"features": [1, 2]}, "features"),
        ({"x": [1.0, "2"]}, "x"),
        ({"x": [True, 1.0]}, "x"),
        ({"x": 3.0}, "x"),
        ({"text": "t", "id": [1]}, "id"),
        ({"text": "t", "id": ""}, "id"),
        ({"text": "t", "ts": "yesterday"}, "ts"),
        ({"text": "t", "meta": [1]}, "meta"),
        ({"ref": 5, "label": "ham"}, "ref"),
    ],
)
def test_bad_type_names_the_key(obj, key):
    with pytest.raises(MalformedMessage) as info:
        decode_input(pack(obj), "1-0")
    assert info.value.reason == "bad_type"
    assert key in info.value.detail


@pytest.mark.parametrize(
    "obj",
    [
        {"x": [1.0, math.nan]},
        {"x": [math.inf]},
        {"features": {"a": -math.inf}},
        {"text": "t", "ts": math.nan},
        {"x": [1.0, -math.inf, 2.0]},
    ],
)
def test_non_finite(obj):
    assert reason_of(pack(obj)) == "non_finite"


@pytest.mark.parametrize("label", [True, 1.5, "", "x" * 300, [1], {"a": 1}, 2**64 - 1])
def test_bad_label(label):
    assert reason_of(pack({"text": "t", "label": label})) == "bad_label"


def test_ref_without_label_is_bad_label():
    assert reason_of(pack({"ref": "m1"})) == "bad_label"


@pytest.mark.parametrize("weight", [0, -1, math.nan, math.inf, "2", True])
def test_bad_weight(weight):
    assert reason_of(pack({"text": "t", "weight": weight})) == "bad_weight"


def test_wrong_dimension_when_expected_dim_given():
    assert reason_of(pack({"x": [1.0, 2.0, 3.0]}), expected_dim=4) == "wrong_dimension"
    assert reason_of(pack({"x": []})) == "wrong_dimension"
    with pytest.raises(MalformedMessage, match="x has 3 values, but this model expects 4"):
        decode_input(pack({"x": [1.0, 2.0, 3.0]}), "1-0", expected_dim=4)
    assert decode_input(pack({"x": [1.0, 2.0]}), "1-0", expected_dim=2).payload.size == 2


def test_limits_default_is_eight_mib_an_entry():
    # (mail up to it is decoded whole, then cut to --max-bytes by the featurizer)
    assert DEFAULT_LIMITS.max_message_bytes == 8 << 20
    ok = pack({"raw": b"x" * ((8 << 20) - 100)})
    assert decode_input(ok, "1-0").payload_kind == "raw"
    assert reason_of(pack({"raw": b"x" * (8 << 20)})) == "too_large"


# ------------------------------------------------------------------ outputs
def test_encode_output_round_trip_and_keys():
    data = encode_output("m1", "3-0", "spam", {"spam": -0.01, "ham": -4.6}, 12, "w-1",
                         true_label="ham", learned=True, meta={"mailbox": "a"})
    out = decode_output(data)
    assert out == {"id": "m1", "entry": "3-0", "label": "spam", "log_proba": {"spam": -0.01, "ham": -4.6},
                   "model_version": 12, "worker": "w-1", "true_label": "ham", "learned": True,
                   "meta": {"mailbox": "a"}}
    unlabelled = decode_output(encode_output("m2", "4-0", 1, {1: -0.5, 0: -0.9}, 1, "w"))
    assert "true_label" not in unlabelled and "learned" not in unlabelled
    assert unlabelled["log_proba"] == {1: -0.5, 0: -0.9}


def test_output_for_takes_id_entry_label_meta_from_the_input():
    msg = decode_input(pack({"text": "t", "id": "m9", "label": "ham", "meta": {"q": 1}}), "8-0")
    out = decode_output(output_for(msg, "spam", {"spam": -0.1, "ham": -2.3}, 4, "w", learned=True))
    assert (out["id"], out["entry"], out["true_label"], out["learned"], out["meta"]) == ("m9", "8-0", "ham", True, {"q": 1})


def test_encode_dead_keeps_the_original_bytes():
    out = decode_output(encode_dead("2-0", "non_finite", "x contains NaN", b"\x81\xa1x\x91\xcb"))
    assert out == {"entry": "2-0", "reason": "non_finite", "detail": "x contains NaN", "payload": b"\x81\xa1x\x91\xcb"}


def test_encode_input_round_trip():
    m = decode_input(encode_input("x", np.array([1.0, 2.0]), label="a", weight=0.5), "1-0")
    assert (m.payload.tolist(), m.label, m.weight) == ([1.0, 2.0], "a", 0.5)
    assert isinstance(m, InputMessage)


def test_decode_output_rejects_garbage():
    with pytest.raises(MalformedMessage):
        decode_output(b"\xc1")


# ------------------------------------------------------------------ fuzz
json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
payload_maps = st.dictionaries(
    st.sampled_from(["id", "raw", "text", "tokens", "features", "x", "label", "weight", "ts", "ref", "meta", "zz"]),
    json_like,
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(payload_maps)
def test_fuzz_maps_only_raise_malformed(obj):
    try:
        m = decode_input(pack(obj), "1-0")
    except MalformedMessage as exc:
        assert exc.reason in {
            "not_msgpack", "not_a_map", "too_large", "no_payload", "several_payloads", "bad_type",
            "non_finite", "bad_label", "bad_weight", "wrong_dimension",
        }
    else:
        assert m.payload_kind in (None, "raw", "text", "tokens", "features", "x")
        assert m.weight > 0 and math.isfinite(m.weight)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_bytes_only_raise_malformed(data):
    try:
        decode_input(data, "1-0")
    except MalformedMessage:
        pass


def test_a_class_removal_goes_alone():
    msg = decode_input(pack({"forget_class": "Spam", "id": "fix-1", "ts": 5}), "1-0")
    assert (msg.forget_class, msg.id, msg.ts, msg.payload_kind, msg.label) == \
        ("Spam", "fix-1", 5.0, None, None)
    assert decode_input(pack({"forget_class": 3}), "1-0").forget_class == 3
    for extra in ({"text": "x"}, {"ref": "m1"}, {"label": "spam"}, {"forget": True},
                  {"weight": 2.0}, {"key": "k"}):
        assert reason_of(pack({"forget_class": "Spam", **extra})) == "several_payloads"
    assert reason_of(pack({"forget_class": ""})) == "bad_label"
    assert reason_of(pack({"forget_class": True})) == "bad_label"
    assert decode_input(pack({"forget_class": "Spam", "id": 7}), "1-0").id == "7"
    assert reason_of(pack({"forget_class": "Spam", "id": 1.5})) == "bad_type"
    assert reason_of(pack({"forget_class": "Spam", "ts": "now"})) == "bad_type"
