"""Learn-once keys: what names a labelled message whatever it was read from, and the
Redis bookkeeping of the keys a model has learnt (``{M}:keys``, ``{M}:keyorder``).

A message's key (:func:`message_key`) is, in this order: the ``key`` its producer gave;
for raw mail its Message-ID (``mid:`` + the id between its angle brackets); else a
BLAKE2b hash of the raw bytes without streamnb's own header fields (``raw:``; a delivered
copy, with the ``X-Streamnb-*`` verdict fields added, is the mail it was:
:mod:`streamnb.features.own_headers`); for every other payload a BLAKE2b hash of the
payload in a canonical form (``text:``, ``tokens:``, ``hashes:``, ``features:``, ``x:``).
``streamnb produce`` and ``streamnb forget`` compute the same key as the worker, so a
file path, a maildir flag or a re-run never makes a learnt message new.

``{M}:keys`` maps each learnt key to its record (:func:`encode_record`: the label and
the weight learnt), which is what ``forget`` subtracts; ``{M}:keyorder`` orders the keys
by the time (ms) of the log entry that learnt or last relearnt them, so the commit script
drops the oldest beyond ``learnt_keys_max`` (and ``forget --source --since`` finds what
was learnt since a time). Both are written only by workers/store/scripts/commit.lua.

>>> message_key(b"Subject: hi\\r\\nMessage-ID:  <A1@x.org>\\r\\n\\r\\nbody", "raw")
'mid:A1@x.org'
>>> message_key("cheap meds", "text") == message_key("cheap meds", "text", key=None)
True
>>> message_key("cheap meds", "text", key="order-17")
'order-17'
>>> decode_record(encode_record("spam", 2.0))
('spam', 2.0)
>>> encode_record("Spam", 1.0)[1:].startswith(record_prefix("Spam"))
True
>>> encode_record("Spam", 1.0, ("imap", 2))[1:].startswith(record_prefix("Spam"))
True
>>> encode_record("Spammer", 1.0)[1:].startswith(record_prefix("Spam"))
False
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from streamnb._cmodules import optional_c_module
from streamnb.encoding import dumps
from streamnb.features.own_headers import strip_own_headers
from streamnb.features.wire_tokens import WireTokens
from streamnb_workers.wire.learn_sources import DEFAULT, Teacher

__all__ = ["MAX_KEY_CHARS", "decode_record", "encode_record", "fresh_records", "known_keys", "mail_key",
           "message_key", "record_challenger_weight", "record_prefix", "record_teacher"]

#: Longest key (characters); a longer Message-ID is hashed instead.
MAX_KEY_CHARS = 512
#: The part of a mail searched for its Message-ID header: headers are at its start.
_HEADER_SCAN_BYTES = 256 * 1024
#: The Message-ID field's name and colon (white space between, as far as the first 64
#: bytes after the name), at the mail's start and after a line break.
_FIELD_FIRST = re.compile(rb"message-id[ \t]{0,63}:", re.IGNORECASE)
_FIELD_AFTER_BREAK = re.compile(rb"\nmessage-id[ \t]{0,63}:", re.IGNORECASE)
_BRACKETED = re.compile(rb"<([^<>]*)>")
#: The C step of _message_id (streamnb.features._speedups), or None.
_C_MESSAGE_ID = getattr(optional_c_module("streamnb.features._speedups"), "message_id_value", None)
#: ``streamnb._kernels.pack_array`` (msgpack of a list, without making it), or None.
_PACK_ARRAY = getattr(optional_c_module("streamnb._kernels"), "pack_array", None)


def _hash(kind: str, data: bytes) -> str:
    return f"{kind}:{hashlib.blake2b(data, digest_size=16).hexdigest()}"


def _blank_line(raw: bytes, stop: int) -> int:
    """Where the first empty line of ``raw[:stop]`` starts (the line break before it), or -1."""
    end = raw.find(b"\n\n", 0, stop)
    end_crlf = raw.find(b"\n\r\n", 0, end if end >= 0 else stop)
    return end_crlf if end_crlf >= 0 else end


def _message_id(raw: bytes) -> bytes | None:
    """:func:`_python_message_id`, in C where the tokenizer's C module is built (one pass
    over the header lines, the same value)."""
    if _C_MESSAGE_ID is not None:
        return _C_MESSAGE_ID(raw, min(len(raw), _HEADER_SCAN_BYTES))
    return _python_message_id(raw)


def _python_message_id(raw: bytes) -> bytes | None:
    """The raw value of the first Message-ID field of a mail's header lines (up to its first
    empty line, within the scan limit), folded lines joined: the field found where it
    starts the mail or follows a line break, the text before it then checked for an empty
    line, nothing copied but the value.

    >>> _message_id(b"Subject: x\\r\\nMESSAGE-id :<a@b>\\r\\n\\tc\\r\\n\\r\\nMessage-ID: <body>")
    b'<a@b>\\r\\n\\tc\\r'
    """
    scan = min(len(raw), _HEADER_SCAN_BYTES)
    found = _FIELD_FIRST.match(raw, 0, scan) or _FIELD_AFTER_BREAK.search(raw, 0, scan)
    if found is None:
        return None
    blank = _blank_line(raw, found.start() + 1)  # (a field after it is in the body)
    if blank >= 0 and blank < found.start():
        return None
    start = end = found.end()
    while True:  # the field goes on over lines that start with white space
        end = raw.find(b"\n", end, scan)
        if end < 0 or end + 1 >= scan or raw[end + 1] not in (32, 9):
            break
        end += 1
    if end < 0:  # no line break before the scan limit: the header lines end there
        stop = _blank_line(raw, scan)
        end = stop + 1 if stop >= 0 else scan
    return raw[start:end]


def mail_key(raw: bytes) -> str:
    """A raw mail's key: its Message-ID (folded lines unfolded, the angle brackets and
    the white space around them dropped), else a hash of its bytes without streamnb's own
    header fields.

    >>> mail_key(b"Subject: hi\\n\\nbody") == mail_key(b"X-Streamnb-Verdict: ham\\nSubject: hi\\n\\nbody")
    True
    """
    value = _message_id(raw)
    if value is not None:
        value = b" ".join(value.split())
        bracketed = _BRACKETED.search(value)
        if bracketed is not None:
            value = bracketed.group(1).strip()
        mid = value.decode("utf-8", "replace")
        if mid and len(mid) <= MAX_KEY_CHARS - 4:
            return f"mid:{mid}"
    return _hash("raw", strip_own_headers(raw))


def _canonical(kind: str, payload: Any) -> bytes:
    if kind == "text":
        return payload.encode("utf-8", "surrogatepass")
    if kind == "hashes":
        return np.asarray(payload, dtype="<u8").tobytes()
    if kind == "x":
        return np.asarray(payload, dtype="<f8").tobytes()
    if kind == "features":
        return msgpack.packb(sorted((str(k), float(v)) for k, v in payload.items()))
    if type(payload) is WireTokens:  # tokens as they came: their UTF-8 joined from the entry's bytes
        return payload.joined_utf8()
    # tokens: joined by NUL, a C-level pass over the strs the codec already checked
    # (msgpack's packing of the list cost about three times as much a token). Lists that
    # differ only in where a NUL inside a token falls share a key, as a producer's own
    # key can name any message: neither is a way to learn more than once.
    return "\x00".join(payload).encode("utf-8", "surrogatepass")


def message_key(payload: Any, kind: str, key: str | None = None) -> str:
    """The learn-once key of a message with payload ``payload`` of kind ``kind`` (see the
    module docstring); ``key``: the producer's, which wins."""
    if key is not None:
        return key
    if kind == "raw":
        return mail_key(bytes(payload))
    return _hash(kind, _canonical(kind, payload))


