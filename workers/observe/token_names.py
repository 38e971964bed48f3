"""Token names for hashed buckets: hashing keeps no names, so a worker counts the names of
a sample of the messages it predicts, in bounded memory, and publishes the most frequent
names of each bucket to ``{M}:tokens`` (``streamnb tokens`` and ``streamnb explain`` read
them). See docs/worker.md, "Token names".

``{M}:tokens`` is a hash: field = the bucket (decimal), value = a JSON list of
``[name, count]``, most frequent first, at most :data:`NAMES_PER_BUCKET`. Every worker
replaces it with its own view on a timer (last writer wins; each view is a sample of the
traffic, so the frequent names agree); it never holds more fields than the workers'
``token_names`` setting.

>>> from streamnb.features import Featurizer
>>> f = Featurizer(bits=20)
>>> names = TokenNames(capacity=4, every=1)
>>> for toks in (["cheap", "meds"], ["cheap", "now"], ["cheap"]):
...     names.add(toks)
>>> table = names.table(f.hasher)
>>> table[f.hasher.bucket("cheap")]
[['cheap', 3]]
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from streamnb.features.wire_tokens import WireTokens
from streamnb_workers.wire.replies import as_str

__all__ = ["NAMES_PER_BUCKET", "TokenNames", "message_names", "message_tokens", "publish",
           "read_all", "read_names"]

#: Names kept per bucket in ``{M}:tokens`` (colliding tokens share a bucket).
NAMES_PER_BUCKET = 3
#: Fields per HSET when publishing (one command stays small).
_HSET_CHUNK = 1000


def message_tokens(featurizer: Any, msg: Any) -> list[str] | None:
    """The names a message's hashed columns come from: its tokens (raw mail, text, token
    lists) or its feature names (a ``features`` map); None for payloads without names
    (``hashes``, dense ``x``) and for dense featurizers."""
    kind = msg.payload_kind
    if featurizer.input != "sparse":
        return None
    if kind in ("raw", "text", "tokens"):
        return featurizer.tokens(msg.as_payload())
    if kind == "features":
        return [str(name) for name in msg.as_payload()[1]]
    return None


def message_names(featurizer: Any, msg: Any) -> list[str] | None:
    """The distinct names of a message (:func:`message_tokens`, each once): for a
    ``tokens`` payload read from the wire, only the first of each token is decoded
    (:meth:`WireTokens.distinct <streamnb.features.wire_tokens.WireTokens.distinct>`)."""
    payload = msg.payload
    if type(payload) is WireTokens and featurizer.input == "sparse":
        return payload.distinct()
    tokens = message_tokens(featurizer, msg)
    return None if tokens is None else list(dict.fromkeys(tokens))


class TokenNames:
    """Counts of token names in at most ``2 * capacity`` entries: past that, only the
    ``capacity`` most frequent are kept (a name dropped and seen again starts from 1, so
    the counts of rare names are lower bounds; frequent ones stay). ``every``: count the
    tokens of one message in ``every`` offered to :meth:`sample` (each message's names
    once)."""

    __slots__ = ("capacity", "changed", "counts", "every", "offered")

    def __init__(self, capacity: int, every: int = 1) -> None:
        if capacity < 1 or every < 1:
            raise ValueError(f"need capacity >= 1 and every >= 1, got {capacity}, {every}")
        self.capacity, self.every = capacity, every
        self.counts: Counter[str] = Counter()
        self.offered = 0
        self.changed = False

    def sample(self, n: int) -> list[int]:
        """Which of the next ``n`` messages to count (their positions, 0-based).

        >>> names = TokenNames(10, every=3)
        >>> names.sample(4), names.sample(4)
        ([2], [1])
        """
        positions = self.upcoming(n)
        self.offered += n
        return positions

    def upcoming(self, n: int) -> list[int]:
        """The positions :meth:`sample` of ``n`` would give now, without taking them (which
        messages of a batch to keep the tokens of while featurizing it).

        >>> names = TokenNames(10, every=3)
        >>> names.upcoming(4), names.upcoming(4), names.sample(4)
        ([2], [2], [2])
        """
        return list(range((-(self.offered + 1)) % self.every, n, self.every))

    def add(self, tokens: Iterable[str], distinct: bool = False) -> None:
        """Count one message's names (each once; ``distinct``: ``tokens`` holds each once
        already)."""
        counts = self.counts
        counts.update(tokens if distinct else set(tokens))  # (not a map: one C loop)
        self.changed = True
        if len(counts) > 2 * self.capacity:
            keep = heapq.nlargest(self.capacity, counts.items(), key=lambda kv: kv[1])
            self.counts = Counter(dict(keep))

    def table(self, hasher: Any) -> dict[int, list[list[Any]]]:
        """Bucket -> ``[[name, count], ...]``, the most frequent names first (at most
        :data:`NAMES_PER_BUCKET`), over the ``capacity`` most frequent names."""
        items = heapq.nlargest(self.capacity, self.counts.items(), key=lambda kv: kv[1])
        if not items:
            return {}
        buckets = (hasher.hashes_of([name for name, _ in items]) & np.uint64(hasher.mask)).tolist()
        out: dict[int, list[list[Any]]] = {}
        for bucket, (name, count) in zip(buckets, items, strict=True):
            names = out.setdefault(int(bucket), [])
            if len(names) < NAMES_PER_BUCKET:
                names.append([name, count])
        return out


def publish(client: Any, key: str, table: dict[int, list[list[Any]]], pipeline: Any = None) -> None:
    """Replace the hash ``key`` with ``table`` (one MULTI, so readers never see it half
    written)."""
    pipe = client.pipeline(transaction=True) if pipeline is None else pipeline
    pipe.delete(key)
    fields = [(str(b), json.dumps(names, ensure_ascii=False)) for b, names in table.items()]
    for i in range(0, len(fields), _HSET_CHUNK):
        pipe.hset(key, mapping=dict(fields[i:i + _HSET_CHUNK]))
    if pipeline is None:
        pipe.execute()


def _decode(value: Any) -> list[tuple[str, int]]:
    try:
        return [(str(n), int(c)) for n, c in json.loads(as_str(value))]
    except (ValueError, TypeError):
        return []  # a value not written by publish: no names rather than an error


def read_names(client: Any, key: str, buckets: Sequence[int]) -> dict[int, list[tuple[str, int]]]:
    """The published names of ``buckets`` (those without names are left out)."""
    if not buckets:
        return {}
    values = client.hmget(key, [str(int(b)) for b in buckets])
    return {int(b): _decode(v) for b, v in zip(buckets, values, strict=True) if v is not None}


def read_all(client: Any, key: str) -> dict[int, list[tuple[str, int]]]:
    """Every published bucket's names (the hash holds at most the workers' capacity)."""
    return {int(as_str(b)): _decode(v) for b, v in client.hgetall(key).items()}
