"""The streams of a model that may be stored as K statistics shards (workers/replication/shards.py), as
the commands that read and write them (produce, forget, predict, tail, status, the verdict
client) see them.

- :func:`shard_keys`: the :class:`ModelKeys` of each shard of a stored model, in shard
  order (one: the model's own keys).
- :func:`read_after`: new entries of several streams after the ids given, as one XREAD
  replies. On a Redis Cluster the shards' streams are in different slots, and one XREAD of
  keys in different slots is refused (CROSSSLOT): each is read by an XREAD of its own,
  without BLOCK, again every :data:`POLL_S` until one has entries or the block time is up.
- :func:`merge_by_id` / :func:`last_merged`: entries of several streams in the order of
  their ids (the millisecond Redis added them; entries of different streams in the same
  millisecond in the order of the streams given).

>>> merge_by_id([[(b"5-0", 1), (b"9-0", 2)], [(b"7-0", 3), (b"10-1", 4)]])
[(b'5-0', 1), (b'7-0', 3), (b'9-0', 2), (b'10-1', 4)]
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Sequence
from typing import Any

from redis.cluster import RedisCluster

from streamnb_workers.replication.shards import Router, keys_of, stored_shards
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.stream_ids import parse_id

__all__ = ["POLL_S", "describe_inputs", "is_cluster", "last_merged", "merge_by_id",
           "read_after", "router_of", "shard_keys"]

#: Seconds between the per-stream reads of :func:`read_after` on a cluster.
POLL_S = 0.05


def shard_keys(client: Any, model: str) -> list[ModelKeys]:
    """The keys of each shard of the stored model ``model`` (its own for one)."""
    return keys_of(model, stored_shards(client, model))


def router_of(client: Any, model: str) -> Router:
    """The :class:`~streamnb_workers.replication.shards.Router` of the stored model ``model``."""
    return Router(model, stored_shards(client, model))


def describe_inputs(model: str, k: int) -> str:
    """Where messages of ``model`` with ``k`` shards go, for a command's report.

    >>> describe_inputs("mail", 1), describe_inputs("mail", 3)
    ('streamnb:{mail}:in', "the :in of the 3 shards of model 'mail'")
    """
    if k == 1:
        return ModelKeys(model).input
    return f"the :in of the {k} shards of model {model!r}"


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a Redis Cluster client (one command: keys of one slot)."""
    return isinstance(client, RedisCluster)


def read_after(client: Any, last: dict[str, str], count: int,
               block_ms: int | None) -> list[tuple[Any, list[Any]]]:
    """New entries of the streams ``last`` (key -> id read up to), at most ``count`` per
    stream, waiting up to ``block_ms`` for one (None: not at all); ``[(key, entries)]``
    as XREAD replies (module docstring: per stream on a cluster)."""
    if len(last) == 1 or not is_cluster(client):
        return client.xread(dict(last), count=count, block=block_ms) or []
    deadline = time.monotonic() + (block_ms or 0) / 1000.0
    while True:
        replies = []
        for key, after in list(last.items()):
            replies += client.xread({key: after}, count=count) or []
        if replies or time.monotonic() >= deadline:
            return replies
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def merge_by_id(streams: Iterable[Sequence[tuple[Any, Any]]]) -> list[tuple[Any, Any]]:
    """Entries ``(id, fields)`` of several streams, each oldest first, merged by id."""
    return list(heapq.merge(*streams, key=lambda entry: parse_id(entry[0])))


def last_merged(client: Any, keys: Sequence[str], n: int) -> list[tuple[Any, Any]]:
    """The last ``n`` entries of the streams ``keys`` together, oldest first."""
    if n <= 0:
        return []
    newest = [list(reversed(client.xrevrange(key, count=n))) for key in keys]
    return merge_by_id(newest)[-n:]