def encode_record(label: Any, weight: float, teacher: Teacher = DEFAULT,
                  challenger_weight: float | None = None) -> bytes:
    """What ``{M}:keys`` holds for a learnt key: the label and the weight learnt, and
    the teacher (source, epoch) it was learnt under unless that is the default's first
    epoch (workers/wire/learn_sources.py), then, with a challenger
    (workers/replication/challenger.py), the weight the challenger learnt it with.

    >>> record_challenger_weight(encode_record("spam", 2.0, challenger_weight=1.0))
    1.0
    """
    # (the thread's Packer: msgpack.packb makes one a call)
    if challenger_weight is not None:
        return dumps([label, float(weight), teacher[0], int(teacher[1]), float(challenger_weight)])
    if teacher == DEFAULT:
        return dumps([label, float(weight)])
    return dumps([label, float(weight), teacher[0], int(teacher[1])])


def fresh_records(keys: Sequence[str], labels: Sequence[Any], weights: Sequence[float],
                  teachers: Sequence[Teacher],
                  key_state: dict[str, bytes | None]) -> list[tuple[str, bytes]] | None:
    """``(key, encode_record(label, weight))`` of each key in order when the keys are
    distinct, none learnt (absent from ``key_state`` or None there) and every teacher the
    default's first epoch (a batch's common case: each key simply learnt); else None.

    >>> fresh_records(["a", "b"], ["spam", 1], [1.0, 2], [DEFAULT] * 2, {"b": None})
    [('a', b'\\x92\\xa4spam\\xcb?\\xf0\\x00\\x00\\x00\\x00\\x00\\x00'), ('b', b'\\x92\\x01\\xcb@\\x00\\x00\\x00\\x00\\x00\\x00\\x00')]
    >>> fresh_records(["a", "a"], ["spam", "spam"], [1.0, 1.0], [DEFAULT] * 2, {}) is None
    True
    """
    if len(set(keys)) != len(keys) or any(map(key_state.get, keys)) or \
            any(t != DEFAULT for t in teachers):
        return None
    if _PACK_ARRAY is None:
        return [(k, encode_record(lab, w)) for k, lab, w in zip(keys, labels, weights, strict=True)]
    pack = _PACK_ARRAY  # (encode_record's default-teacher array, packed in C)
    return [(k, pack((lab, float(w)), b"")) for k, lab, w in zip(keys, labels, weights, strict=True)]


