"""K statistics shards of one model: their names, the shard a message goes to, and the
model a worker predicts with, the sum of the K (docs/architecture.md, "Past one shard").

Sufficient statistics add, so a model ``M`` stored with ``shards`` K > 1 is K models whose
statistics are summed. Shard j is a model of its own named ``M|j`` (or ``M|j.S``, below):
its own hash tag, so its own slot, ``:in``, ``:out``, ``:log``, snapshot, ordering board,
learn-once keys and label cache, and its own commit script; ``M``'s ``:config`` records K.

- **Where the shards live.** Shard j's name is ``M|j`` if its slot is in the j-th K-th of
  the 16,384 slots, else ``M|j.S`` with the least S that puts it there: on a cluster whose
  masters hold equal slot ranges (``redis-cli --cluster create`` with K masters) every
  shard has a master of its own.
- **Routing.** A message goes to shard ``crc32(id) mod K`` of its ``id`` (a label-only
  record: of its ``ref``), so a delayed label or a correction reaches the shard that
  holds the message's cache entry; a message without either goes to any shard.
- **The sum.** A worker serving ``M`` holds one replica per shard (each equal to that
  shard's snapshot and log, as for any model) and predicts with their sum
  (:class:`ShardSum`).

>>> shard_names("mail", 1)
['mail']
>>> shard_names("mail", 3)
['mail|0.4', 'mail|1.1', 'mail|2']
>>> [shard_of(i, 3) for i in ("a", "b", "m1")], shard_of(None, 3) is None
([0, 2, 0], True)
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from streamnb_workers.replication.replica import Replica
from streamnb_workers.store.keys import MAX_SHARDS, ModelKeys
from streamnb_workers.store.model_config import ModelConfig, ModelSpec, read_config
from streamnb_workers.wire.replies import as_str

__all__ = ["ShardSum", "Router", "keys_of", "load_model", "load_replicas", "load_summed", "route_id", "shard_names", "shard_of", "source_weights", "stored_shards",
           "sum_models"]

#: Kinds whose statistics are counts: their sum follows each delta in place (exact while
#: the weights are, e.g. integers); other kinds' is summed anew in shard order.
COUNT_KINDS = frozenset({"bernoulli", "multinomial", "categorical"})


def shard_names(model: str, k: int) -> list[str]:
    """The names of the ``k`` shards of ``model`` (``[model]`` for one; module docstring)."""
    if not 1 <= k <= MAX_SHARDS:
        raise ValueError(f"shards must be in 1..{MAX_SHARDS}, got {k}")
    if k == 1:
        return [model]
    names = []
    for j in range(k):
        for s in itertools.count():
            name = f"{model}|{j}" if s == 0 else f"{model}|{j}.{s}"
            if key_slot(ModelKeys(name).input.encode()) * k // REDIS_CLUSTER_HASH_SLOTS == j:
                break
        names.append(name)
    return names


def shard_of(msg_id: str | None, k: int) -> int | None:
    """The shard of the message ``msg_id`` among ``k`` (None: no id, any shard)."""
    if msg_id is None:
        return None
    return zlib.crc32(str(msg_id).encode("utf-8", "surrogatepass")) % k


def route_id(record: Any) -> str | None:
    """What a wire record is routed by: its ``ref`` (a label for an earlier message), else
    its ``id``; None if it has neither (or is not a map)."""
    if not isinstance(record, dict):
        return None
    for field in ("ref", "id"):
        value = record.get(field)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
    return None


def stored_shards(client: Any, model: str) -> int:
    """K of the stored model ``model`` (1 if it has no config or is not sharded), read with
    HMGET, the one command the ``streamnb-producer`` user of deploy/redis/users.acl has
    for a model's config.

    >>> import fakeredis
    >>> from streamnb_workers.store.model_config import ensure_config
    >>> r = fakeredis.FakeRedis()
    >>> _ = ensure_config(r, ModelSpec("mail", kind="multinomial", shards=3))
    >>> stored_shards(r, "mail"), stored_shards(r, "other")
    (3, 1)
    """
    value = client.hmget(ModelKeys(model).config, ["shards"])[0]
    return 1 if value is None else int(as_str(value))


def keys_of(model: str, k: int) -> list[ModelKeys]:
    """The keys of the ``k`` shards of ``model`` in shard order (``k`` 1: the model's).

    >>> [k.input for k in keys_of("mail", 2)]
    ['streamnb:{mail|0}:in', 'streamnb:{mail|1.1}:in']
    """
    return [ModelKeys(name) for name in shard_names(model, k)]


class Router:
    """Picks the ``:in`` (or ``:out``) key of a message of a model with ``k`` shards: by
    its id, else in turn.

    >>> r = Router("mail", 2)
    >>> r.keys_for("x1").input, r.keys_for(None).input, r.keys_for(None).input
    ('streamnb:{mail|1.1}:in', 'streamnb:{mail|0}:in', 'streamnb:{mail|1.1}:in')
    >>> Router("mail", 1).keys_for("x1").input
    'streamnb:{mail}:in'
    """

    def __init__(self, model: str, k: int) -> None:
        self.keys = keys_of(model, k)
        self._turn = itertools.cycle(range(k))

    def keys_for(self, msg_id: str | None) -> ModelKeys:
        j = shard_of(msg_id, len(self.keys))
        return self.keys[next(self._turn) if j is None else j]


class ShardSum:
    """The model a worker predicts with when it serves the K shards of a model: the sum
    of the shard replicas' statistics, taken in shard order.

    Each replica reports what it applied (``on_change``). For the count kinds the sum
    merges each delta as its shard did (exact while the weights are exact in float64);
    a decay, a reload, an unreadable entry, and any change of another kind, have it summed
    anew from the shards in shard order when it is next used. Workers at the same vector
    of shard versions so hold equal sums.

    >>> import fakeredis, numpy as np
    >>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
    >>> from streamnb_workers.replication.replica import Replica, encode_delta
    >>> r = fakeredis.FakeRedis()
    >>> spec = ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 2})
    >>> reps = [Replica(r, ModelKeys(n), ensure_config(r, ModelSpec(n, kind="multinomial",
    ...         featurizer_config={"bits": 2}))).load() for n in shard_names("doc", 2)]
    >>> total = ShardSum(reps[0].config, reps)
    >>> for rep, (x, y) in zip(reps, [([1, 0, 2, 0], "ham"), ([0, 3, 0, 1], "spam")]):
    ...     d = rep.model.batch_stats(np.array([x], dtype=float), [y])
    ...     _ = r.xadd(rep.keys.log, {"data": encode_delta(d, None, 1, "w", "b")})
    ...     _ = rep.catch_up()
    >>> total.model.stats["features"].toarray().tolist()
    [[1.0, 0.0, 2.0, 0.0], [0.0, 3.0, 0.0, 1.0]]
    """

    def __init__(self, config: ModelConfig, replicas: Sequence[Any]) -> None:
        self.config = config
        self.replicas = list(replicas)
        self.in_place = config.kind in COUNT_KINDS
        self._model: Any = None  # None: to be summed anew
        #: Times the sum was taken anew from the shards.
        self.resums = 0
        for rep in self.replicas:
            rep.on_change = self._changed

    def _changed(self, add: Any = None, sub: Any = None) -> None:
        """A shard applied ``add`` then took off ``sub`` (both None: anything else)."""
        if self._model is None:
            return
        if not self.in_place or (add is None and sub is None):
            self._model = None
            return
        try:
            if add is not None:
                self._model.merge_stats(add)
            if sub is not None:
                self._model.subtract_stats(sub)
        except ValueError:  # cannot be, as the shard took it; summed anew to be sure
            self._model = None

    @property
    def model(self) -> Any:
        """The summed model (taken anew if a shard's change asked for it)."""
        if self._model is None:
            self._model = sum_models(self.config, [rep.model for rep in self.replicas])
            self.resums += 1
        return self._model

    @property
    def version(self) -> str:
        """The shards' versions joined by ``,``."""
        return ",".join(rep.version for rep in self.replicas)


def sum_models(config: ModelConfig, models: Sequence[Any]) -> Any:
    """A new model of ``config`` holding the sum of ``models``' statistics, added in order."""
    total = config.make_model()
    for model in models:
        total.merge_stats(model.stats.copy())
    return total


def shard_spec(config: ModelConfig, name: str | None = None) -> ModelSpec:
    """The spec of the shard ``name`` of the model stored as ``config``: every setting of
    the model's (a shard is created, or checked, from the model's own config); without
    ``name``, the spec of the model itself, its number of shards included (to write its
    config back if Redis lost it)."""
    return ModelSpec(name or config.name, kind=config.kind, model_params=config.model_params,
                     featurizer_config=config.featurizer, decision=config.decision,
                     half_life=config.half_life, error_weight=config.error_weight,
                     classes=config.classes, shards=None if name else config.shards,
                     explain=config.explain, training=config.training)


def load_summed(client: Any, model: str) -> tuple[Any, str] | None:
    """The current model of a sharded ``model`` (its K shards' snapshots and logs, summed)
    and its version (the shards' versions joined by ``,``); None if it is not sharded."""
    cfg = read_config(client, model)
    if cfg is None or cfg.shards == 1:
        return None
    return load_replicas(client, model)[:2]


def load_replicas(client: Any, name: str) -> tuple[Any, str, list[Replica]]:
    """The current model of ``name`` (snapshot + log; a sharded model's K shards summed),
    its version (the shards' versions joined by ``,``) and the replicas it was read from.

    Raises LookupError if the model has no stored config.
    """
    cfg = read_config(client, name)
    if cfg is None:
        raise LookupError(f"model {name!r} has no config in Redis (no worker has served it)")
    if cfg.shards == 1:
        rep = Replica(client, ModelKeys(name), cfg).load()
        return rep.model, rep.version, [rep]
    replicas = []
    for shard in shard_names(name, cfg.shards):
        shard_cfg = read_config(client, shard)
        replicas.append(Replica(client, ModelKeys(shard), shard_cfg or cfg).load())
    return ShardSum(cfg, replicas).model, ",".join(rep.version for rep in replicas), replicas


def load_model(client: Any, name: str) -> tuple[Any, str]:
    """The current model of ``name`` (snapshot + log) and its version, for status/export.

    Raises LookupError if the model has no stored config.
    """
    return load_replicas(client, name)[:2]


def source_weights(replicas: Sequence[Replica]) -> dict[str, dict[str, float]]:
    """source -> {class (as str): weight it taught}, summed over ``replicas`` (shards)."""
    out: dict[str, dict[str, float]] = {}
    for rep in replicas:
        for source, weights in rep.sources.weights(rep.model).items():
            mine = out.setdefault(source, {})
            for label, w in weights.items():
                mine[str(label)] = mine.get(str(label), 0.0) + w
    return dict(sorted(out.items()))
