"""Learn-once keys of messages (workers/wire/learn_keys.py): pure functions, no Redis."""

from __future__ import annotations

import email

import numpy as np
import pytest

from streamnb_workers.wire.codec import decode_input, encode_input
from streamnb_workers.wire.learn_keys import (
    MAX_KEY_CHARS,
    decode_record,
    encode_record,
    mail_key,
    message_key,
)


@pytest.mark.parametrize(("mail", "key"), [
    (b"Subject: hi\r\nMessage-ID:  <A1@x.org>\r\n\r\nbody", "mid:A1@x.org"),
    (b"message-id: <a@b>\nSubject: s\n\nbody", "mid:a@b"),
    (b"Message-Id:\n <folded@b>\nX: y\n\nbody", "mid:folded@b"),
    (b"Message-ID : <space@b>\n\n", "mid:space@b"),
    (b"Message-ID: no-brackets@b  \n\nbody", "mid:no-brackets@b"),
    (b"Message-ID: <first@b>\nMessage-ID: <second@b>\n\n", "mid:first@b"),
])
def test_a_mail_is_keyed_by_its_message_id(mail, key):
    assert mail_key(mail) == key


@pytest.mark.parametrize("mail", [
    b"Subject: x\n\nbody",
    b"X-Message-ID: <not@this>\nSubject: s\n\nbody",
    b"Subject: s\n\nMessage-ID: <in@the-body>\n",
    b"Subject: s\r\n\r\nMessage-ID: <in@the-body>\r\n",
    b"Message-ID: <>\n\nbody",
    b"Message-ID: <" + b"x" * MAX_KEY_CHARS + b">\n\nbody",
])
def test_without_a_usable_message_id_a_mail_is_keyed_by_its_bytes(mail):
    key = mail_key(mail)
    assert key.startswith("raw:") and len(key) == 4 + 32
    assert mail_key(mail + b"!") != key


def test_the_key_does_not_depend_on_where_the_mail_was_read_from():
    mail = b"From: a@b\nMessage-ID: <m1@x>\nSubject: s\n\nbody"
    assert mail_key(mail) == mail_key(mail.replace(b"\n", b"\r\n")) == "mid:m1@x"
    assert email.message_from_bytes(mail)["Message-ID"] == "<m1@x>"


def test_a_key_given_by_the_producer_wins_and_payloads_have_canonical_keys():
    assert message_key("hi", "text", key="k") == "k"
    assert message_key("hi", "text") != message_key("hi ", "text")
    assert message_key(["a", "b"], "tokens") != message_key(["ab"], "tokens")
    assert message_key({"a": 1, "b": 2.0}, "features") == message_key({"b": 2, "a": 1.0}, "features")
    assert message_key(np.array([1.0, 2.0]), "x") == message_key([1, 2], "x")


def test_the_codec_keys_labelled_messages_and_forgets_only():
    labelled = decode_input(encode_input("text", "cheap meds", label="spam"), "1-0")
    assert labelled.key == message_key("cheap meds", "text")
    assert decode_input(encode_input("text", "cheap meds"), "1-0").key is None
    forget = decode_input(encode_input("text", "cheap meds", forget=True, label="ham"), "1-0")
    assert forget.forget and forget.label is None and forget.key == labelled.key
    given = decode_input(encode_input("text", "x", key="k1", label="spam"), "1-0")
    assert given.key == "k1"


@pytest.mark.parametrize(("fields", "reason"), [
    ({"text": "x", "key": ""}, "bad_type"),
    ({"text": "x", "key": 7}, "bad_type"),
    ({"text": "x", "key": "k" * (MAX_KEY_CHARS + 1)}, "bad_type"),
    ({"text": "x", "forget": 1}, "bad_type"),
    ({"forget": True, "key": "k"}, "no_payload"),
])
def test_bad_keys_and_forgets_are_refused(fields, reason):
    import msgpack

    from streamnb.exceptions import MalformedMessage

    with pytest.raises(MalformedMessage) as exc:
        decode_input(msgpack.packb(fields), "1-0")
    assert exc.value.reason == reason


def test_a_record_holds_the_label_and_weight_learnt():
    assert decode_record(encode_record("spam", 2.5)) == ("spam", 2.5)
    assert decode_record(encode_record(3, 1)) == (3, 1.0)


