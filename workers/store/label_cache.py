"""The delayed-label cache in Redis: each message's row, prediction and learnt label, kept
for a later ``ref`` label, in time-bucketed hashes.

A worker with a cache TTL of T ms writes into buckets of width W = T // 8
(:data:`~LABEL_CACHE_BUCKETS_PER_TTL`). The entry of message id I,
written at time t (ms, the worker's clock), is the field ``r<I>`` of the hash
``{M}:cachebucket:<W>:<k>:<s>``, with k = t // W and s = CRC-32(I) mod 16
(:data:`~LABEL_CACHE_SHARDS`); the hash expires at (k + 1) W + T, so an
entry lives between T and T + W. A batch's entries go to at most 16 hashes, written by the
commit script (workers/store/scripts/commit.lua) with one ``HSET`` and one ``PEXPIRE`` each.

The same commit records its width in ``{M}:cachebuckets`` (W -> "T:time of the write"),
so a lookup (workers/store/scripts/cache_get.lua) knows which buckets may hold an entry whatever TTL the
writers had: for each width, from its last write's bucket down to that of now - T, about
T / W + 3 = 11 hashes, newest first.

An entry is 2 bytes (big-endian) n, the learnt label (n bytes of msgpack; n = 0: not
learnt), then msgpack ``[1, row, predicted label, {label: log posterior}, weight, time]``,
with the message's learn-once key (workers/wire/learn_keys.py) appended when it was learnt
under one, so that a correction also changes what the key records, and, with a challenger
(workers/replication/challenger.py), the key (or nil) and ``[challenger's row, weight]``: the
row its own featurizer made (nil: the model's row serves) and the weight it learnt the
message with, so that a delayed label or a correction teaches it what it teaches the model.
This module alone reads and writes that layout: a delayed label changes an entry by a
compare-and-set of the whole entry, the bytes read against those stored, the entry
:func:`relabel` makes written in their place (:func:`label_change`).

>>> import numpy as np
>>> from streamnb.features import Row
>>> row = Row(indices=np.array([3, 9], dtype=np.int32), values=np.ones(2), n_tokens=2)
>>> entry = encode_entry(encode_label("spam"), row.to_bytes(), "ham", {"ham": -0.1}, 1.0, 5.0)
>>> c = decode_entry("key", "rm1", entry)
>>> (c.learnt, c.pred_label, c.log_proba, c.row == row, c.weight, c.ts)
('spam', 'ham', {'ham': -0.1}, True, 1.0, 5.0)
>>> decode_entry("key", "rm1", relabel(entry, encode_label("news"))).learnt
'news'
>>> bucket_width_ms(2 * 86_400_000), shard_of("m1") == shard_of("m1")
(21600000, True)
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from streamnb._cmodules import optional_c_module
from streamnb.encoding import dumps
from streamnb.features import Row
from streamnb_workers.store.commit import CacheCas, CacheWrite
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.lua import packaged_script
from streamnb_workers.wire.learn_sources import DEFAULT, Teacher
from streamnb_workers.wire.replies import as_str

__all__ = ["CachedMessage", "NOT_LEARNT", "batch_writes", "bucket_width_ms", "decode_entry",
           "decode_label", "decode_teacher", "encode_entries", "encode_entry", "encode_label", "entry_field", "fetch_cached",
           "label_change", "relabel", "shard_of"]

#: The delayed-label cache writes its entries into time buckets of TTL / this width
#: (workers/store/label_cache.py): an entry lives between TTL and TTL * (1 + 1/8); a lookup
#: probes about this many + 3 bucket hashes.
LABEL_CACHE_BUCKETS_PER_TTL = 8

#: Hashes per time bucket of the delayed-label cache, chosen by a CRC-32 of the message
#: id: a batch's entries take at most this many ``HSET`` + ``PEXPIRE`` pairs, and no one
#: hash holds more than 1/(8 x this) of the cache.
LABEL_CACHE_SHARDS = 16

#: The learnt label of a cached message not learnt yet.
NOT_LEARNT = b""
#: Version of an entry's msgpack part.
ENTRY_FORMAT = 1

_LENGTH = struct.Struct(">H")
#: ``streamnb._kernels.pack_array`` (msgpack of a list after a prefix, without making the
#: list), or None: msgpack packs the list.
_PACK_ARRAY = getattr(optional_c_module("streamnb._kernels"), "pack_array", None)
GET_SCRIPT = packaged_script("cache_get.lua")


def encode_label(label: Any, teacher: Teacher = DEFAULT) -> bytes:
    """A learnt label as an entry holds it: its msgpack, followed by the msgpack of the
    teacher ``[source, epoch]`` it was learnt under unless that is the default's first
    epoch (workers/wire/learn_sources.py)."""
    if label is None:
        return NOT_LEARNT
    data = dumps(label)
    return data if teacher == DEFAULT else data + dumps([teacher[0], int(teacher[1])])


def _label_and_teacher(data: bytes) -> tuple[Any, Teacher]:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    label = next(unpacker)
    try:
        source, epoch = next(unpacker)
    except StopIteration:
        return label, DEFAULT
    return label, (str(source), int(epoch))


def decode_label(data: bytes | None) -> Any:
    """The label of :func:`encode_label`'s bytes (None: not learnt).

    >>> decode_label(encode_label("spam", ("imap", 1))), decode_teacher(encode_label("spam", ("imap", 1)))
    ('spam', ('imap', 1))
    """
    if not data:
        return None
    return _label_and_teacher(data)[0]


def decode_teacher(data: bytes | None) -> Teacher:
    """The teacher of :func:`encode_label`'s bytes (the default for none)."""
    if not data:
        return DEFAULT
    return _label_and_teacher(data)[1]