def record_challenger_weight(data: bytes) -> float | None:
    """The challenger's weight of a record (None: written without a challenger)."""
    fields = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
    return float(fields[4]) if len(fields) >= 5 else None


def record_prefix(label: Any) -> bytes:
    """The bytes every record of ``label`` holds after its first byte (the array's
    header: 2 fields, 4 with a teacher, 5 with a challenger's weight), whatever its weight and source (the label is
    packed with its length: no other label's records hold them there). The commit script
    releases a removed class's keys by it, reading no msgpack."""
    return msgpack.packb(label, use_bin_type=True)


def decode_record(data: bytes) -> tuple[Any, float]:
    """The label and weight of a record written by :func:`encode_record`."""
    label, weight = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)[:2]
    return label, float(weight)


def record_teacher(data: bytes) -> Teacher:
    """The teacher of a record written by :func:`encode_record`.

    >>> record_teacher(encode_record("spam", 1.0)), record_teacher(encode_record("ham", 1.0, ("imap", 2)))
    (('default', 0), ('imap', 2))
    """
    fields = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
    return DEFAULT if len(fields) < 4 else (str(fields[2]), int(fields[3]))


def known_keys(client: Any, keys_key: str, names: Sequence[str],
               pipeline: Any = None) -> dict[str, bytes | None]:
    """The records of ``names`` in ``keys_key`` (None: not learnt); with ``pipeline``
    the ``HMGET`` is queued there and {} returned."""
    if not names:
        return {}
    target = pipeline if pipeline is not None else client
    reply = target.hmget(keys_key, list(names))
    if pipeline is not None:
        return {}
    return dict(zip(names, reply, strict=True))
