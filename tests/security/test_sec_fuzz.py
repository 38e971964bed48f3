"""Fuzzing the untrusted-input path: msgpack decoding and the e-mail tokenizer.

Random and mutated inputs (mutations of real corpus messages when the corpus is present)
never raise anything but MalformedMessage from ``decode_input``, nothing at all from the
tokenizer, and cost a bounded CPU time per message (a generous ceiling: the limits, not
tight timing, are what keeps the cost low).
"""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamnb.exceptions import MalformedMessage
from streamnb.features import PAYLOAD_KINDS, Featurizer, MailTokenizer, Payload
from streamnb.models import make_model
from streamnb_workers.wire.codec import DEFAULT_LIMITS, InputMessage, decode_input
from tests.helpers.hostile import CPU_CEILING_S, corpus_messages

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOKENIZER = MailTokenizer()
FEATURIZER = Featurizer.from_config({"bits": 12})
MODEL = make_model("multinomial", n_features=FEATURIZER.n_columns).partial_fit(
    FEATURIZER.stack([FEATURIZER.featurize(Payload("text", t))
                      for t in ("cheap meds now", "meeting notes today")]), ["spam", "ham"])


def _decode(data: bytes) -> InputMessage | None:
    """decode_input under a CPU ceiling; None for a MalformedMessage (anything else fails)."""
    t0 = time.process_time()
    try:
        msg = decode_input(data, "1-0")
    except MalformedMessage as exc:
        assert exc.reason and " " not in exc.reason, exc  # a short code, usable as a label
        msg = None
    assert time.process_time() - t0 < CPU_CEILING_S
    return msg


def _check_message(msg: InputMessage) -> None:
    assert msg.payload_kind in (*PAYLOAD_KINDS, None)
    assert (msg.payload_kind is None) == (msg.payload is None)
    assert np.isfinite(msg.weight) and msg.weight > 0
    assert msg.label is None or type(msg.label) in (str, int)
    if msg.payload_kind is None:
        assert msg.ref and msg.label is not None


def _featurize_and_predict(msg: InputMessage) -> None:
    """The rest of the worker's path: featurize, stack, predict; only MalformedMessage."""
    t0 = time.process_time()
    try:
        row = FEATURIZER.featurize(msg.as_payload())
    except MalformedMessage:
        return
    lp = MODEL.predict_log_proba(FEATURIZER.stack([row]))
    assert np.isfinite(lp).all() and np.allclose(np.exp(lp).sum(axis=1), 1.0)
    assert row.n_tokens <= max(DEFAULT_LIMITS.max_tokens, DEFAULT_LIMITS.max_features)
    assert time.process_time() - t0 < CPU_CEILING_S


def _tokenize(raw: bytes) -> list[str]:
    t0 = time.process_time()
    a = TOKENIZER.analyse(raw)
    assert time.process_time() - t0 < CPU_CEILING_S
    assert isinstance(a.tokens, list) and all(isinstance(t, str) for t in a.tokens)
    assert len(a.tokens) <= DEFAULT_LIMITS.max_tokens
    assert np.isfinite(a.meta()).all()
    return a.tokens


# ------------------------------------------------------------------------- msgpack decoder
@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_decode_or_malformed(data: bytes) -> None:
    msg = _decode(data)
    if msg is not None:
        _check_message(msg)


_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**64), max_value=2**64 - 1)
            | st.floats() | st.text(max_size=40) | st.binary(max_size=40))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=6)
                       | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=6),
                       max_leaves=30)
_keys = st.sampled_from([*PAYLOAD_KINDS, "id", "label", "weight", "ts", "ref", "meta", "zz"])


@FUZZ
@given(st.dictionaries(_keys, _values, max_size=6))
def test_structured_maps_decode_or_malformed(obj: dict) -> None:
    try:
        data = msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, ValueError):  # ints beyond 64 bits cannot even be encoded
        return
    msg = _decode(data)
    if msg is not None:
        _check_message(msg)
        _featurize_and_predict(msg)


@FUZZ
@given(st.sampled_from(PAYLOAD_KINDS), _values, st.data())
def test_each_payload_kind_with_any_value(kind: str, value: object, data: st.DataObject) -> None:
    fields = data.draw(st.dictionaries(st.sampled_from(["label", "weight", "ts", "id", "meta"]),
                                       _scalars, max_size=3))
    try:
        packed = msgpack.packb({kind: value, **fields}, use_bin_type=True)
    except (OverflowError, ValueError):
        return
    msg = _decode(packed)
    if msg is not None:
        assert msg.payload_kind == kind
        _check_message(msg)
        _featurize_and_predict(msg)


