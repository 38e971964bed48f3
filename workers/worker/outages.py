"""Models whose Redis node a worker cannot reach, while it serves its other models.

On a Redis Cluster a worker's models (and a sharded model's shards, workers/replication/shards.py)
live in different slots, so on different masters: one master down stops only the models
in its slots. A Redis error in one model's step puts that model *away*
(:meth:`ModelGuard.put_away`): its work in progress is dropped (its entries stay pending
in its ``:in``, redone once it is back), its ``streamnb_model_reachable`` gauge reads 0,
the clients read the cluster's map anew, and it is tried again after its own bounded
backoff, while the other models are served. Without a cluster every model is on the one
server, and an error stops the whole worker (workers/worker/loop.py ``_recover``).

>>> import random
>>> o = Outages(lambda: Backoff(1.0, 4.0, rng=random.Random(0)))
>>> o.due("m|0", now=100.0)
True
>>> delay = o.away("m|0", now=100.0)
>>> o.due("m|0", now=100.0), o.due("m|0", now=100.0 + delay), sorted(o)
(False, True, ['m|0'])
>>> o.back("m|0"), o.back("m|0"), list(o)
(True, False, [])
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from streamnb_workers.store.backoff import Backoff
from streamnb_workers.store.connection import refresh_cluster_view
from streamnb_workers.store.errors import UNREACHABLE_KINDS, error_kind
from streamnb_workers.worker.committing import abandon
from streamnb_workers.worker.housekeeping import drop_sampled_gauges

__all__ = ["ModelGuard", "Outages"]

log = logging.getLogger("streamnb.worker")


class Outages:
    """Per model away: when it is tried again, and its backoff (see the module docstring)."""

    def __init__(self, new_backoff: Callable[[], Backoff]) -> None:
        self._new_backoff = new_backoff
        self._away: dict[str, tuple[float, Backoff]] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(self._away)

    def __len__(self) -> int:
        return len(self._away)

    def due(self, name: str, now: float) -> bool:
        """Whether the model ``name`` is served this step: not away, or its retry is due."""
        entry = self._away.get(name)
        return entry is None or now >= entry[0]

    def away(self, name: str, now: float) -> float:
        """The model ``name`` failed (again): returns the seconds until it is tried again."""
        backoff = self._away[name][1] if name in self._away else self._new_backoff()
        delay = backoff.next_delay()
        self._away[name] = (now + delay, backoff)
        return delay

    def back(self, name: str) -> bool:
        """The model ``name`` was served without an error; True if it was away."""
        return self._away.pop(name, None) is not None

    def next_retry(self) -> float | None:
        """When the first model away is tried again (None: none is away)."""
        return min((at for at, _ in self._away.values()), default=None)


class ModelGuard:
    """Runs the parts of a worker's step model by model; while :attr:`active` (a cluster,
    several models), a transient Redis error in one puts that model away instead of
    stopping the worker (see the module docstring)."""

    def __init__(self, new_backoff: Callable[[], Backoff]) -> None:
        self.outages = Outages(new_backoff)
        self.active = False
        #: The worker's clients (command, blocking reads), whose cluster map is read anew.
        self.clients: tuple[Any, ...] = ()
        #: The models that failed in the current step.
        self.failed: set[str] = set()

    def live(self, rts: list[Any], now: float) -> list[Any]:
        """A new step: the models served in it (not away, or due for a retry)."""
        self.failed.clear()
        return [rt for rt in rts if self.outages.due(rt.name, now)]

    def serving(self, rts: list[Any]) -> list[Any]:
        """Those of ``rts`` that did not fail in this step."""
        return [rt for rt in rts if rt.name not in self.failed]

    def __call__(self, rt: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, a part of model ``rt``'s step (None if it put the model away)."""
        if not self.active:
            return fn(*args)
        try:
            return fn(*args)
        except Exception as exc:
            kind = error_kind(exc)
            if kind is None:
                raise
            self.put_away(rt, exc, kind)
            return None

    def put_away(self, rt: Any, exc: BaseException, kind: str) -> None:
        """Model ``rt``'s Redis node failed: drop its work in progress (its entries stay
        pending, redone when it is back) and try it again after its own backoff."""
        self.failed.add(rt.name)
        rt.series(rt.metrics.redis_errors, kind=kind).inc()
        rt.series(rt.metrics.reconnects).inc()
        rt.series(rt.metrics.model_reachable).set(0)
        if kind in UNREACHABLE_KINDS:
            drop_sampled_gauges(rt)
        for client in self.clients:
            refresh_cluster_view(client)
        abandon(rt, withdraw=False)
        rt.redo_pending()
        delay = self.outages.away(rt.name, time.monotonic())
        log.warning("model %s: redis %s error: %s; serving the other models, trying this one "
                    "again in %.2fs", rt.name, kind, exc, delay)

    def came_back(self, rts: list[Any]) -> None:
        """The models of ``rts`` served without an error in this step: those that were
        away are reachable again."""
        for rt in self.serving(rts):
            if self.outages.back(rt.name):
                rt.series(rt.metrics.model_reachable).set(1)
                log.info("model %s: Redis reached again; served again", rt.name)
