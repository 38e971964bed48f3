"""The ``hashes`` payload: tokens hashed by the producer (``streamnb.features.token_hashes``).

A message carrying its tokens' 64-bit hashes must give exactly the row, and through the
daemon exactly the predictions and statistics, that the tokens themselves give; a
malformed one is a dead letter with its reason.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb.exceptions import MalformedMessage
from streamnb.features import Featurizer, token_hash64, token_hashes
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.wire.codec import Limits, decode_input, encode_input
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import (
    assert_same_stats,
    count_spec,
    fast_options,
    produce,
    token_messages,
    url_worker,
)


def as_hashes(m: dict) -> dict:
    out = {k: v for k, v in m.items() if k != "tokens"}
    out["hashes"] = token_hashes(m["tokens"]).astype("<u8").tobytes()
    return out


def test_token_hashes_are_the_documented_hashes():
    toks = ["cheap", "meds", "cheap", "é", ""]
    assert token_hashes(toks).dtype == np.uint64
    assert token_hashes(toks).tolist() == [token_hash64(t) for t in toks]
    assert token_hashes(iter(toks)).tolist() == token_hashes(toks).tolist()
    assert token_hashes([]).size == 0


def test_codec_reads_hashes_as_little_endian_uint64():
    data = (1).to_bytes(8, "little") + (2**64 - 1).to_bytes(8, "little")
    msg = decode_input(msgpack.packb({"hashes": data, "label": "ham"}, use_bin_type=True), "1-0")
    assert msg.payload_kind == "hashes"
    assert msg.payload.tolist() == [1, 2**64 - 1]
    assert decode_input(encode_input("hashes", [7, 8], id="m"), "1-0").payload.tolist() == [7, 8]


@pytest.mark.parametrize("value, reason", [
    (b"\x00" * 12, "bad_type"),          # not a whole number of 8-byte hashes
    ("abcdefgh", "bad_type"),            # a str, not bin
    ([1, 2], "bad_type"),                # an array of ints, not bin
    (b"\x00" * 8 * 6, "too_large"),      # more hashes than max_tokens (5 below)
])
def test_malformed_hashes_are_rejected_with_a_reason(value, reason):
    with pytest.raises(MalformedMessage) as exc:
        decode_input(msgpack.packb({"hashes": value}, use_bin_type=True), "1-0",
                     Limits(max_tokens=5))
    assert exc.value.reason == reason


def test_hashes_and_tokens_together_are_several_payloads():
    with pytest.raises(MalformedMessage) as exc:
        decode_input(msgpack.packb({"hashes": b"", "tokens": ["a"]}, use_bin_type=True), "1-0")
    assert exc.value.reason == "several_payloads"


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.sampled_from(["cheap", "meds", "now", "é", "x" * 30, ""]) | st.text(max_size=8),
                       max_size=40),
       counts=st.sampled_from(["binary", "raw", "log"]), bits=st.sampled_from([2, 10, 20]),
       meta=st.booleans())
def test_a_hashes_row_is_the_tokens_row(tokens, counts, bits, meta):
    f = Featurizer(bits=bits, counts=counts, meta=meta)
    by_tokens = decode_input(encode_input("tokens", tokens), "1-0")
    by_hashes = decode_input(encode_input("hashes", token_hashes(tokens)), "1-0")
    a, b = f.featurize(by_tokens.as_payload()), f.featurize(by_hashes.as_payload())
    assert a == b
    assert b.indices.dtype == np.int32 and b.n_tokens == len(tokens)
    batch = f.featurize_batch([by_hashes.as_payload(), by_tokens.as_payload()])
    assert batch[0] == batch[1] == a


@settings(max_examples=40, deadline=None)
@given(lists=st.lists(st.lists(st.sampled_from(["cheap", "meds", "now", "é", ""]) | st.text(max_size=6),
                               max_size=30), max_size=8),
       counts=st.sampled_from(["binary", "raw"]), bits=st.sampled_from([2, 20]))
def test_a_batch_of_hashes_rows_is_the_rows_one_by_one(lists, counts, bits):
    """featurize_batch masks and sorts the batch's hashes payloads in one pass (binary counts)."""
    f = Featurizer(bits=bits, counts=counts)
    msgs = [decode_input(encode_input("hashes", token_hashes(tokens)), f"{i}-0") for i, tokens in enumerate(lists)]
    assert f.featurize_batch([m.as_payload() for m in msgs]) == [f.featurize(m.as_payload()) for m in msgs]


def test_a_dense_model_rejects_hashes():
    f = Featurizer(input="dense", dim=3)
    with pytest.raises(MalformedMessage) as exc:
        f.featurize(decode_input(encode_input("hashes", [1, 2]), "1-0").as_payload())
    assert exc.value.reason == "incompatible_payload"


@pytest.mark.redis
def test_the_daemon_predicts_and_learns_hashes_as_it_does_tokens(redis_server):
    """Two models, one fed tokens and one fed the same messages as hashes (plus a malformed
    hashes entry): the same predictions, the same statistics, one dead letter."""
    r = redis_server.client()
    msgs = token_messages(600, seed=5, labelled_share=0.7)
    produce(r, "bytok", msgs)
    produce(r, "byhash", [as_hashes(m) for m in msgs[:300]])
    r.xadd(ModelKeys("byhash").input, {"data": msgpack.packb({"hashes": b"\x01" * 9, "label": "ham"})})
    produce(r, "byhash", [as_hashes(m) for m in msgs[300:]])
    w = url_worker(redis_server.url, [count_spec("bytok"), count_spec("byhash")], fast_options("w1"))
    w.run_until_idle()

    def outputs(name: str) -> dict[str, dict]:
        return {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in r.xrange(ModelKeys(name).out))}

    tok, hsh = outputs("bytok"), outputs("byhash")
    assert tok.keys() == hsh.keys() == {m["id"] for m in msgs}
    for i, o in tok.items():
        assert hsh[i]["label"] == o["label"]
        assert hsh[i]["log_proba"] == o["log_proba"]
    assert_same_stats(w.models["byhash"].replica.model, w.models["bytok"].replica.model)
    dead = [decode_output(f[b"data"]) for _, f in r.xrange(ModelKeys("byhash").dead)]
    assert [d["reason"] for d in dead] == ["bad_type"]
    assert "8 bytes each" in dead[0]["detail"]
    assert r.xpending(ModelKeys("byhash").input, GROUP)["pending"] == 0