@pytest.mark.parametrize("data, reason", [
    (b"\x91" * 200_000 + b"\xc0", "not_msgpack"),  # arrays nested 200k deep
    # length prefixes far beyond the data: refused as too long or as truncated, never allocated
    (b"\xdd\xff\xff\xff\xff", "too_large|not_msgpack"),  # array32 announcing 4G items
    (b"\xdf\xff\xff\xff\xff", "too_large|not_msgpack"),  # map32 announcing 4G entries
    (b"\xc6\xff\xff\xff\xff", "too_large|not_msgpack"),  # bin32 announcing 4 GB
    (b"\xdb\x00\x10\x00\x01" + b"a" * 10, "too_large|not_msgpack"),  # str32 above the limit
    (b"\xc7\x01\x05x", "bad_type"),  # ext types are refused (max_ext_len=0)
    (msgpack.packb({"raw": b"x" * (8 << 20)}), "too_large"),  # over max_message_bytes
    (msgpack.packb({"tokens": ["t"] * 60_000}), "too_large"),  # over max_tokens
    (msgpack.packb({"x": [1.0] * 100_001}), "too_large"),  # over max_array_len
    (msgpack.packb([1, 2]), "not_a_map"),
    (msgpack.packb({"text": "a", "tokens": ["b"]}), "several_payloads"),
    (msgpack.packb({"features": {"a": float("nan")}}), "non_finite"),
    (msgpack.packb({"x": [1e308 * 10]}), "non_finite"),
    (msgpack.packb({"x": [2**64 - 1, 1.0]}), None),  # a huge int is still a finite float
    (msgpack.packb({"text": "a", "label": 2**63}), "bad_label"),
    (msgpack.packb({"text": "a", "label": [1]}), "bad_label"),
    (msgpack.packb({"text": "a", "weight": 0}), "bad_weight"),
    (msgpack.packb({"text": "a", "weight": True}), "bad_weight"),
    (msgpack.packb({"ref": "m1"}), "bad_label"),
    (msgpack.packb({"ref": "m" * 600, "label": "x"}), "bad_type"),
])
def test_crafted_msgpack_rejected_with_reason(data: bytes, reason: str | None) -> None:
    t0 = time.process_time()
    if reason is None:
        assert decode_input(data, "1-0").payload_kind == "x"
    else:
        with pytest.raises(MalformedMessage) as info:
            decode_input(data, "1-0")
        assert info.value.reason in reason.split("|"), info.value
    assert time.process_time() - t0 < CPU_CEILING_S


def test_limits_are_enforced_before_allocation() -> None:
    """A 4 GB length prefix is refused at once, without reserving the memory."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for prefix in (b"\xc6", b"\xdb", b"\xdd", b"\xdf"):
        with pytest.raises(MalformedMessage):
            decode_input(prefix + b"\xff\xff\xff\xff" + b"\x00" * 64, "1-0")
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 64 << 20


# ------------------------------------------------------------------------- e-mail tokenizer
_MIME_PIECES = st.sampled_from([
    b"From: a <b@c.example>\n", b"To: x@y.example, \"q\\\"\" <z@w.example>\n", b"Subject: ",
    b"=?utf-8?b?w6k=?=", b"=?x-unknown?q?=FF?=", b"=?utf-8?q?", b"Content-Type: multipart/mixed; boundary=\"b\"\n",
    b"Content-Type: text/html; charset=utf-8\n", b"Content-Type: text/plain; charset=bogus\n",
    b"Content-Transfer-Encoding: base64\n", b"Content-Transfer-Encoding: quoted-printable\n",
    b"Content-Disposition: attachment; filename=\"a.exe\"\n", b"\n", b"\r\n", b"--b\n", b"--b--\n",
    b"<html><body><a href=\"http://x.example/\">", b"<!--", b"-->", b"<script>", b"<style",
    b"&amp;&#x41;&#99999999;", b"=\n", b"=ZZ", b"QUJD\n", b"====", b"\xff\xfe\xc3", b"\x00",
    b"http://www.ex.example/p?q", b"Received: from h.example ([1.2.3.4]) by m.example\n",
    b"word ", b"FREE!!! $$$ ", b" " * 20, b"\t",
])


@FUZZ
@given(st.binary(max_size=4096))
def test_tokenizer_random_bytes(raw: bytes) -> None:
    _tokenize(raw)


@FUZZ
@given(st.lists(_MIME_PIECES | st.binary(max_size=16), max_size=120))
def test_tokenizer_mime_fragments(pieces: list[bytes]) -> None:
    raw = b"".join(pieces)
    _tokenize(raw)
    _featurize_and_predict(decode_input(msgpack.packb({"raw": raw}), "1-0"))


def _mutate(raw: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    b = bytearray(raw)
    for op, pos, val in ops:
        if not b:
            b = bytearray(b"\n")
        i = pos % len(b)
        if op == 0:
            b[i] = val
        elif op == 1:
            del b[i: i + val]
        elif op == 2:
            b[i:i] = bytes([val]) * (val % 64 + 1)
        elif op == 3:
            b[i:i] = b[i: i + val * 16]  # duplicate a chunk
        else:
            del b[i:]
    return bytes(b)


_OPS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2**31), st.integers(0, 255)),
                min_size=1, max_size=12)


@pytest.mark.corpus
def test_tokenizer_mutated_corpus_messages(corpus_dir) -> None:
    messages = corpus_messages(corpus_dir, 40, stride=80)

    @FUZZ
    @given(st.sampled_from(messages), _OPS)
    def run(raw: bytes, ops: list[tuple[int, int, int]]) -> None:
        mutated = _mutate(raw, ops)
        _tokenize(mutated)
        msg = _decode(msgpack.packb({"raw": mutated, "label": "spam"}))
        assert msg is not None and msg.payload == mutated
        _featurize_and_predict(msg)
        _decode(_mutate(msgpack.packb({"raw": raw, "label": "ham"}), ops))  # the wire bytes too

    run()


@pytest.mark.corpus
def test_corpus_messages_tokenize_without_error_defects(corpus_dir) -> None:
    """Unmutated real mail: no tokenizer exception is swallowed as an ``error_`` defect."""
    for raw in corpus_messages(corpus_dir, 300, stride=10):
        tokens = _tokenize(raw)
        assert not [t for t in tokens if t.startswith(("defect:error_", "defect:recursion"))]
