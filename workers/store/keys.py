"""Redis key names of one model.

Every key of model ``NAME`` starts with ``streamnb:{NAME}``; the braces are literal, they
are the Redis Cluster hash tag, so all keys of one model live in one slot and one Lua
script may touch them all.

>>> k = ModelKeys("mail")
>>> k.input, k.log, k.cache_bucket(21600000, 78901, 3)
('streamnb:{mail}:in', 'streamnb:{mail}:log', 'streamnb:{mail}:cachebucket:21600000:78901:3')
>>> ModelKeys("bad name")
Traceback (most recent call last):
...
ValueError: model name must be 1..100 characters of letters, digits and ._-, got 'bad name'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The consumer group every worker of a model joins.
GROUP = "workers"

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
#: The name of one statistics shard of a model (workers/replication/shards.py): ``NAME|J`` or
#: ``NAME|J.S``; ``|`` is in no model name, so no model's keys collide with a shard's.
_SHARD_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}\|[0-9]{1,2}(\.[0-9]{1,6})?$")
#: The most statistics shards of one model.
MAX_SHARDS = 64


def check_model_name(name: str, shard: bool = False) -> str:
    """Return ``name`` if it is a valid model name (``shard``: or the name of one of a
    model's statistics shards), else raise ValueError.

    >>> check_model_name("mail|2", shard=True)
    'mail|2'
    >>> check_model_name("mail|2")
    Traceback (most recent call last):
    ...
    ValueError: model name must be 1..100 characters of letters, digits and ._-, got 'mail|2'
    """
    if isinstance(name, str) and (_NAME.match(name) or shard and _SHARD_NAME.match(name)):
        return name
    raise ValueError(
        f"model name must be 1..100 characters of letters, digits and ._-, got {name!r}")


@dataclass(frozen=True, slots=True)
class ModelKeys:
    """All key names of the model ``name`` (see docs/worker.md for what each holds)."""

    name: str

    def __post_init__(self) -> None:
        check_model_name(self.name, shard=True)

    @property
    def prefix(self) -> str:
        return f"streamnb:{{{self.name}}}"

    @property
    def input(self) -> str:
        """Stream of input messages (consumer group :data:`GROUP`)."""
        return f"{self.prefix}:in"

    @property
    def out(self) -> str:
        """Stream of predictions (MAXLEN ~)."""
        return f"{self.prefix}:out"

    @property
    def dead(self) -> str:
        """Stream of dead letters (reason, detail, original bytes)."""
        return f"{self.prefix}:dead"

    @property
    def log(self) -> str:
        """Stream of committed statistic deltas and decay events."""
        return f"{self.prefix}:log"

    @property
    def events(self) -> str:
        """Stream of drift and operational events."""
        return f"{self.prefix}:events"

    @property
    def snapshot(self) -> str:
        """Hash ``{log_id, data, ts}``: the model's statistics including every log entry <= log_id."""
        return f"{self.prefix}:snapshot"

    @property
    def config(self) -> str:
        """Hash of the model's configuration, fixed at creation."""
        return f"{self.prefix}:config"

    @property
    def lease(self) -> str:
        """String: the consumer name holding the snapshot lease (SET NX PX)."""
        return f"{self.prefix}:lease"

    @property
    def workers(self) -> str:
        """Hash consumer -> heartbeat (msgpack: ts, pid, host, version)."""
        return f"{self.prefix}:workers"

    @property
    def learnt(self) -> str:
        """Counter of learnt messages (drives forgetting: a decay event every K)."""
        return f"{self.prefix}:learnt"

    @property
    def learnt_keys(self) -> str:
        """Hash learn-once key -> what was learnt for it (label, weight; msgpack), written
        by the commit script (workers/wire/learn_keys.py)."""
        return f"{self.prefix}:keys"

    @property
    def key_order(self) -> str:
        """Sorted set of the learnt keys, scored by ``:learnt`` when learnt: the oldest
        are dropped beyond ``learnt_keys_max``."""
        return f"{self.prefix}:keyorder"

    @property
    def inflight(self) -> str:
        """Hash ``<consumer>|<first entry id>`` -> a batch in flight that may hold labels
        (see workers/replication/ordering.py)."""
        return f"{self.prefix}:inflight"

    @property
    def cache_bucket_prefix(self) -> str:
        """What every bucket hash of the delayed-label cache starts with."""
        return f"{self.prefix}:cachebucket:"

    def cache_bucket(self, width_ms: int, bucket: int, shard: int) -> str:
        """Hash of the cached messages (delayed labels) of one shard written in one time
        bucket of ``width_ms`` (workers/store/label_cache.py)."""
        return f"{self.cache_bucket_prefix}{width_ms}:{bucket}:{shard}"

    @property
    def tokens(self) -> str:
        """Hash: bucket -> the most frequent token names seen in it (workers/observe/token_names.py)."""
        return f"{self.prefix}:tokens"

    @property
    def cache_buckets(self) -> str:
        """Hash of the bucket widths in use by the delayed-label cache: width (ms) ->
        "TTL (ms):last write (ms)" (workers/store/label_cache.py)."""
        return f"{self.prefix}:cachebuckets"

    def all_fixed(self) -> list[str]:
        """Every key of the model except the delayed-label cache's buckets and entries."""
        return [self.input, f"{self.prefix}:train", f"{self.prefix}:traintoken",  # training.py
                self.out, self.dead, self.log, self.events, self.snapshot,
                self.config, self.lease, self.workers, self.learnt, self.inflight,
                self.cache_buckets, self.learnt_keys, self.key_order, self.tokens]


def source_epochs_key(keys: ModelKeys) -> str:
    """The hash source -> its epoch of a model: the times ``streamnb forget --source``
    took that source out (workers/wire/learn_sources.py), written with the log entry
    that does it.

    >>> source_epochs_key(ModelKeys("mail"))
    'streamnb:{mail}:epochs'
    """
    return f"{keys.prefix}:epochs"
