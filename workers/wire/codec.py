"""The strict msgpack wire codec: stream entries in, predictions and dead letters out.

Each stream entry has one field, ``data``, holding a msgpack map (see docs/protocol.md).
:func:`decode_input` turns untrusted bytes into an :class:`InputMessage` or raises
:class:`~streamnb.exceptions.MalformedMessage` with a short reason code; nothing else
escapes it. msgpack is decoded with every length limit set, ``raw=False`` and no ext
types, so a hostile entry costs bounded time and memory.

>>> import msgpack
>>> msg = decode_input(msgpack.packb({"text": "cheap meds", "label": "spam"}), "1-0")
>>> (msg.id, msg.payload_kind, msg.label, msg.weight)
('1-0', 'text', 'spam', 1.0)
>>> decode_input(b"\\xc1", "1-1")
Traceback (most recent call last):
...
streamnb.exceptions.MalformedMessage: not_msgpack: entry is not valid msgpack (FormatError)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from streamnb.encoding import dumps
from streamnb.exceptions import MalformedMessage
from streamnb.features.payload import PAYLOAD_KINDS, Payload
from streamnb.features.wire_tokens import split_tokens
from streamnb_workers.wire.fields import (
    features_field,
    hashes_field,
    is_number,
    label_field,
    source_field,
    tokens_field,
    vector_field,
    weight_field,
)
from streamnb_workers.wire.learn_keys import MAX_KEY_CHARS, message_key
from streamnb_workers.wire.learn_sources import check_source
from streamnb_workers.wire.limits import (
    DEFAULT_LIMITS,
    DEFAULT_MAX_ENTRY_BYTES,
    DEFAULT_MAX_VALUE,
    DEFAULT_MAX_WEIGHT,
    Limits,
)

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_ENTRY_BYTES",
    "DEFAULT_MAX_VALUE",
    "DEFAULT_MAX_WEIGHT",
    "InputMessage",
    "Limits",
    "decode_input",
    "encode_input",
    "refuse_ext",
]

#: The one stream field that holds a message's msgpack map.
DATA_FIELD = "data"

#: Each known key's slot in :func:`decode_input`'s one pass: the fields, then one slot
#: shared by the three that make a class removal (and ``force``, theirs), then the payloads.
_FIELD_KEYS = ("id", "label", "weight", "ts", "meta", "key", "source", "forget", "ref")
_SLOTS = {k: i for i, k in enumerate(_FIELD_KEYS)}
_SLOTS.update(dict.fromkeys(("forget_class", "promote", "forget_source"), len(_FIELD_KEYS)))
_SLOTS["force"] = len(_FIELD_KEYS) + 1
_FIRST_PAYLOAD = len(_FIELD_KEYS) + 2
_SLOTS.update({k: _FIRST_PAYLOAD + i for i, k in enumerate(PAYLOAD_KINDS)})
_NSLOTS = _FIRST_PAYLOAD + len(PAYLOAD_KINDS)
_KNOWN_KEYS = frozenset(_SLOTS)


@dataclass(slots=True)
class InputMessage:
    """One validated input message.

    ``payload`` is ``bytes`` for raw, ``str`` for text, a sequence of ``str`` for tokens
    (a ``list``, or where the C module is built a
    :class:`~streamnb.features.wire_tokens.WireTokens`: the tokens hashed from the entry's
    bytes, decoded only on demand),
    a uint64 ``numpy`` array for hashes (the tokens' 64-bit hashes,
    :func:`streamnb.features.token_hashes`), ``dict[str, float]`` for features and a
    float64 ``numpy`` vector for x; it is None (and ``payload_kind`` is None) for a
    delayed label carrying ``ref``, and for a class removal (``forget_class``: the class
    to remove, docs/worker.md "Removing a class").
    """

    entry_id: str
    id: str
    payload_kind: str | None
    payload: Any
    label: str | int | None = None
    weight: float = 1.0
    ts: float | None = None
    ref: str | None = None
    meta: dict | None = None
    unknown_keys: int = 0
    key: str | None = None
    forget: bool = False
    #: The source it is learnt under (None: the default source; workers/wire/learn_sources.py).
    source: str | None = None
    forget_class: str | int | None = None
    #: ``{"promote": SPEC}``: make the challenger SPEC the model (workers/replication/challenger.py).
    promote: str | None = None
    #: ``{"forget_source": NAME}``: take out all NAME taught (``streamnb forget --source``).
    forget_source: str | None = None

    @property
    def is_labelled(self) -> bool:
        return self.label is not None

    def as_payload(self) -> Payload:
        """What the featurizer takes (:class:`streamnb.features.Payload`)."""
        return Payload(self.payload_kind, self.payload)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- decoding
def refuse_ext(code: int, data: bytes) -> Any:
    """msgpack's ``ext_hook`` for the wire: every ext type is refused
    (:class:`~streamnb.exceptions.MalformedMessage` ``bad_type``)."""
    raise MalformedMessage("bad_type", f"msgpack ext type {code} is not allowed")


def _unpack(data: bytes, limits: Limits) -> Any:
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            ext_hook=refuse_ext,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=0,
        )
    except MalformedMessage:
        raise
    except ValueError as exc:
        text = str(exc)
        if "max_ext_len" in text:
            raise MalformedMessage("bad_type", "msgpack ext types are not allowed") from None
        if "exceeds max_" in text:
            raise MalformedMessage("too_large", f"a msgpack item is too long: {text}") from None
        if isinstance(exc, UnicodeDecodeError):
            raise MalformedMessage("not_msgpack", "a msgpack str is not valid UTF-8") from None
        raise MalformedMessage(
            "not_msgpack", f"entry is not valid msgpack ({type(exc).__name__})"
        ) from None
    except Exception as exc:  # msgpack raises several unrelated types (StackError, ...)
        raise MalformedMessage(
            "not_msgpack", f"entry is not valid msgpack ({type(exc).__name__})"
        ) from None


def decode_input(
    data: bytes,
    entry_id: str,
    limits: Limits = DEFAULT_LIMITS,
    *,
    expected_dim: int | None = None,
) -> InputMessage:
    """Decode and validate one input entry's ``data`` field.

    Raises only :class:`MalformedMessage`. ``expected_dim``, when given, is the length
    an ``x`` payload must have (``wrong_dimension`` otherwise).
    """
    if type(data) is not bytes:
        if isinstance(data, str):
            raise MalformedMessage("not_msgpack", "the data field must be bytes, got str")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MalformedMessage(
                "not_msgpack", f"the data field must be bytes, got {type(data).__name__}"
            )
        data = bytes(data)
    if len(data) > limits.max_message_bytes:
        raise MalformedMessage(
            "too_large", f"message has {len(data)} bytes, the limit is {limits.max_message_bytes}"
        )
    # A tokens array is hashed from the entry's bytes, the rest of the map decoded by
    # msgpack; any entry the C step declines is msgpack's as a whole.
    split = split_tokens(
        data,
        max_tokens=min(limits.max_tokens, limits.max_array_len),
        max_str_len=limits.max_str_len,
        max_map_len=limits.max_map_len,
    )
    if split is None:
        obj = _unpack(data, limits)
    else:
        obj = _unpack(split[0], limits)
        obj["tokens"] = split[1]
    if type(obj) is not dict:
        raise MalformedMessage("not_a_map", f"expected a msgpack map, got {type(obj).__name__}")

    # One pass over the map: each known key's value (None kept as absent) into its slot.
    vals = [None] * _NSLOTS
    unknown = npayloads = 0
    kind = None
    for k, v in obj.items():
        i = _SLOTS.get(k)
        if i is None:
            unknown += 1
        elif v is not None:
            vals[i] = v
            if i >= _FIRST_PAYLOAD:
                npayloads += 1
                kind = k
    msg_id, label, weight, ts, meta, key, source, forget, ref, special = vals[: _FIRST_PAYLOAD - 1]
    if special is not None:
        return _class_removal(obj, entry_id, limits, unknown)
    if ref is not None and (type(ref) is not str or not ref or len(ref) > limits.max_id_len):
        raise MalformedMessage(
            "bad_type", f"ref must be a non-empty str of at most {limits.max_id_len} characters"
        )
    if npayloads > 1 or (npayloads and ref is not None):
        keys = [k for k in PAYLOAD_KINDS if obj.get(k) is not None]
        keys += ["ref"] if ref is not None else []
        raise MalformedMessage("several_payloads", f"expected one payload, got {', '.join(keys)}")

    if msg_id is None:
        msg_id = entry_id
    elif type(msg_id) is str:
        if not msg_id or len(msg_id) > limits.max_id_len:
            raise MalformedMessage(
                "bad_type", f"id must be a non-empty str of at most {limits.max_id_len} characters"
            )
    elif isinstance(msg_id, int) and not isinstance(msg_id, bool):
        msg_id = str(msg_id)
    else:
        raise MalformedMessage(
            "bad_type", f"id must be a non-empty str of at most {limits.max_id_len} characters"
        )

    if label is not None:
        label = label_field(label, limits)
    weight = 1.0 if weight is None else weight_field(weight, limits)
    if ts is not None:
        if not is_number(ts):
            raise MalformedMessage(
                "bad_type", f"ts must be a number (unix seconds), got {type(ts).__name__}"
            )
        ts = float(ts)
        if not math.isfinite(ts):
            raise MalformedMessage("non_finite", f"ts is {ts}")
    if meta is not None and not isinstance(meta, dict):
        raise MalformedMessage("bad_type", f"meta must be a map, got {type(meta).__name__}")

    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS):
        raise MalformedMessage(
            "bad_type", f"key must be a non-empty str of at most {MAX_KEY_CHARS} characters"
        )
    if source is not None:
        source = source_field(source)
    if forget is not None and not isinstance(forget, bool):
        raise MalformedMessage("bad_type", f"forget must be a boolean, got {type(forget).__name__}")
    if forget:
        if not npayloads:
            raise MalformedMessage(
                "no_payload",
                "a forget carries the payload learnt (and may "
                "name its key): the statistics to subtract are made from it",
            )
        label = None  # what is unlearnt is what was recorded for the key

    if not npayloads:
        if ref is None:
            raise MalformedMessage(
                "no_payload", f"expected one of {', '.join(PAYLOAD_KINDS)} (or ref + label)"
            )
        if label is None:
            raise MalformedMessage("bad_label", "a ref message must carry a label")
        payload = None
    else:
        value = obj[kind]
        if kind == "tokens":
            payload = tokens_field(value, limits)
        elif kind == "hashes":
            payload = hashes_field(value, limits)
        elif kind == "raw":
            if isinstance(value, str):  # producers whose msgpack writes str for everything
                value = value.encode("utf-8", "surrogatepass")
            if not isinstance(value, bytes):
                raise MalformedMessage("bad_type", f"raw must be bytes, got {type(value).__name__}")
            payload = value
        elif kind == "text":
            if not isinstance(value, str):
                raise MalformedMessage("bad_type", f"text must be str, got {type(value).__name__}")
            payload = value
        elif kind == "features":
            payload = features_field(value, limits)
        else:
            payload = vector_field(value, limits, expected_dim)
        if label is not None or forget:
            key = message_key(payload, kind, key)
    return InputMessage(
        entry_id,
        msg_id,
        kind,
        payload,
        label,
        weight,
        ts,
        ref,
        meta,
        unknown,
        key,
        forget is True,
        source,
    )


def _class_removal(obj: dict, entry_id: str, limits: Limits, unknown: int) -> InputMessage:
    """An entry ``{"forget_class": LABEL}`` (and at most ``id``, ``ts``): remove the class;
    likewise ``{"promote": SPEC}`` and ``{"forget_source": NAME}``.

    >>> decode_input(dumps({"forget_class": "Spam"}), "1-0").forget_class
    'Spam'
    >>> decode_input(dumps({"forget_class": "Spam", "text": "x"}), "1-0")
    Traceback (most recent call last):
    ...
    streamnb.exceptions.MalformedMessage: several_payloads: forget_class goes alone, without text
    """
    extra = [
        k
        for k in (*PAYLOAD_KINDS, "ref", "label", "weight", "key", "forget", "meta", "source")
        if obj.get(k) is not None
    ]
    if extra:
        raise MalformedMessage(
            "several_payloads", f"forget_class goes alone, without {', '.join(extra)}"
        )
    spec, gone = obj.get("promote"), obj.get("forget_source")
    if not isinstance(obj.get("force", False), bool):
        raise MalformedMessage("bad_type", "force must be a bool")
    if spec is not None and (not isinstance(spec, str) or obj.get("forget_class") is not None):
        raise MalformedMessage("bad_type", "promote is a challenger's SPEC (str), alone")
    if gone is not None:  # {"forget_source": NAME}, alone
        if spec is not None or obj.get("forget_class") is not None:
            raise MalformedMessage("bad_type", "forget_source goes alone")
        try:
            gone = check_source(gone)
        except ValueError as exc:
            raise MalformedMessage("bad_source", f"forget_source: {exc}") from None
    try:
        label = label_field(obj["forget_class"], limits) if spec is None and gone is None else None
    except MalformedMessage as exc:
        raise MalformedMessage(exc.reason, "forget_class: " + exc.detail) from None
    msg_id = obj.get("id", entry_id)
    if isinstance(msg_id, int) and not isinstance(msg_id, bool):
        msg_id = str(msg_id)
    if not isinstance(msg_id, str) or not msg_id or len(msg_id) > limits.max_id_len:
        raise MalformedMessage(
            "bad_type", f"id must be a non-empty str of at most {limits.max_id_len} characters"
        )
    ts = obj.get("ts")
    if ts is not None and not (is_number(ts) and math.isfinite(float(ts))):
        raise MalformedMessage("bad_type", "ts must be a finite number (unix seconds)")
    return InputMessage(
        entry_id=entry_id,
        id=msg_id,
        payload_kind=None,
        payload=None,
        ts=None if ts is None else float(ts),
        unknown_keys=unknown,
        forget_class=label,
        promote=spec,
        forget_source=gone,
    )


# ---------------------------------------------------------------------------- encoding
def encode_input(payload_kind: str, payload: Any, **fields: Any) -> bytes:
    """Encode an input map (for producers and tests): ``encode_input("text", "hi", label="ham")``.

    >>> list(decode_input(encode_input("tokens", ["a", "b"], id="m1"), "1-0").payload)
    ['a', 'b']
    >>> decode_input(encode_input("hashes", [1, 2**64 - 1]), "1-0").payload.tolist()
    [1, 18446744073709551615]
    """
    if payload_kind not in PAYLOAD_KINDS:
        raise ValueError(f"payload_kind must be one of {PAYLOAD_KINDS}, got {payload_kind!r}")
    if payload_kind == "x":
        payload = [float(v) for v in np.asarray(payload, dtype=np.float64).ravel()]
    elif payload_kind == "hashes":
        payload = np.asarray(payload, dtype="<u8").tobytes()
    # (msgpack, bin type for bytes: a Packer kept per thread)
    return dumps({payload_kind: payload, **{k: v for k, v in fields.items() if v is not None}})