def _message_id_by_copies(raw: bytes) -> bytes | None:
    """The Message-ID search of learn_keys before it searched in one pass (8e34d49): the
    header block copied behind a line break, lower-cased, searched, its value cut out. Kept
    here as the reference of the one-pass search."""
    end = raw.find(b"\n\n", 0, 256 * 1024)
    end_crlf = raw.find(b"\n\r\n", 0, end if end >= 0 else 256 * 1024)
    end = end_crlf if end_crlf >= 0 else end
    head = b"\n" + raw[:end + 1 if end >= 0 else 256 * 1024]
    low = head.lower()
    at = low.find(b"\nmessage-id")
    while at >= 0:
        if low[at + 11:at + 75].lstrip(b" \t").startswith(b":"):
            start = end = low.index(b":", at + 1) + 1
            while True:
                end = head.find(b"\n", end)
                if end < 0 or head[end + 1:end + 2] not in (b" ", b"\t"):
                    break
                end += 1
            return head[start:end if end >= 0 else len(head)]
        at = low.find(b"\nmessage-id", at + 1)
    return None


_PIECES = [b"Message-ID", b"message-id", b"MESSAGE-Id", b"X-Message-ID", b"Message-IDs", b":", b" ", b"\t",
           b" " * 70, b"<a@b>", b"<", b">", b"\n", b"\r\n", b"\n\n", b"\r\n\r\n", b"\n ", b"\n\t", b"x", b"Subject: s"]


def _message_id_searches():
    from streamnb_workers.wire import learn_keys

    c_search = None
    if learn_keys._C_MESSAGE_ID is not None:
        def c_search(raw):
            return learn_keys._C_MESSAGE_ID(raw, min(len(raw), learn_keys._HEADER_SCAN_BYTES))
    return [pytest.param(learn_keys._python_message_id, id="python"),
            pytest.param(c_search, id="C", marks=pytest.mark.skipif(c_search is None, reason="no C module"))]


@pytest.mark.parametrize("_message_id", _message_id_searches())
@pytest.mark.parametrize("seed", range(8))
def test_the_one_pass_message_id_search_finds_what_the_copies_found(seed, corpus_dir, _message_id):
    """The Python one-pass search and its C step (message_id_value), each against the
    search on a lower-cased copy."""
    rng = np.random.default_rng(seed)
    for _ in range(2_000):
        raw = b"".join(_PIECES[i] for i in rng.integers(len(_PIECES), size=rng.integers(0, 14)))
        assert _message_id(raw) == _message_id_by_copies(raw), raw
    if seed == 0:  # and every mail of the corpus
        for path in sorted(p for p in corpus_dir.rglob("*") if p.is_file()):
            raw = path.read_bytes()
            assert _message_id(raw) == _message_id_by_copies(raw), path


@pytest.mark.parametrize("_message_id", _message_id_searches())
@pytest.mark.parametrize("cut", [-40, -13, -12, -11, -5, -1, 0, 1, 30])
def test_the_message_id_search_stops_at_the_scan_limit(cut, _message_id):
    """A field near the end of the 256 KiB searched: what lies past it is not read."""
    pad = b"X-Pad: " + b"p" * (256 * 1024 + cut - 7 - 11) + b"\n"
    for tail in (b"Message-ID: <a@b>\n\nbody", b"Message-ID: <a@b>", b"message-id\t:<a@b>\n more\n"):
        raw = pad + tail
        assert _message_id(raw) == _message_id_by_copies(raw)


def test_fresh_records_are_the_msgpack_of_label_and_weight(monkeypatch):
    import msgpack

    from streamnb_workers.wire import learn_keys
    from streamnb_workers.wire.learn_keys import fresh_records

    keys, labels, weights = ["a", "b", "c"], ["spam", 1, "ham"], [1.0, 2, np.float64(0.5)]
    teachers = [("default", 0)] * 3
    want = [(k, msgpack.packb([lab, float(w)], use_bin_type=True))
            for k, lab, w in zip(keys, labels, weights, strict=True)]
    assert fresh_records(keys, labels, weights, teachers, {"c": None}) == want
    monkeypatch.setattr(learn_keys, "_PACK_ARRAY", None)
    assert fresh_records(keys, labels, weights, teachers, {}) == want
    # a key learnt, twice in the batch or under another teacher: not the common case
    assert fresh_records(keys, labels, weights, teachers, {"b": want[1][1]}) is None
    assert fresh_records(["a", "a", "c"], labels, weights, teachers, {}) is None
    assert fresh_records(keys, labels, weights, [("src", 1)] * 3, {}) is None
