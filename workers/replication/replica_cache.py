"""The replicas a worker holds in memory, bounded in bytes, least recently used evicted.

A worker serving many models (per-user models: docs/worker.md, "Many models") need not
hold all their statistics. :class:`ReplicaCache` keeps the replicas of the models it
served most recently while their arrays (:func:`model_nbytes`) fit ``budget`` bytes;
the others are *evicted* (:meth:`Replica.evict`: the statistics dropped, the version
kept for the heartbeat). A batch of an evicted model first loads it again from
``:snapshot`` and ``:log`` (:meth:`use`), exactly as a worker joining late does, so the
replica is bit-identical to one never evicted: both are the snapshot plus every log
entry after it, applied in log order.

- Given ``resident`` (the worker's: :func:`resident_bytes`), the budget bounds the
  process's resident memory: the replicas take what the rest of the process leaves, the
  rest measured as the RSS less the held replicas before each load (:meth:`use`), after
  each batch (:meth:`measure`) and between steps (:meth:`hold`, where freed memory goes
  back to the system, ``release``, and replicas are evicted until the RSS fits). A load
  first makes room for the replica (its size when last held, or the last replica's if
  larger). A held replica counts its arrays and :data:`REPLICA_OBJECTS`.
- The replica being used is never evicted, so one model larger than the budget is still
  served. Within a step the bound is passed only by what grows between two
  measurements: a step's read before its first batch, a batch's and a load's
  temporaries (docs/worker.md, "Many models").
- A replica with work in flight (``busy``: a commit on the wire whose reply may need the
  statistics to rebuild it) is not evicted until that is settled.
- Replicas not registered (the shards of a sharded model, summed by
  workers/replication/shards.py) are held for good and not counted.
- A *pinned* replica (:meth:`pin`: the global model's, which every per-user
  :class:`~streamnb_workers.replication.user_sum.UserSum` reads) is never evicted; it is
  counted.
- What a replica's model derives and holds beside it (:meth:`attach`: a per-user model's
  summed user+global model) is counted with it and dropped when it is evicted, as is its
  challenger's model (workers/replication/challenger.py).

>>> import fakeredis
>>> import numpy as np
>>> from streamnb_workers.replication.replica import encode_delta
>>> from streamnb_workers.store.keys import ModelKeys
>>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
>>> r = fakeredis.FakeRedis()
>>> cache, reps = ReplicaCache(budget=3000 + REPLICA_OBJECTS), {}
>>> for name in ("a", "b"):
...     cfg = ensure_config(r, ModelSpec(name, kind="multinomial", featurizer_config={"bits": 8}))
...     reps[name] = Replica(r, ModelKeys(name), cfg)
...     delta = cfg.make_model().batch_stats(np.ones((1, 256)), ["ham"])
...     _ = r.xadd(ModelKeys(name).log, {"data": encode_delta(delta, None, 1, "w", "b")})
...     cache.add(name, reps[name])      # loaded: 2 KiB each, so "a" is evicted
>>> reps["a"].evicted, reps["b"].evicted, cache.held, cache.evictions
(True, False, 1, 1)
>>> cache.use("a"), reps["a"].learnt, reps["b"].evicted, cache.loads, cache.held_bytes
(True, 1, True, 1, 10256)
>>> cache.use("a")                       # held: nothing to load
False
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from streamnb_workers.replication.replica import Replica

__all__ = ["CacheMetrics", "ReplicaCache", "model_nbytes", "resident_bytes"]

#: Bytes of a memory page (``/proc/self/statm`` counts pages).
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

#: Bytes a held replica costs besides its arrays (its model's Python objects and what
#: loading it leaves in the heap: 3-8 KiB measured), counted with each so that held
#: replicas of empty models are evicted too.
REPLICA_OBJECTS = 8192

#: Bytes evicted within a step after which the freed memory goes back to the system at
#: once (``malloc_trim`` walks the heap: not after every eviction of a backlog spread over
#: thousands of users, but not only at the step's end either).
RELEASE_BYTES = 32 * 2**20

#: Bytes a model served adds to the worker's next read, made after :meth:`ReplicaCache.hold`
#: and alive while it blocks (the command naming every stream, its reply): kept free
#: under the budget (about 400 bytes a model measured at 10,000 models).
READ_BYTES = 512

#: Replicas registered beyond this many start evicted under a bound, loaded for their
#: first batch (a worker starting with thousands of models reads no snapshot for them).
LOADED_AT_ADD = 8

#: How deep :func:`model_nbytes` walks a model's attributes for arrays.
_DEPTH = 6


def model_nbytes(model: Any) -> int:
    """Bytes of the numpy arrays a model holds (its statistics and the tables derived
    from them), each array counted once; what the cache's budget bounds. The Python
    objects around them (a few KiB per model) are not counted."""
    seen: set[int] = set()
    total = 0
    stack: list[tuple[Any, int]] = [(model, 0)]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > _DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            base = obj if obj.base is None or not isinstance(obj.base, np.ndarray) else obj.base
            if id(base) not in seen or base is obj:
                seen.add(id(base))
                total += base.nbytes
            continue
        if isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = list(obj)
        else:
            children = list(getattr(obj, "__dict__", {}).values())
            for slot in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, slot):
                    children.append(getattr(obj, slot))
        stack += [(c, depth + 1) for c in children]
    return total


def resident_bytes() -> int | None:
    """The process's resident memory (RSS) in bytes, from ``/proc/self/statm``; None
    where there is no such file (not Linux).

    >>> n = resident_bytes()
    >>> n is None or n > 2**20
    True
    """
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class ReplicaCache:
    """Registered replicas, most recently used last; see the module docstring.
    ``budget``: bytes (0: no bound, nothing is evicted)."""

    def __init__(self, budget: int = 0, on_change: Callable[[ReplicaCache], None] | None = None,
                 resident: Callable[[], int | None] | None = None,
                 release: Callable[[], Any] | None = None) -> None:
        self.budget = int(budget)
        #: The process's resident bytes (:func:`resident_bytes`), or None: the budget
        #: bounds the replicas' arrays alone. ``release``: hands freed heap memory back to
        #: the system (glibc's ``malloc_trim``), called after evictions: by :meth:`hold`,
        #: and within a step every :data:`RELEASE_BYTES` evicted.
        self.resident, self.release = resident, release
        #: Resident bytes besides the held replicas' arrays (the interpreter, every model's
        #: runtime, the allocator's slack), as last measured (:meth:`hold`).
        self.rest = 0
        #: Bytes evicted since the last release.
        self.freed = 0
        #: name -> (replica, busy); order: least recently used first.
        self.entries: OrderedDict[str, tuple[Replica, Callable[[], bool]]] = OrderedDict()
        #: Bytes of each held replica, measured when it was last used; least recently used
        #: first (what :meth:`trim` walks: the held replicas, not every model served).
        self.sizes: OrderedDict[str, int] = OrderedDict()
        #: The sum of :attr:`sizes` (kept as they change: a worker holds thousands).
        self._held_bytes = 0
        #: ``replica.applied`` of each held replica when it was last measured.
        self.applied: dict[str, int] = {}
        self.loads = 0
        self.evictions = 0
        #: Bytes of each replica when it was last measured, evicted ones too, and of the
        #: last one measured (not pinned): the room made before a load is the larger.
        self.known: dict[str, int] = {}
        self.last_size = REPLICA_OBJECTS
        #: Seconds the last :meth:`use` spent loading (0.0 if the replica was held).
        self.load_s = 0.0
        #: Called after each change of what is held (metrics).
        self.on_change = on_change
        #: Names never evicted (:meth:`pin`).
        self.pinned: set[str] = set()
        #: name -> what the replica's model derives (``nbytes()``, ``drop()``): :meth:`attach`.
        self.derived: dict[str, Any] = {}
        #: name -> called when its replica is evicted (:meth:`add`'s ``on_evict``).
        self.on_evict: dict[str, Callable[[], Any]] = {}
        #: Bytes kept free for a read of new entries, made in groups that bring at most
        #: that much (workers/replication/read_plan.py); 0 with few models (one read).
        self.read_room = 0

    @property
    def limit(self) -> int:
        """Bytes the held replicas may take: the budget, less the rest of the process's
        resident memory and room for the next read (:data:`READ_BYTES` a model) when that
        is bounded (never below 0)."""
        if self.resident is None:
            return self.budget
        return max(0, self.budget - self.rest - READ_BYTES * len(self.entries) - self.read_room)

    @property
    def held(self) -> int:
        """Replicas held in memory."""
        return len(self.sizes)

    @property
    def held_bytes(self) -> int:
        return self._held_bytes

    def _forget_size(self, name: str) -> int:
        """Model ``name``'s replica no longer held: its bytes (0 if it was not)."""
        size = self.sizes.pop(name, 0)
        self._held_bytes -= size
        return size

    def add(self, name: str, replica: Replica, busy: Callable[[], bool] = lambda: False,
            on_evict: Callable[[], Any] | None = None) -> None:
        """Register ``replica`` as model ``name``'s (``busy``: it must stay held now;
        ``on_evict``: called when it is evicted), and load it if the budget is not full
        yet and at most :data:`LOADED_AT_ADD` are registered; else it is loaded for its
        first batch (a worker starting with many models does not read every snapshot)."""
        self.entries[name] = (replica, busy)
        self.entries.move_to_end(name)
        if on_evict is not None:
            self.on_evict[name] = on_evict
        self._measure_rest()
        if 0 < self.budget and (self.limit <= self.held_bytes or len(self.entries) > LOADED_AT_ADD):
            replica.evict()
            self._changed()
        else:
            replica.load()
            self._size(name)
            self.trim(keep=name)
            self._changed()

    def pin(self, name: str) -> None:
        """Never evict model ``name``'s replica (others read it: a per-user model's sum
        reads the global model's); it is loaded now if it was evicted."""
        if name in self.entries:
            self.use(name)
            self.pinned.add(name)

    def attach(self, name: str, derived: Any) -> None:
        """``derived`` (``nbytes()``: bytes it holds, ``drop()``: let them go) is held
        with model ``name``'s replica: counted in its size, dropped when it is evicted."""
        self.derived[name] = derived
        if name in self.sizes:
            self.measure(name)

    def _size(self, name: str) -> None:
        """Model ``name``'s replica measured (:attr:`sizes`, :attr:`known`)."""
        size = self.known[name] = self._nbytes(name)
        self._held_bytes += size - self.sizes.get(name, 0)
        self.sizes[name] = size
        if name not in self.pinned:
            self.last_size = self.sizes[name]

    def _nbytes(self, name: str) -> int:
        derived, replica = self.derived.get(name), self.entries[name][0]
        return REPLICA_OBJECTS + model_nbytes(replica.model) + model_nbytes(
            getattr(replica.challenger, "model", None)) + (
            0 if derived is None else derived.nbytes())

    def use(self, name: str) -> bool:
        """Model ``name``'s replica, about to predict and learn: loaded from its snapshot
        and log if it was evicted, marked most recently used, and others evicted to fit
        the budget. Returns whether it was loaded; False for a name not registered."""
        entry = self.entries.get(name)
        self.load_s = 0.0
        if entry is None:
            return False
        replica = entry[0]
        self.entries.move_to_end(name)
        if name in self.sizes:
            self.sizes.move_to_end(name)
        loaded = replica.evicted
        if loaded:
            # room first (the rest measured now: what the step read and made counts)
            self._measure_rest()
            self.trim(room=max(self.known.get(name, 0), self.last_size))
            t0 = time.perf_counter()
            replica.load()
            self.load_s = time.perf_counter() - t0
            self.loads += 1
        if loaded or name not in self.sizes:  # (else measured after its last change)
            self._size(name)
            self.trim(keep=name)
            self._changed()
        return loaded

    def measure(self, name: str, changed: bool = True) -> None:
        """Model ``name``'s replica measured again, and others evicted to fit: after a
        batch or a look of the observer (``changed``: a prediction builds the tables
        derived from the statistics), or after the log is applied (``changed`` False:
        measured only if it applied entries since it was last measured)."""
        if name not in self.sizes:
            return
        replica = self.entries[name][0]
        if not changed and self.applied.get(name) == replica.applied:
            return
        self.applied[name] = replica.applied
        self._size(name)
        if changed:  # after a batch: the rest measured now, temporaries and all
            self._measure_rest()
        self.trim(keep=name)
        self._changed()

    def trim(self, keep: str | None = None, room: int = 0) -> int:
        """Evict the least recently used replicas (not ``keep``, not a pinned or busy one) while the
        held bytes (and ``room``: a replica about to be loaded) exceed the budget; returns how
        many were evicted."""
        if self.budget <= 0:
            return 0
        evicted = 0
        total, limit = self.held_bytes + room, self.limit
        if total <= limit:  # (no walk of thousands of entries)
            return 0
        victims = []  # (least recently used first; no copy of thousands of names)
        for name, size in self.sizes.items():
            if total <= limit:
                break
            if name == keep or name in self.pinned or self.entries[name][1]():
                continue
            victims.append(name)
            total -= size
        for name in victims:
            replica = self.entries[name][0]
            replica.evict()
            if name in self.derived:
                self.derived[name].drop()
            if name in self.on_evict:
                self.on_evict[name]()
            self.freed += self._forget_size(name)
            evicted += 1
        self.evictions += evicted
        if evicted:
            if self.freed >= RELEASE_BYTES and self.release is not None:
                self.release()  # (else by the next hold(): a step may evict a replica a batch)
                self.freed = 0
            self._changed()
        return evicted

    def hold(self) -> int:
        """Between steps: keep the process's resident memory under the budget. When it is
        over, freed heap memory goes back to the system first, then the least recently
        used replicas are evicted (:meth:`trim`) until the measured rest and the held
        replicas fit, and again while the RSS stays over. Returns how many were evicted
        (nothing to do without ``resident``)."""
        evicted = 0
        while self.resident is not None and self.budget > 0:
            rss = self.resident()
            if rss is None:
                break
            if (rss > self.budget or self.freed) and self.release is not None:
                self.release()  # what evictions freed, back to the system
                rss = self.resident() or rss
            self.freed = 0
            self.rest = max(0, rss - self.held_bytes)
            # the last used stays: a worker whose rest is over the budget still holds one
            n = self.trim(keep=next(reversed(self.entries), None))
            evicted += n
            # an array's pages never written (np.zeros) were not resident: evicting it
            # gave back less than it counted, so look again
            if not n or (self.resident() or 0) <= self.budget - READ_BYTES * len(
                    self.entries) - self.read_room:
                break
        return evicted

    def before_read(self) -> None:
        """Before a read of new entries within a step: the rest measured now (what the
        step's earlier groups left is gone) and room made for the read (:attr:`read_room`;
        the last used replica stays)."""
        if self.budget > 0 and self.resident is not None:
            self._measure_rest()
            self.trim(keep=next(reversed(self.entries), None))

    def _measure_rest(self) -> None:
        """The resident bytes besides the held arrays, measured now; over the budget after
        evictions, freed heap memory goes back to the system first (``release``: tenths
        of a ms), so that what evictions freed is not counted as the rest."""
        rss = None if self.resident is None else self.resident()
        if rss is not None and self.freed and self.release is not None and \
                rss > self.budget - self.read_room:
            self.release()
            self.freed = 0
            rss = self.resident() or rss
        if rss is not None:
            self.rest = max(0, rss - self.held_bytes)

    def remove(self, name: str) -> None:
        """Forget model ``name`` (no longer served)."""
        self.entries.pop(name, None)
        self._forget_size(name)
        self.known.pop(name, None)
        self.derived.pop(name, None)
        self.on_evict.pop(name, None)
        self.pinned.discard(name)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)


class CacheMetrics:
    """Shows a :class:`ReplicaCache` in a worker's metrics (workers/observe/metrics.py:
    ``replicas_held``, ``replica_bytes``, ``replica_loads_total``,
    ``replica_evictions_total``, ``replica_load_seconds``); its ``on_change``."""

    def __init__(self, metrics: Any, worker: str) -> None:
        self.metrics, self.worker = metrics, worker
        self.loads = self.evictions = 0

    def __call__(self, cache: ReplicaCache) -> None:
        m, w = self.metrics, {"worker": self.worker}
        m.replicas_held.labels(**w).set(cache.held)
        m.replica_bytes.labels(**w).set(cache.held_bytes)
        if cache.loads > self.loads:
            m.replica_loads.labels(**w).inc(cache.loads - self.loads)
            m.replica_load_seconds.labels(**w).observe(cache.load_s)
        if cache.evictions > self.evictions:
            m.replica_evictions.labels(**w).inc(cache.evictions - self.evictions)
        self.loads, self.evictions = cache.loads, cache.evictions
