"""A user's model as the workers predict with it: the global model's statistics plus the
user's own, and the per-user models a worker of the global model is to serve.

A per-user (or per-domain) model ``U`` of the global model ``G`` (names and registry:
workers/store/user_models.py) is a model of its own, created with every setting of
``G``'s. A worker serving ``U`` predicts ``U``'s mail with :class:`UserSum`: the sum of
``G``'s statistics and ``U``'s, added as a sharded model's shards are
(:func:`~streamnb_workers.replication.shards.sum_models`, ``G`` first), so a user's
verdict is the one a model that learnt both ``G``'s mail and ``U``'s would give. Until
``U`` has learnt ``min_weight`` (the total weight of its class counts: a message counts
its learnt weight), ``U``'s part is left out and ``U``'s mail gets ``G``'s verdict.

The sum is taken anew when either model changed since it was last taken (a version, an
applied entry, or a reload of either), when it is next used: a global model that learns
costs each user model one sum per batch of that user's mail, not one per global delta.
A worker's memory bound (workers/replication/replica_cache.py) counts the sum with the
user's replica (:meth:`UserSum.nbytes`) and drops it with that replica
(:meth:`UserSum.drop`); the global model's replica is pinned while users are served.

>>> import fakeredis, numpy as np
>>> from streamnb_workers.replication.replica import Replica, encode_delta
>>> from streamnb_workers.store.keys import ModelKeys
>>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
>>> r = fakeredis.FakeRedis()
>>> g = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 2}))
>>> u = create_user_model(r, "doc", "doc.u.a_40b.org")
>>> reps = [Replica(r, ModelKeys(c.name), c).load() for c in (g, u)]
>>> total = UserSum(u, reps[0], reps[1], min_weight=2)
>>> for rep, x, y in [(reps[0], [1, 0, 2, 0], "ham"), (reps[1], [0, 3, 0, 1], "spam")]:
...     d = rep.model.batch_stats(np.array([x], dtype=float), [y])
...     _ = r.xadd(rep.keys.log, {"data": encode_delta(d, None, 1, "w", "b")})
...     _ = rep.catch_up()
>>> total.model is reps[0].model, total.user_weight()  # one message: below 2
(True, 1.0)
>>> total.min_weight = 1
>>> total.model.stats["features"].toarray().tolist()
[[1.0, 0.0, 2.0, 0.0], [0.0, 3.0, 0.0, 1.0]]
"""

from __future__ import annotations

from typing import Any

from streamnb_workers.replication.replica_cache import model_nbytes
from streamnb_workers.replication.shards import shard_spec, sum_models
from streamnb_workers.store.model_config import ModelConfig, ensure_config, read_config
from streamnb_workers.store.user_models import register, registry_key, user_models

__all__ = ["UserModelWatch", "UserSum", "create_user_model"]

def create_user_model(client: Any, model: str, name: str) -> ModelConfig:
    """Create (or check) the per-user or per-domain model ``name`` of the global model
    ``model`` with every setting of ``model``'s (one shard whatever ``model``'s number),
    and register it; its config. Raises LookupError if ``model`` has no config."""
    base = read_config(client, model)
    if base is None:
        raise LookupError(f"model {model!r} has no config in Redis (no worker has served it)")
    cfg = ensure_config(client, shard_spec(base, name))
    register(client, model, name)
    return cfg


class UserSum:
    """What a user's model predicts with: ``base`` (the global model's replica, or the
    :class:`~streamnb_workers.replication.shards.ShardSum` of its shards: anything with
    ``model`` and ``version``) plus ``user`` (the user's replica), the user's part only
    once it weighs ``min_weight``."""

    def __init__(self, config: ModelConfig, base: Any, user: Any, min_weight: float) -> None:
        self.config = config
        self.base = base
        self.user = user
        self.min_weight = float(min_weight)
        self._model: Any = None
        self._key: tuple[Any, ...] | None = None
        #: Times the sum was taken anew.
        self.resums = 0

    def user_weight(self) -> float:
        """The total weight the user's model has learnt (its class counts' sum)."""
        model = self.user.model
        if not model.__sklearn_is_fitted__():  # no statistics yet
            return 0.0
        return float(model.stats["classes"].counts.sum())

    @property
    def model(self) -> Any:
        """The global model while the user's part weighs less than ``min_weight``, else
        the sum (taken anew if either changed)."""
        base_model = self.base.model
        if self.user_weight() < self.min_weight:
            return base_model
        key = (self.base.version, id(base_model), getattr(self.base, "applied", None),
               self.user.version, id(self.user.model), self.user.applied)
        if key != self._key:
            self._model = sum_models(self.config, [base_model, self.user.model])
            self._key = key
            self.resums += 1
        return self._model

    def nbytes(self) -> int:
        """Bytes of the sum's arrays (0 while none is held): counted with the user's
        replica by workers/replication/replica_cache.py."""
        return 0 if self._model is None else model_nbytes(self._model)

    def drop(self) -> None:
        """Let the sum go (the user's replica was evicted); taken anew when next used."""
        self._model, self._key = None, None


class UserModelWatch:
    """The per-user models of a worker's models that it does not serve yet: SCARD of each
    registry, SMEMBERS only when a count changed (cheap to ask every second)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def new_models(self, client: Any, models: list[str], served: Any) -> list[tuple[str, ModelConfig]]:
        """``(global model, config)`` of each registered per-user model of ``models`` not in
        ``served`` (a config Redis lost is written again from the global model's)."""
        found = []
        for model in models:
            count = int(client.scard(registry_key(model)))
            if self._counts.get(model) == count:
                continue
            self._counts[model] = count
            for name in user_models(client, model):
                if name not in served:
                    cfg = read_config(client, name) or create_user_model(client, model, name)
                    found.append((model, cfg))
        return found
