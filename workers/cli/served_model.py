"""The model as its workers serve it, for ``streamnb explain`` and ``streamnb tokens``: read
from Redis (snapshot + log, as ``export``; a sharded model as the sum of its shards) with
its featurizer and decision rule, and the token names the workers publish per hash bucket
(``{M}:tokens``, workers/observe/token_names.py)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.options import model_name, redis_from_args
from streamnb_workers.client.shard_streams import shard_keys
from streamnb_workers.observe.token_names import read_names
from streamnb_workers.replication.shards import load_model
from streamnb_workers.store.model_config import read_config

__all__ = ["Names", "merge_names", "open_served_model", "published_names"]

Names = dict[int, list[tuple[str, int]]]


def open_served_model(args: argparse.Namespace,
                      env: Mapping[str, str]) -> tuple[Any, Any, Any, Any, str]:
    """(client, model, featurizer, decision rule, version) of the model ``--model`` in Redis."""
    name = model_name(args)
    client = redis_from_args(args, env).make_client()
    cfg = read_config(client, name)
    if cfg is None:
        raise SettingsError(f"model {name!r} has no config in Redis (no worker has served it)")
    model, version = load_model(client, name)  # a sharded model: the sum of its shards
    return client, model, cfg.make_featurizer(), cfg.make_decision_rule(), version


def published_names(client: Any, name: str | None, buckets: list[int]) -> Names:
    """The token names the workers published for ``buckets`` (of every shard of a sharded
    model, their counts added)."""
    if client is None or not name:
        return {}
    shards = shard_keys(client, name)
    if len(shards) == 1:
        return read_names(client, shards[0].tokens, buckets)
    return merge_names([read_names(client, keys.tokens, buckets) for keys in shards])


def merge_names(published: list[Names]) -> Names:
    """The token names of several shards per bucket, the counts of a name added, the most
    counted first.

    >>> merge_names([{3: [("cheap", 4), ("free", 1)]}, {3: [("free", 5)], 7: [("x", 1)]}])
    {3: [('free', 6), ('cheap', 4)], 7: [('x', 1)]}
    """
    counts: dict[int, dict[str, int]] = {}
    for names in published:
        for bucket, pairs in names.items():
            for token, n in pairs:
                counts.setdefault(bucket, {})[token] = counts.get(bucket, {}).get(token, 0) + n
    return {bucket: sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))
            for bucket, by_name in sorted(counts.items())}