def bucket_width_ms(ttl_ms: int) -> int:
    """The width of the time buckets a worker with this TTL writes into (>= 1 ms)."""
    return max(1, int(ttl_ms) // LABEL_CACHE_BUCKETS_PER_TTL)


def shard_of(msg_id: str) -> int:
    """The shard of a message id: the same in every process (not Python's salted hash)."""
    return zlib.crc32(msg_id.encode()) % LABEL_CACHE_SHARDS


def entry_field(msg_id: str) -> str:
    """The field of a message's entry in its bucket hash."""
    return "r" + msg_id


def encode_entry(learnt: bytes, row: bytes, pred_label: Any, log_proba: dict[Any, float],
                 weight: float, ts: float, learn_key: str | None = None,
                 challenger: tuple[bytes | None, float] | None = None) -> bytes:
    """A cache entry: the learnt label first (see the module docstring), then the rest
    (``learn_key``: the key the message was learnt under, if any; ``challenger``: its
    row, None where the model's serves, and weight).

    >>> import numpy as np
    >>> row = Row(indices=np.array([3], dtype=np.int32), values=np.ones(1), n_tokens=1)
    >>> e = encode_entry(b"", row.to_bytes(), "ham", {}, 2.0, 5.0, challenger=(None, 1.0))
    >>> c = decode_entry("key", "rm1", e)
    >>> c.weight, c.learn_key, c.challenger
    (2.0, None, (None, 1.0))
    """
    if _PACK_ARRAY is not None:
        for v in log_proba.values():
            if type(v) is not float:
                log_proba = {k: float(v) for k, v in log_proba.items()}
                break
        head = _LENGTH.pack(len(learnt)) + learnt
        if challenger is not None:
            return _PACK_ARRAY((ENTRY_FORMAT, row, pred_label, log_proba, float(weight), float(ts),
                                learn_key, (challenger[0], float(challenger[1]))), head)
        if learn_key is not None:
            return _PACK_ARRAY((ENTRY_FORMAT, row, pred_label, log_proba, float(weight), float(ts),
                                learn_key), head)
        return _PACK_ARRAY((ENTRY_FORMAT, row, pred_label, log_proba, float(weight), float(ts)), head)
    fields = [ENTRY_FORMAT, row, pred_label, {k: float(v) for k, v in log_proba.items()},
              float(weight), float(ts)]
    if learn_key is not None or challenger is not None:
        fields.append(learn_key)
    if challenger is not None:
        fields.append([challenger[0], float(challenger[1])])
    body = dumps(fields)
    return _LENGTH.pack(len(learnt)) + learnt + body


def encode_entries(parts: Iterable[tuple[Any, Teacher, bytes, Any, dict[Any, float], float, float,
                                          str | None, tuple[bytes | None, float] | None]]
                   ) -> list[bytes]:
    """:func:`encode_entry` of each ``(learnt label, its teacher, row, pred_label,
    log_proba, weight, ts, learn_key, challenger)``, the learnt label encoded once per
    label and teacher (:func:`encode_label`): a batch's cache entries, with no Python call
    an entry where ``streamnb._kernels`` is built and no challenger.

    >>> parts = [(None, DEFAULT, b"r", "ham", {"ham": -0.1}, 1.0, 5.0, None, None),
    ...          (1, ("s", 2), b"s", 1, {1: -2}, 2, 6.0, "k", None),
    ...          ("ham", DEFAULT, b"t", "ham", {}, 1.0, 7.0, None, (None, 1.0))]
    >>> encode_entries(parts) == [encode_entry(encode_label(p[0], p[1]), *p[2:]) for p in parts]
    True
    """
    pack, length, labels, out = _PACK_ARRAY, _LENGTH.pack, {}, []
    for label, teacher, row, pred_label, log_proba, weight, ts, learn_key, challenger in parts:
        learnt = labels.get((type(label), label, teacher))
        if learnt is None:
            learnt = labels[type(label), label, teacher] = encode_label(label, teacher)
        if pack is None or challenger is not None:
            out.append(encode_entry(learnt, row, pred_label, log_proba, weight, ts, learn_key,
                                    challenger))
            continue
        for v in log_proba.values():
            if type(v) is not float:
                log_proba = {k: float(v) for k, v in log_proba.items()}
                break
        out.append(pack((ENTRY_FORMAT, row, pred_label, log_proba, float(weight), float(ts))
                        if learn_key is None else
                        (ENTRY_FORMAT, row, pred_label, log_proba, float(weight), float(ts),
                         learn_key), length(len(learnt)) + learnt))
    return out


def relabel(entry: bytes, learnt: bytes) -> bytes:
    """``entry`` with ``learnt`` (an encoded label, :func:`encode_label`) as its learnt
    label, the rest of it unchanged."""
    (n,) = _LENGTH.unpack_from(entry)
    return _LENGTH.pack(len(learnt)) + learnt + entry[2 + n:]


@dataclass(slots=True)
class CachedMessage:
    """A cached message as read from Redis: where it is (``field`` of hash ``key``), its
    entry's bytes, and what it holds."""

    key: str
    field: str
    entry: bytes
    row: Row
    pred_label: Any
    log_proba: dict[Any, float]
    learnt_raw: bytes
    weight: float
    ts: float
    #: The learn-once key it was learnt under (None: none).
    learn_key: str | None = None
    #: With a challenger: its row (None: the model's serves) and the weight it learnt.
    challenger: tuple[Row | None, float] | None = None

    @property
    def learnt(self) -> Any:
        return decode_label(self.learnt_raw)

    @property
    def teacher(self) -> Teacher:
        """Who taught it its learnt label (workers/wire/learn_sources.py)."""
        return decode_teacher(self.learnt_raw)


def label_change(cached: CachedMessage, label: Any, teacher: Teacher = DEFAULT) -> CacheCas:
    """The commit's compare-and-set that makes ``label`` (taught by ``teacher``) the
    learnt label of ``cached``: the entry as read, replaced by the same entry with the
    new label."""
    return CacheCas(key=cached.key, field=cached.field, expected=cached.entry,
                    new=relabel(cached.entry, encode_label(label, teacher)))


def decode_entry(key: str, field: str, entry: bytes) -> CachedMessage | None:
    """A bucket entry -> :class:`CachedMessage` (None if unreadable: as good as expired)."""
    try:
        (n,) = _LENGTH.unpack_from(entry)
        learnt, body = bytes(entry[2:2 + n]), msgpack.unpackb(entry[2 + n:], raw=False,
                                                                 strict_map_key=False)
        if len(learnt) != n or not isinstance(body, list) or len(body) not in (6, 7, 8) \
                or body[0] != ENTRY_FORMAT:
            return None
        _, row, pred_label, lp, weight, ts = body[:6]
        learn_key = body[6] if len(body) >= 7 and isinstance(body[6], str) else None
        ch = None
        if len(body) == 8:
            ch_row, ch_weight = body[7]
            ch = (None if ch_row is None else Row.from_bytes(ch_row), float(ch_weight))
        return CachedMessage(key=key, field=field, entry=bytes(entry), row=Row.from_bytes(row),
                             pred_label=pred_label,
                             log_proba=dict(lp or {}), learnt_raw=learnt, weight=float(weight),
                             ts=float(ts), learn_key=learn_key, challenger=ch)
    except Exception:  # noqa: BLE001 - a corrupt entry is as good as expired
        return None


def batch_writes(keys: ModelKeys, ttl_ms: int, now_ms: int, entries: Iterable[tuple[str, bytes]],
                 ) -> tuple[list[CacheWrite], tuple[str, str, str]]:
    """The commit's writes of ``(message id, entry)`` pairs made at ``now_ms``: one
    :class:`~streamnb_workers.store.commit.CacheWrite` per shard they fall in, with the TTL that makes
    the bucket hash expire at (k + 1) W + T; and the record of the width they use in
    ``{M}:cachebuckets``, ``(key, field, value)`` (``CommitRequest.cache_registry``)."""
    width = bucket_width_ms(ttl_ms)
    bucket = now_ms // width
    by_shard: dict[int, list[Any]] = {}
    for msg_id, entry in entries:
        by_shard.setdefault(shard_of(msg_id), []).extend((entry_field(msg_id), entry))
    ttl = (bucket + 1) * width + int(ttl_ms) - now_ms
    writes = [CacheWrite(keys.cache_bucket(width, bucket, s), ttl, values)
              for s, values in by_shard.items()]
    return writes, (keys.cache_buckets, str(width), f"{int(ttl_ms)}:{int(now_ms)}")


def fetch_cached(client: Any, keys: ModelKeys, ids: Iterable[str], now_ms: int,
                 ) -> dict[str, CachedMessage | None]:
    """Read the cache entries of ``ids`` in one round trip (workers/store/scripts/cache_get.lua)."""
    ids = list(dict.fromkeys(ids))
    if not ids:
        return {}
    args: list[Any] = [int(now_ms), keys.cache_bucket_prefix, len(ids)]
    for i in ids:
        args += (entry_field(i), shard_of(i))
    reply = GET_SCRIPT(client, [keys.cache_buckets], args)
    return {i: decode_entry(as_str(found[0]), entry_field(i), found[1]) if found else None
            for i, found in zip(ids, reply, strict=True)}
