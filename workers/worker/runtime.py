"""What a worker keeps for one model it serves: its config and featurizer, its replica,
snapshotter, observer and ``{M}:inflight`` board, its timers, the commit on the wire and
the batch read ahead, and where its metrics and events go; and what happens to that
state, in methods: no other module assigns it. It knows nothing of the worker that holds
it: the worker gives it what it needs.

>>> import fakeredis
>>> from prometheus_client import CollectorRegistry
>>> from streamnb_workers.observe.metrics import Metrics
>>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
>>> r = fakeredis.FakeRedis()
>>> cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 4}))
>>> rt = ModelRuntime(cfg, r, WorkerOptions(consumer="w1"), Metrics(CollectorRegistry()))
>>> rt.replica.load().version, rt.alone()
('0-0', True)
>>> rt.events("drift", {"detector": "adwin"}); r.xlen(rt.keys.events)
1
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Callable
from typing import Any

import redis

from streamnb.encoding import dumps
from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.observe.observer import ModelObserver
from streamnb_workers.observe.series import MetricSeries, StageTimer
from streamnb_workers.observe.token_names import TokenNames
from streamnb_workers.replication.challenger import Challenger, stored_spec
from streamnb_workers.replication.ordering import InflightBoard
from streamnb_workers.replication.replica import Replica
from streamnb_workers.replication.replica_cache import ReplicaCache
from streamnb_workers.replication.snapshotter import Snapshotter
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelConfig
from streamnb_workers.worker.commit_wire import CommitWire
from streamnb_workers.worker.intake import (
    ReadBatch,
    claim_idle,
    read_behind,
    read_commands,
    read_next,
)
from streamnb_workers.worker.options import WorkerOptions
from streamnb_workers.worker.timers import Timers

__all__ = ["EventSink", "Lazy", "ModelRuntime", "shared_featurizer"]

log = logging.getLogger("streamnb.worker")


class EventSink:
    """Appends one model's drift and operational events to ``{M}:events`` (msgpack: kind,
    time, worker and the event's fields)."""

    __slots__ = ("client", "key", "worker", "maxlen")

    def __init__(self, client: Any, keys: ModelKeys, worker: str, maxlen: int) -> None:
        self.client, self.key, self.worker, self.maxlen = client, keys.events, worker, maxlen

    def __call__(self, kind: str, fields: dict[str, Any]) -> None:
        data = dumps({"kind": kind, "ts": time.time(), "worker": self.worker, **fields})
        self.client.xadd(self.key, {"data": data}, maxlen=self.maxlen, approximate=True)


def shared_featurizer(config: ModelConfig, max_bytes: int | None,
                      featurizers: dict[tuple[str, Any], Any] | None) -> Any:
    """The featurizer of ``config``, one for every model of the same featurizer config
    in ``featurizers`` (a worker's: thousands of per-user models share their global
    model's; a featurizer holds no state of its model); a new one if None.

    >>> from streamnb_workers.store.model_config import ModelConfig
    >>> shared: dict = {}
    >>> a, b = (shared_featurizer(ModelConfig(n, "multinomial", {}, {"bits": 4}), None, shared)
    ...         for n in ("a", "b"))
    >>> a is b, len(shared)
    (True, 1)
    """
    if featurizers is None:
        return config.make_featurizer(max_bytes)
    key = (json.dumps(config.featurizer, sort_keys=True, default=str), max_bytes)
    if key not in featurizers:
        featurizers[key] = config.make_featurizer(max_bytes)
    return featurizers[key]


class Lazy:
    """A value made by ``make()`` at its first use (:meth:`get`) and let go of on demand
    (:meth:`drop`), made again at the next use.

    >>> made = []
    >>> v = Lazy(lambda: made.append(1) or len(made))
    >>> v.get(), v.get(), v.drop(), v.get()
    (1, 1, None, 2)
    """

    __slots__ = ("make", "value")

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make, self.value = make, None

    def get(self) -> Any:
        if self.value is None:
            self.value = self.make()
        return self.value

    def drop(self) -> None:
        self.value = None


