"""What a worker keeps for one model it serves: its config and featurizer, its replica,
snapshotter, observer and ``{M}:inflight`` board, its timers, the commit on the wire and
the batch read ahead, and where its metrics and events go. It knows nothing of the worker
that holds it: the worker gives it what it needs.

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

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from streamnb.encoding import dumps
from streamnb_workers.observe.metrics import MetricLabels, Metrics
from streamnb_workers.observe.observer import ModelObserver
from streamnb_workers.observe.token_names import TokenNames
from streamnb_workers.replication.ordering import InflightBoard
from streamnb_workers.replication.replica import Replica
from streamnb_workers.replication.snapshotter import Snapshotter
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelConfig
from streamnb_workers.worker.housekeeping import Timers
from streamnb_workers.worker.intake import ReadBatch
from streamnb_workers.worker.options import WorkerOptions

if TYPE_CHECKING:
    from streamnb_workers.worker.commit_pipeline import InFlight

__all__ = ["EventSink", "ModelRuntime", "ReadBatch"]

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


class ModelRuntime:
    """Everything a worker keeps for one model (see the module docstring)."""

    def __init__(self, config: ModelConfig, client: Any, options: WorkerOptions,
                 metrics: Metrics, reader: Any = None) -> None:
        o = options
        self.name = config.name
        self.keys = ModelKeys(config.name)
        self.config = config
        self.options = o
        self.consumer: str = o.consumer  # type: ignore[assignment]
        #: The command client, and the client of blocking reads.
        self.client = client
        self.reader = client if reader is None else reader
        self.featurizer = config.make_featurizer(o.max_bytes)
        self.rule = config.make_decision_rule()
        self.metrics = metrics
        self.labels = MetricLabels(metrics, self.name, self.consumer)
        self.events = EventSink(client, self.keys, self.consumer, o.events_maxlen)
        self.replica = Replica(client, self.keys, config)
        #: The sum of the model's shards when this is one of them (workers/replication/shards.py).
        self.summed: Any = None
        self.replica.on_corrupt = lambda kind, detail: self.labels(
            metrics.corrupt_records, kind=kind).inc()
        self.snapshotter = Snapshotter(client, self.keys, self.consumer, o.lease_ms,
                                       o.snapshot_every, o.snapshot_interval_s, o.trim_margin_ms)
        self.observer = ModelObserver(metrics, self.name, self.consumer, events=self.events)
        self.inflight = InflightBoard(client, self.keys, self.consumer)
        self.timers = Timers.for_options(o)
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
        self.claim_cursor = "0-0"
        #: ``replica.applied`` when the observer last looked at the model.
        self.observed_applied = -1
        #: Another worker's fresh heartbeat was in ``:workers`` at the last heartbeat.
        self.peers = False
        #: The last commit settled applied its own delta (commit_pipeline.apply_own_delta).
        self.own_applied = False
        #: Pipelined commits: the commit on the wire, and the next batch read meanwhile.
        self.in_flight: InFlight | None = None
        self.read_ahead: ReadBatch | None = None
        #: Whether a pipelined commit reads the model's next batch (not when the worker
        #: serves several models: workers/worker/intake.py ``in_stream_order``).
        self.reads_ahead = True

    @property
    def predictor(self) -> Any:
        """The model predictions are made with: the replica's, or the sum of the model's
        shards when this is one of them."""
        return self.replica.model if self.summed is None else self.summed.model

    def alone(self) -> bool:
        """No other worker serves the model, as far as this one can tell: no other
        heartbeat in ``:workers`` at its last heartbeat, and no other worker's batch in
        ``{M}:inflight`` seen for ``horizon_s`` (ordered predictions look there)."""
        return not self.peers and not self.inflight.saw_others()

    def set_clients(self, client: Any, reader: Any) -> None:
        """Use these clients from now on (after a reconnect)."""
        self.client, self.reader = client, reader
        for user in (self.replica, self.inflight, self.snapshotter, self.events):
            user.client = client

    def tail(self, batches: set[str] | None = None, block_ms: int | None = None) -> int:
        """Apply the log entries after the replica's version; returns how many
        (``batches``, ``block_ms``: see :meth:`Replica.catch_up`)."""
        t0 = time.perf_counter()
        before, rewinds = self.replica.applied, self.replica.rewinds
        done = self.replica.catch_up(batches=batches, block_ms=block_ms)
        if self.replica.rewinds > rewinds:
            self.labels(self.metrics.log_rewinds).inc(self.replica.rewinds - rewinds)
        if done:
            self.labels(self.metrics.deltas_applied).inc(self.replica.applied - before)
            # (the wait for the log to grow is the ordering wait's, not the apply's)
            self.labels.stage("apply", time.perf_counter() - t0 - self.replica.waited_s)
            self.version_metric()
        return done

    def version_metric(self) -> None:
        self.labels(self.metrics.model_version).set(self.replica.version_time)

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
