"""Models whose Redis node a worker cannot reach, while it serves its other models.

On a Redis Cluster a worker's models (and a sharded model's shards, workers/shards.py)
live in different slots, so on different masters: one master down stops only the models
in its slots. A Redis error in one model's step puts that model *away*: its work in
progress is dropped (its entries stay pending in its ``:in``, redone once it is back), its
``streamnb_model_reachable`` gauge reads 0, and it is tried again after its own bounded
backoff, while the other models are served. Without a cluster every model is on the one
server, and an error stops the whole worker (workers/loop.py ``_recover``).

>>> import random
>>> from streamnb_workers.backoff import Backoff
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

from collections.abc import Callable, Iterator

from streamnb_workers.backoff import Backoff

__all__ = ["Outages"]


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