class ModelRuntime:
    """Everything a worker keeps for one model (see the module docstring)."""

    def __init__(self, config: ModelConfig, client: Any, options: WorkerOptions,
                 metrics: Metrics, reader: Any = None, reads_ahead: bool = True,
                 replicas: ReplicaCache | None = None,
                 shared: dict[tuple[str, Any], Any] | None = None) -> None:
        o = options
        self.name = config.name
        self.keys = ModelKeys(config.name)
        self.config = config
        self.options = o
        self.consumer: str = o.consumer  # type: ignore[assignment]
        #: The command client, and the client of blocking reads.
        self.client = client
        self.reader = client if reader is None else reader
        #: ``shared``: what the worker's models share (a featurizer a featurizer config,
        #: the metric series pooled under ``model="*"``); None: nothing.
        self.featurizer = shared_featurizer(config, o.max_bytes, shared)
        self.rule = config.make_decision_rule()
        self.metrics = metrics
        #: The ``model`` label of its metrics ("*" when they are pooled over models).
        self.label = self.name if o.model_metrics else "*"
        if shared is None or o.model_metrics:
            self.series = MetricSeries(metrics, self.label, self.consumer)
        else:  # one for every model: the same children, thousands of models
            self.series = shared.setdefault(("series", "*"),
                                            MetricSeries(metrics, "*", self.consumer))
        self.events = EventSink(client, self.keys, self.consumer, o.events_maxlen)
        self.replica = Replica(client, self.keys, config)
        spec = stored_spec(client, self.keys, o.challenger)
        self.replica.challenger = None if spec is None or config.shards != 1 else \
            Challenger(config, spec, o.max_bytes)
        #: The sum of the model's shards when this is one of them (workers/replication/shards.py).
        self.summed: Any = None
        self.replica.on_corrupt = lambda kind, detail: self.series(
            metrics.corrupt_records, kind=kind).inc()
        self.snapshotter = Snapshotter(client, self.keys, self.consumer, o.lease_ms,
                                       o.snapshot_every, o.snapshot_interval_s, o.trim_margin_ms)
        #: The quality and drift observer (:attr:`observer`), made at its first use and let
        #: go of when the replica is evicted: its drift detectors start again at the
        #: model's next batch.
        self._observer = Lazy(lambda: ModelObserver(metrics, self.name, self.consumer,
                                                    events=self.events, label=self.label))
        self.inflight = InflightBoard(client, self.keys, self.consumer)
        self.timers = Timers.for_options(o, zlib.crc32(self.name.encode()) / 2**32)
        #: The token names counted for ``{M}:tokens`` (None: off, or dense input).
        self.token_names = TokenNames(o.token_names, o.token_names_every) \
            if o.token_names and self.featurizer.input == "sparse" else None
        # first published a period after the start: a name table of a few messages is
        # worth less than the tens of ms its publication costs a short run
        self.timers.names.restart(time.monotonic())
        #: Redo this consumer's pending entries before reading new ones (after a start,
        #: a reconnect or an error); ``isolate``: one at a time (after an unexpected error).
        self.pending_phase = True
        self.isolate = False
        #: The token of the entries moved from ``:train`` (workers/store/training.py), once
        #: a move ran; None while none has, and for a model stored with ``training: in``.
        self.train_token: str | None = None
        #: Where the next claim of idle entries starts.
        self.claim_cursor = "0-0"
        #: ``replica.applied`` when the observer last looked at the model.
        self.observed_applied = -1
        #: Another worker's fresh heartbeat was in ``:workers`` at the last heartbeat.
        self.peers = False
        #: Pipelined commits: the commit on the wire, and the next batch read meanwhile.
        self.wire = CommitWire(client, self.keys, self.consumer, o.out_maxlen, o.dead_maxlen)
        self.read_ahead: ReadBatch | None = None
        #: Whether a pipelined commit reads the model's next batch (not when the worker
        #: serves several models: workers/worker/intake.py ``in_stream_order``).
        self.reads_ahead = reads_ahead
        #: The worker's replicas held in memory, this one's among them (None: held for
        #: good, as a shard's): :meth:`use_replica`.
        self.replicas = replicas
        if replicas is not None:  # loaded if it fits; held with a commit or batch in hand
            replicas.add(self.name, self.replica,
                         lambda: self.wire.in_flight is not None or self.read_ahead is not None,
                         on_evict=self._observer.drop)

    #: The model's quality and drift observer (made now if it was not held).
    observer = property(lambda self: self._observer.get())

    @property
    def predictor(self) -> Any:
        """The model predictions are made with: the replica's, or the sum of the model's
        shards when this is one of them."""
        return self.replica.model if self.summed is None else self.summed.model

    def use_replica(self) -> bool:
        """Before a batch: the replica loaded again if it was evicted (whether it was),
        the others evicted to fit the worker's bound (workers/replication/replica_cache.py)."""
        if self.replicas is None:
            return False
        loaded = self.replicas.use(self.name)
        if loaded:
            self.version_metric()
        return loaded

    def stage(self, name: str, summed: bool = False) -> StageTimer:
        """A timer of the batch stage ``name`` (``with rt.stage("predict"):``; ``summed``:
        several ``with`` blocks, observed once by ``observe()``): observe/metrics.py."""
        return self.series.stage(name, summed)

    # ------------------------------------------------------------------ what happens
    def redo_pending(self) -> None:
        """Redo this consumer's pending entries before reading new ones (after a
        reconnect, an outage, or a batch read twice)."""
        self.pending_phase = True

    def isolate_next(self) -> None:
        """Redo the pending entries one at a time (after an unexpected error)."""
        self.pending_phase = self.isolate = True

    def pending_done(self) -> None:
        """No pending entry is left to redo."""
        self.pending_phase = self.isolate = False

    def sum_shards(self, total: Any, user: bool = False) -> None:
        """Predict with ``total``: the sum of the model's shards (this is one of them), or
        with ``user`` the global model's statistics plus this per-user model's
        (workers/replication/user_sum.py). A per-user model counts no token names: its
        featurizer is the global model's, whose ``{M}:tokens`` names the same buckets, and
        thousands of users' counts (up to 2 x ``token_names`` each) would outweigh their
        replicas."""
        self.summed = total
        if user:
            self.token_names = None

    def saw_peers(self, present: bool) -> None:
        """Whether the last heartbeat found another worker's fresh one."""
        self.peers = present

    def observe_model(self) -> bool:
        """Show the observer the model if it changed since it last looked; whether it
        did."""
        if self.replica.applied == self.observed_applied or self.replica.evicted:
            return False
        self.observed_applied = self.replica.applied
        self.observe(self.observer.observe_model, self.replica.model)
        return True

    def claim(self) -> list:
        """Up to a batch of entries idle longer than ``claim_idle_ms`` in any consumer,
        now this one's, from where the last claim ended (workers/worker/intake.py)."""
        o = self.options
        self.claim_cursor, entries = claim_idle(self.client, self.keys, self.consumer,
                                                o.claim_idle_ms, self.claim_cursor, o.batch)
        return entries

    # ------------------------------------------------------------------ batches ahead
    def take_read_ahead(self) -> ReadBatch | None:
        """The batch read ahead (None: none), no longer held."""
        batch, self.read_ahead = self.read_ahead, None
        return batch

    def reads_for_commit(self) -> list[list[Any]]:
        """The commands a pipelined commit carries behind its script.

        The next batch usually came with the previous commit's reply. Otherwise it is
        read now, in a round trip of its own (workers/worker/intake.py ``read_next``,
        announced in the same step). When the batch in hand is full, the one after it is
        read behind the script, in the same write (a ``MULTI`` of
        workers/store/scripts/read.lua, which announces it, and the read): its entries come
        with the commit's reply (:meth:`take_read_behind`), and no read waits on the way.
        Not with ordered predictions when other workers serve the model (:meth:`alone`):
        a batch read that early is committed later, and they would wait for it."""
        o = self.options
        if self.read_ahead is None and self.reads_ahead:
            with self.stage("read") as read:
                batch = read_next(self.reader, self.client, self.consumer, self.keys, o.batch,
                                  self.inflight if o.order_wait_ms > 0 else None)
                if batch is None:
                    read.cancel()
            self.read_ahead = batch
        if self.reads_ahead and self.read_ahead is not None and \
                len(self.read_ahead.entries) >= o.batch and (o.order_wait_ms == 0 or self.alone()):
            return read_commands(self.keys, self.consumer, o.batch, o.order_wait_ms > 0)
        return []

    def take_read_behind(self, reply: Any) -> None:
        """Hold the batch read behind a commit (``reply``: the reply of the read's last
        command) as the next one to process. A failed read reads nothing; with a batch
        already in hand (not on the worker's path) the one read is withdrawn and its
        entries, this consumer's pending ones, are redone."""
        try:
            batch = read_behind(reply, self.client,
                                self.inflight if self.options.order_wait_ms > 0 else None)
        except redis.RedisError as exc:
            log.warning("model %s: reading ahead failed: %s", self.name, exc)
            return
        if not batch.entries:
            self.withdraw(batch.announced)
        elif self.read_ahead is None:
            self.read_ahead = batch
        else:
            self.withdraw(batch.announced)
            self.redo_pending()

    def alone(self) -> bool:
        """No other worker serves the model, as far as this one can tell: no other
        heartbeat in ``:workers`` at its last heartbeat, and no other worker's batch in
        ``{M}:inflight`` seen for ``horizon_s`` (ordered predictions look there)."""
        return not self.peers and not self.inflight.saw_others()

    def set_clients(self, client: Any, reader: Any) -> None:
        """Use these clients from now on (after a reconnect)."""
        self.client, self.reader = client, reader
        for user in (self.replica, self.inflight, self.snapshotter, self.events, self.wire):
            user.client = client

    def tail(self, batches: set[str] | None = None, block_ms: int | None = None,
             first: list | None = None) -> int:
        """Apply the log entries after the replica's version; returns how many
        (``batches``, ``block_ms``, ``first``: see :meth:`Replica.catch_up`)."""
        before, rewinds = self.replica.applied, self.replica.rewinds
        with self.stage("apply") as apply:
            done = self.replica.catch_up(batches=batches, block_ms=block_ms, first=first)
            # (the wait for the log to grow is the ordering wait's, not the apply's)
            apply.add(-self.replica.waited_s)
            if not done:
                apply.cancel()
        if self.replicas is not None:  # (its own delta may be applied before: committing.py)
            self.replicas.measure(self.name, changed=False)
        if self.replica.rewinds > rewinds:
            self.series(self.metrics.log_rewinds).inc(self.replica.rewinds - rewinds)
        if done:
            self.series(self.metrics.deltas_applied).inc(self.replica.applied - before)
            self.version_metric()
        return done

    def version_metric(self) -> None:
        self.series(self.metrics.model_version).set(self.replica.version_time)

    def observe(self, hook: Callable[..., Any], *args: Any) -> None:
        """Call ``hook``, a method of :attr:`observer`; an error there is logged, never
        raised (observation must never stop learning)."""
        try:
            hook(*args)
        except Exception:  # noqa: BLE001 - observation must never stop learning
            log.exception("model %s: observer.%s failed", self.name, hook.__name__)

    def withdraw(self, field: str | None) -> None:
        """Withdraw this consumer's announcement ``field`` (None: nothing to withdraw)."""
        if field is None:
            return
        try:
            self.inflight.withdraw(field)
        except redis.RedisError as exc:  # it goes stale in 10 s; others wait at most that long
            log.warning("model %s: could not withdraw the in-flight announcement: %s", self.name, exc)
