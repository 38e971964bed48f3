"""The worker loop: read a batch, predict, learn, commit atomically, tail the log.

Public API (for ``streamnb worker``, the demo and tests)::

    from streamnb_workers.connection import RedisSettings, UrlConnector
    from streamnb_workers.model_config import ModelSpec
    from streamnb_workers.worker import Worker, WorkerOptions

    w = Worker(UrlConnector(RedisSettings("redis://localhost:6379/0")),
               [ModelSpec("mail", kind="multinomial")], WorkerOptions(batch=200))
    exit_code = w.run()          # blocks; SIGTERM/SIGINT once: finish the batch and exit 0
    w.request_stop()             # the same, from another thread
    w.run_until_idle()           # tests/demo: process until nothing is undelivered or pending

One iteration (:meth:`Worker.step`): housekeeping (heartbeat, lease, snapshot, claims of
idle entries) -> own pending entries first after a (re)start -> ``XREADGROUP ... >`` over
every model's ``:in`` -> per model: decode, featurize, predict each message with the model
plus the labelled messages before it in the batch (test-then-train, as one message at a
time would; ``WorkerOptions.prequential``), decide, build the delta of the labelled
messages and of the delayed labels, commit in one Lua script (:mod:`streamnb_workers.commit`) ->
tail ``:log`` (own delta included). See docs/worker.md.

>>> import fakeredis, msgpack
>>> from streamnb_workers.connection import ClientConnector
>>> from streamnb_workers.model_config import ModelSpec
>>> r = fakeredis.FakeRedis()
>>> w = Worker(ClientConnector(r), [ModelSpec("doc", kind="multinomial",
...            featurizer_config={"bits": 8})], WorkerOptions(consumer="w1"))
>>> for text, label in [("cheap meds", "spam"), ("meeting notes", "ham"), ("cheap pills", None)]:
...     _ = r.xadd("streamnb:{doc}:in", {"data": msgpack.packb({"text": text, "label": label})})
>>> w.run_until_idle()
>>> w.models["doc"].replica.learnt, r.xlen("streamnb:{doc}:out")
(2, 3)
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from streamnb.constants import (
    DATA_FIELD,
    DEFAULT_BATCH_SIZE,
    DEFAULT_LABEL_CACHE_TTL_S,
    DEFAULT_ORDER_WAIT_MS,
)
from streamnb.encoding import dumps
from streamnb.exceptions import MalformedMessage, NotFittedError, StreamnbError
from streamnb.features import Row, rows_to_bytes
from streamnb_workers.backoff import Backoff
from streamnb_workers.codec import (
    DEFAULT_LIMITS,
    InputMessage,
    Limits,
    decode_input,
    encode_dead,
    output_for,
)
from streamnb_workers.commit import (
    COMMIT_SCRIPT,
    READ_SCRIPT,
    CacheWrite,
    CommitRequest,
    CommitResult,
    SentCommit,
    commit_batch,
    read_commands,
    read_reply,
    send_commit,
)
from streamnb_workers.connection import Connector, is_access_error
from streamnb_workers.heap import HeapTrimmer
from streamnb_workers.keys import GROUP, ModelKeys
from streamnb_workers.label_cache import (
    batch_writes,
    encode_entry,
    encode_label,
    fetch_cached,
)
from streamnb_workers.labels import REF_EXPIRED, LabelRef, delayed_matrix, resolve_refs
from streamnb_workers.metrics import Metrics, default_metrics, observe_many
from streamnb_workers.model_config import ModelConfig, ModelSpec, ensure_config
from streamnb_workers.ordering import InflightBoard, wait_for_earlier
from streamnb_workers.replica import Replica, encode_decay, encode_delta, entry_time, parse_id
from streamnb_workers.replies import as_str, entry_field
from streamnb_workers.snapshotter import (
    Snapshotter,
    delete_consumer_if_idle,
    live_workers,
    remove_dead_consumers,
    stream_gauges,
)

log = logging.getLogger("streamnb.worker")

#: Redis reply prefixes of errors that pass (failover, loading, disk trouble).
TRANSIENT_PREFIXES = ("MISCONF", "READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
                      "NOREPLICAS", "BUSY ")


#: Young-generation threshold of the garbage collector in a worker process (CPython's
#: default is 700). A batch keeps a few thousand containers alive at once (decoded maps,
#: token lists, items), so with the default every batch ran collections that traversed
#: them (and promoted them, to be traversed again): ~15 us per message. They are freed by
#: reference counting at the end of the batch; cycles are still collected, less often.
GC_YOUNG_THRESHOLD = 20_000


def tune_gc() -> None:
    """For a worker process (called by its entry points, not by :class:`Worker`): move the
    objects made while starting out of the collector's way (``gc.freeze``) and raise the
    young-generation threshold to :data:`GC_YOUNG_THRESHOLD`.

    >>> import gc
    >>> before = gc.get_threshold()
    >>> tune_gc(); gc.get_threshold()[0] >= GC_YOUNG_THRESHOLD
    True
    >>> gc.set_threshold(*before); gc.unfreeze()
    """
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


def error_kind(exc: BaseException) -> str | None:
    """The metric kind of a transient Redis error, or None if it is not transient."""
    if isinstance(exc, redis.TimeoutError):
        return "timeout"
    if isinstance(exc, (redis.ConnectionError, redis.BusyLoadingError)):
        return "connection"
    if isinstance(exc, redis.ReadOnlyError):
        return "readonly"
    if isinstance(exc, redis.ResponseError):
        text = str(exc)
        if text.startswith("MISCONF"):
            return "misconf"
        if text.startswith(TRANSIENT_PREFIXES):
            return "other"
    if isinstance(exc, redis.exceptions.ClusterError):
        return "other"
    return None


@dataclass
class WorkerOptions:
    """Tuning of a worker (see docs/worker.md for guidance)."""

    #: Consumer name in the group; default ``<host>-<pid>``. Reuse it across restarts to
    #: re-read the same pending entries at once instead of after ``claim_idle_ms``.
    consumer: str | None = None
    batch: int = DEFAULT_BATCH_SIZE
    block_ms: int = 1000
    #: Entries pending longer than this in another consumer are claimed (XAUTOCLAIM).
    claim_idle_ms: int = 60_000
    #: A message delivered more than this many times goes to :dead (reason ``poison``).
    max_deliveries: int = 5
    out_maxlen: int = 1_000_000
    dead_maxlen: int = 100_000
    events_maxlen: int = 10_000
    #: Snapshot after this many applied log entries, or this many seconds.
    snapshot_every: int = 1000
    snapshot_interval_s: float = 60.0
    #: Log entries younger than this (before the snapshot id) are kept when trimming.
    trim_margin_ms: int = 60_000
    lease_ms: int = 15_000
    #: TTL of cached message features for delayed labels (0: no cache).
    cache_ttl_s: float = DEFAULT_LABEL_CACHE_TTL_S
    #: Cache the messages learnt in their batch too (a label in the message, or a ref in
    #: the same batch), so that a later label can correct them. False: only messages
    #: still unlabelled are cached (delayed labels keep working; a correction of a message
    #: learnt on arrival goes to :dead as ref_expired); most of the cache's Redis memory
    #: and of a commit's bytes when most traffic comes labelled.
    cache_labelled: bool = True
    heartbeat_s: float = 5.0
    #: A heartbeat older than this marks a dead worker.
    stale_s: float = 30.0
    observe_model_s: float = 5.0
    backoff_base_s: float = 0.05
    backoff_cap_s: float = 5.0
    max_commit_attempts: int = 8
    limits: Limits = DEFAULT_LIMITS
    #: Predict message i of a batch with the model plus the labelled messages before it in
    #: the batch (as one-at-a-time processing), for the models that do it cheaply (every
    #: kind but bernoulli and hybrid, whose exact method copies their 2**20-wide tables per
    #: batch); False: the whole batch with the model as it was before the batch. What is
    #: committed is the same either way.
    prequential: bool = True
    #: Before predicting, wait at most this long for other workers' labelled batches that
    #: start before this one to be committed, so predictions see the same labels as with
    #: one worker (0: predict at once). See workers/ordering.py.
    order_wait_ms: int = DEFAULT_ORDER_WAIT_MS
    #: While a full batch commits, read the next one and decode and featurize it (the
    #: commit script runs in Redis meanwhile; its reply is read before the next batch is
    #: predicted, so predictions and what is learnt are the same). False: one batch after
    #: the other. See docs/worker.md, "Pipelined commits".
    pipeline: bool = True
    #: Return freed heap memory to the system (glibc ``malloc_trim``) when the worker goes
    #: idle after work, and at most this often while it stays busy (0: only when idle).
    #: See workers/heap.py.
    release_memory_s: float = 60.0

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.block_ms < 0:
            raise ValueError(f"block_ms must be >= 0, got {self.block_ms}")
        if self.order_wait_ms < 0:
            raise ValueError(f"order_wait_ms must be >= 0, got {self.order_wait_ms}")
        if self.release_memory_s < 0:
            raise ValueError(f"release_memory_s must be >= 0, got {self.release_memory_s}")
        if self.max_deliveries < 1:
            raise ValueError(f"max_deliveries must be >= 1, got {self.max_deliveries}")
        if self.consumer is None:
            self.consumer = f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class Item:
    """A decoded, featurized message of the batch being processed."""

    entry_id: str
    msg: InputMessage
    row: Row
    data: bytes
    label: Any = None
    log_proba: dict[Any, float] = field(default_factory=dict)
    #: The model's log posteriors (before the decision rule), None if it could not predict.
    model_log_proba: np.ndarray | None = None
    #: ``row.to_bytes()`` for its cache entry, made before the wait for other workers.
    row_bytes: bytes | None = None


@dataclass
class Dead:
    entry_id: str
    reason: str
    detail: str
    data: bytes


@dataclass
class Predicted:
    """A batch's decided predictions, for the observer: the classes, the items predicted
    (those with a known class), their decision log posteriors and unsure flags, and their
    shares of features new to the model where the prediction found them (else None)."""

    classes: list[Any]
    items: list[Item]
    log_proba: np.ndarray
    unsure: np.ndarray
    oov_share: np.ndarray | None = None


@dataclass
class CommitWork:
    """One batch from its read to its commit: its ``:inflight`` announcement (withdrawn
    by whoever holds the batch last: the batch itself, its commit, or the settle of a
    pipelined commit), what the commit is built from (rebuilt after a conflict), the
    request and what it learns, and the call while it is on the wire."""

    #: The batch's ``:inflight`` announcement (None: not announced, or withdrawn).
    inflight: str | None = None
    items: list[Item] = field(default_factory=list)
    refs: list[LabelRef] = field(default_factory=list)
    dead: list[Dead] = field(default_factory=list)
    ref_data: dict[str, bytes] = field(default_factory=dict)
    #: The model version the predictions were made at (in every output).
    version: str = ""
    req: CommitRequest | None = None
    learn: list[tuple[Item, Any]] = field(default_factory=list)
    res: Any = None
    all_dead: list[Dead] = field(default_factory=list)
    add_rows: list[tuple[Row, Any, float]] = field(default_factory=list)
    sent: SentCommit | None = None
    #: The statistics of the batch's own labelled items, made before the wait for other
    #: workers when the batch holds no delayed labels: (their entry ids, statistics).
    own: tuple[list[str], Any] | None = None
    prepared_s: float = 0.0
    #: The batch's rows stacked and the model's prequential plan, made before the wait
    #: for other workers: (the items' entry ids, X, plan or None), and the seconds taken.
    prediction: tuple[list[str], Any, Any] | None = None
    prediction_s: float = 0.0
    #: The batch's entry ids in stream order (as read): the commit sends its ids in this
    #: order, so that the first and the last bound the script's ownership check.
    order: list[str] = field(default_factory=list)


class ModelRuntime:
    """Everything a worker keeps for one model name."""

    def __init__(self, worker: Worker, spec: ModelSpec, config: ModelConfig, client: Any) -> None:
        from streamnb_workers.observer import ModelObserver

        self.spec = spec
        self.name = spec.name
        self.keys = ModelKeys(spec.name)
        self.config = config
        self.featurizer = config.make_featurizer()
        self.rule = config.make_decision_rule()
        self.replica = Replica(client, self.keys, config)
        self.replica.on_corrupt = lambda kind, detail: worker.metrics.corrupt_records.labels(
            model=spec.name, worker=worker.options.consumer, kind=kind).inc()
        o = worker.options
        self.snapshotter = Snapshotter(client, self.keys, o.consumer, o.lease_ms, o.snapshot_every,
                                       o.snapshot_interval_s, o.trim_margin_ms)
        self.observer = ModelObserver(worker.metrics, spec.name, o.consumer, events=self.emit_event)
        self.inflight = InflightBoard(client, self.keys, o.consumer)
        self.worker = worker
        self.pending_phase = True
        #: Redo the pending entries one at a time (after an unexpected error).
        self.isolate = False
        self.claim_cursor = "0-0"
        self.next: dict[str, float] = {}
        self.observed_applied = -1
        #: Classes of the last batch prediction, in the column order of model_log_proba.
        self.predicted_classes: list[Any] = []
        #: Pipelined commits: the commit on the wire, and the next batch read meanwhile
        #: (its entries and its ``:inflight`` field).
        self.in_flight: CommitWork | None = None
        self.prefetched: tuple[list, str | None] | None = None
        #: Another worker's fresh heartbeat was in ``:workers`` at the last heartbeat.
        self.peers = False
        #: The last commit settled applied its own delta (Worker._apply_own_delta).
        self.own_applied = False

    def alone(self) -> bool:
        """No other worker serves the model, as far as this one can tell: no other
        heartbeat in ``:workers`` at its last heartbeat, and no other worker's batch in
        ``{M}:inflight`` seen for ``horizon_s`` (ordered predictions look there)."""
        return not self.peers and not self.inflight.saw_others()

    def emit_event(self, kind: str, fields: dict[str, Any]) -> None:
        data = dumps({"kind": kind, "ts": time.time(), "worker": self.worker.options.consumer,
                      **fields})
        self.worker.client.xadd(self.keys.events, {"data": data},
                                maxlen=self.worker.options.events_maxlen, approximate=True)

    def set_client(self, client: Any) -> None:
        self.replica.client = client
        self.inflight.client = client
        self.snapshotter.client = client


def ensure_group(client: Any, keys: ModelKeys) -> None:
    """Create the consumer group (and the stream) unless present; never clobber a non-stream."""
    t = client.type(keys.input)
    t = as_str(t)
    if t not in ("none", "stream"):
        raise StreamnbError(f"{keys.input} is a {t}, not a stream; refusing to touch it")
    try:
        client.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _first_id(entries: list) -> str:
    """The smallest entry id of a batch ("0-0" for none): where it starts in the stream."""
    return min((as_str(e[0]) for e in entries), key=parse_id) if entries else "0-0"


class Worker:
    """Serves one or more models from Redis streams (see the module docstring)."""

    def __init__(self, connector: Connector, specs: list[ModelSpec],
                 options: WorkerOptions | None = None, metrics: Metrics | None = None) -> None:
        if not specs:
            raise ValueError("a worker needs at least one model spec")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        self.connector = connector
        self.specs = list(specs)
        self.options = options or WorkerOptions()
        self.metrics = metrics or default_metrics()
        self.consumer: str = self.options.consumer  # type: ignore[assignment]
        self.models: dict[str, ModelRuntime] = {}
        self.client: Any = None
        self.reader: Any = None
        self._stop = threading.Event()
        self._signals = 0
        self.started = False
        self.backoff = Backoff(self.options.backoff_base_s, self.options.backoff_cap_s)
        self.heap = HeapTrimmer(self.options.release_memory_s)

    # ------------------------------------------------------------------ lifecycle
    def _mw(self, rt: ModelRuntime) -> dict[str, str]:
        return {"model": rt.name, "worker": self.consumer}

    def connect(self) -> None:
        self.client = self.connector.client()
        self.reader = self.connector.reader(self.options.block_ms)
        for rt in self.models.values():
            rt.set_client(self.client)

    def start(self) -> None:
        """Connect, create or verify each model's config and group, load the replicas."""
        if self.client is None:
            self.connect()
        check = getattr(self.connector, "check_access", None)
        if check is not None and not self.models:  # ACL/credentials: fail now, in one line
            check(self.client, [s.name for s in self.specs])
        if self.options.pipeline and not self.connector.cluster:
            for script in (COMMIT_SCRIPT, READ_SCRIPT):  # pipelined writes send EVALSHA only
                script.load(self.client)
        for spec in self.specs:
            if spec.name in self.models:
                continue
            cfg = ensure_config(self.client, spec)
            ensure_group(self.client, ModelKeys(spec.name))
            rt = ModelRuntime(self, spec, cfg, self.client)
            rt.replica.load()
            self.models[spec.name] = rt
            self._version_metric(rt)
            self.metrics.worker_up.labels(**self._mw(rt)).set(1)
            log.info("worker %s serves model %s (%s) at version %s", self.consumer, spec.name,
                     cfg.kind, rt.replica.version)
        self.started = True

    def request_stop(self) -> None:
        """Finish the current batch, commit it, and return from :meth:`run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("signal %d: finishing the current batch, then exiting (again: exit now)", signum)
            self.request_stop()
        else:
            log.warning("second signal %d: exiting now; uncommitted messages stay pending", signum)
            os._exit(1)

    def run(self, install_signals: bool = True) -> int:
        """Serve until stopped; returns the process exit code (0 after a warm shutdown)."""
        if install_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        while not self.stopping:
            try:
                if not self.started:
                    self.start()
                self.step(self.options.block_ms)
                self.backoff.reset()
            except Exception as exc:  # noqa: BLE001 - classified below
                if is_access_error(exc) and not self.started:
                    raise  # a refused password or command: retrying cannot help
                if error_kind(exc) is None:
                    if isinstance(exc, (StreamnbError, ValueError)) and not self.started:
                        raise
                    self._unexpected_error()
                    continue
                self._recover(exc)
        self._finish_pipeline()
        self.shutdown()
        return 0

    def _unexpected_error(self) -> None:
        """After an error that is not Redis being away (a bug, or a message the worker does
        not handle): log and count it, wait a second, then redo the pending entries one at a
        time (``isolate``). Redone as a batch, every entry of the batch would be delivered
        again at each failure and reach ``max_deliveries`` with the one that fails; one at
        a time, only that one does, and goes to ``:dead`` as poison."""
        log.exception("worker %s: unexpected error; the batch stays pending", self.consumer)
        for rt in self.models.values():
            self.metrics.worker_errors.labels(**self._mw(rt)).inc()
        self._stop.wait(1.0)
        for rt in self.models.values():
            try:
                self._settle(rt)
            except Exception:  # noqa: BLE001 - its batch stays pending
                log.exception("model %s: the commit on the wire failed", rt.name)
            self._abandon(rt)
            rt.pending_phase = rt.isolate = True

    def _finish_pipeline(self) -> None:
        """Warm shutdown: process the batch read ahead and read the last commit's reply."""
        for rt in self.models.values():
            try:
                while rt.prefetched:  # (settling a commit may bring the batch read behind it)
                    (entries, announced), rt.prefetched = rt.prefetched, None
                    self._process(rt, entries, None, announced)
                self._settle(rt)
            except Exception as exc:  # noqa: BLE001 - what is not committed stays pending
                log.warning("model %s: the last batches were not committed: %s", rt.name, exc)
                self._abandon(rt)

    def _recover(self, exc: BaseException) -> None:
        kind = error_kind(exc) or "other"
        for rt in self.models.values() or [None]:
            labels = {"model": rt.name if rt else "-", "worker": self.consumer}
            self.metrics.redis_errors.labels(**labels, kind=kind).inc()
            self.metrics.reconnects.labels(**labels).inc()
        for rt in self.models.values():
            self._abandon(rt, withdraw=False)  # Redis is away; announcements go stale
        delay = self.backoff.next_delay()
        log.warning("redis %s error at %s: %s; reconnecting in %.2fs (attempt %d)", kind,
                    self.connector.describe(), exc, delay, self.backoff.attempts)
        self._stop.wait(delay)
        for c in {id(self.client): self.client, id(self.reader): self.reader}.values():
            try:
                if c is not None and hasattr(c, "connection_pool"):
                    c.connection_pool.disconnect()
            except Exception:  # noqa: BLE001, S110 - best effort
                pass
        try:
            self.connect()
        except Exception as e2:  # noqa: BLE001 - retried on the next attempt
            log.warning("reconnect failed: %s", e2)
        for rt in self.models.values():
            rt.pending_phase = True  # uncommitted work is redone from our pending entries

    def shutdown(self) -> None:
        """Leave cleanly: final snapshot if lease holder, release lease, drop heartbeat,
        delete this consumer from the group if it has nothing pending."""
        for rt in self.models.values():
            mw = self._mw(rt)
            self.metrics.worker_up.labels(**mw).set(0)
            try:
                rt.replica.catch_up()
                if rt.snapshotter.holder:
                    rt.snapshotter.maybe_write(rt.replica, final=True)
                    rt.snapshotter.release()
                self.client.hdel(rt.keys.workers, self.consumer)
                delete_consumer_if_idle(self.client, rt.keys, self.consumer)
            except Exception as exc:  # noqa: BLE001 - Redis may be gone; nothing is lost
                log.warning("model %s: clean shutdown incomplete: %s", rt.name, exc)
        log.info("worker %s stopped", self.consumer)

    # ------------------------------------------------------------------ iteration
    def step(self, block_ms: int | None = None) -> int:
        """One iteration of the loop; returns the number of entries handled."""
        if not self.started:
            self.start()
        block_ms = self.options.block_ms if block_ms is None else block_ms
        n = 0
        for rt in self.models.values():
            self._housekeeping(rt)
            n += self._claim(rt)
            if rt.pending_phase:
                n += self._drain_pending(rt)
        # batches read while the previous commit ran (pipelined), then the other models'
        batches = [(rt, *rt.prefetched) for rt in self.models.values() if rt.prefetched]
        rest = [rt for rt in self.models.values() if not rt.prefetched]
        for rt, _, _ in batches:
            rt.prefetched = None
        if not self.stopping:
            if rest:
                block = 0 if batches or n else block_ms
                batches += [(rt, entries, None) for rt, entries in self._read(block, rest)]
        for rt, entries, announced in batches:
            n += self._process(rt, entries, None, announced, pipeline=True)
        for rt in self.models.values():
            if rt.prefetched is None:  # else the commit runs on while the next batch decodes
                self._settle(rt)
                self._tail(rt)
        self.heap.after_step(n)
        return n

    def run_until_idle(self, timeout: float = 60.0, block_ms: int = 20) -> None:
        """Process until no model has undelivered or pending entries, then catch up."""
        deadline = time.monotonic() + timeout
        while True:
            n = self.step(block_ms)
            if n == 0 and self._idle():
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.consumer} not idle after {timeout}s")
        for rt in self.models.values():
            self._tail(rt)

    def _idle(self) -> bool:
        """Every entry delivered, then none pending, read in that order: a batch read
        between the two reads shows as pending (the other order could miss it)."""
        for rt in self.models.values():
            last = self.client.xrevrange(rt.keys.input, count=1)
            groups = self.client.xinfo_groups(rt.keys.input)
            g = next(g for g in groups if as_str(g["name"]) == GROUP)
            if last and parse_id(last[0][0]) > parse_id(g["last-delivered-id"]):
                return False
            if int(self.client.xpending(rt.keys.input, GROUP)["pending"]) > 0:
                return False
        return True

    def _read(self, block_ms: int, rts: list[ModelRuntime] | None = None,
              ) -> list[tuple[ModelRuntime, list]]:
        rts = list(self.models.values()) if rts is None else rts
        block = block_ms if block_ms > 0 else None
        t0 = time.perf_counter()
        if self.connector.cluster and len(rts) > 1:  # streams of several slots: one call each
            per = max(1, block_ms // len(rts)) if block else None
            replies = []
            for rt in rts:
                replies += self.reader.xreadgroup(GROUP, self.consumer, {rt.keys.input: ">"},
                                                  count=self.options.batch, block=per) or []
        else:
            replies = self.reader.xreadgroup(
                GROUP, self.consumer, {rt.keys.input: ">" for rt in rts},
                count=self.options.batch, block=block) or []
        dt = time.perf_counter() - t0
        by_key = {rt.keys.input: rt for rt in rts}
        out = []
        for stream, entries in replies:
            rt = by_key[as_str(stream)]
            if entries:
                self.metrics.stage_seconds.labels(**self._mw(rt), stage="read").observe(dt)
                out.append((rt, entries))
        return out

    def _deliveries(self, rt: ModelRuntime, entries: list) -> dict[str, int]:
        if not entries:
            return {}
        ids = [as_str(e[0]) for e in entries]
        rows = self.client.xpending_range(rt.keys.input, GROUP, min=min(ids, key=parse_id),
                                          max=max(ids, key=parse_id), count=len(ids) * 2 + 10,
                                          consumername=self.consumer)
        return {as_str(r["message_id"]): int(r["times_delivered"]) for r in rows}

    def _drain_pending(self, rt: ModelRuntime) -> int:
        """Redo a batch of this consumer's pending entries (one entry after an unexpected
        error: :meth:`_unexpected_error`); the pending phase ends when none is left."""
        reply = self.client.xreadgroup(GROUP, self.consumer, {rt.keys.input: "0"},
                                       count=1 if rt.isolate else self.options.batch)
        entries = reply[0][1] if reply else []
        if not entries:
            rt.pending_phase = rt.isolate = False
            return 0
        log.info("model %s: re-processing %d pending entries", rt.name, len(entries))
        return self._process(rt, entries, self._deliveries(rt, entries))

    def _claim(self, rt: ModelRuntime) -> int:
        now = time.monotonic()
        if now < rt.next.get("claim", 0.0):
            return 0
        rt.next["claim"] = now + max(0.05, self.options.claim_idle_ms / 2000.0)
        reply = self.client.xautoclaim(rt.keys.input, GROUP, self.consumer,
                                       min_idle_time=self.options.claim_idle_ms,
                                       start_id=rt.claim_cursor, count=self.options.batch)
        rt.claim_cursor = as_str(reply[0])
        entries = [e for e in reply[1] if e and e[1] is not None]
        if entries:
            # Claimed entries are handled at once; if the cursor went on, claim again soon.
            if rt.claim_cursor != "0-0":
                rt.next["claim"] = 0.0
            self.metrics.messages_claimed.labels(**self._mw(rt)).inc(len(entries))
            log.info("model %s: claimed %d idle entries", rt.name, len(entries))
            return self._process(rt, entries, self._deliveries(rt, entries))
        return 0

    def _tail(self, rt: ModelRuntime, batches: set[str] | None = None,
              block_ms: int | None = None) -> int:
        """Apply the log entries after the replica's version; returns how many
        (``batches``, ``block_ms``: see :meth:`Replica.catch_up`)."""
        t0 = time.perf_counter()
        before = rt.replica.applied
        done = rt.replica.catch_up(batches=batches, block_ms=block_ms)
        if done:
            n = rt.replica.applied - before
            self.metrics.deltas_applied.labels(**self._mw(rt)).inc(n)
            self.metrics.stage_seconds.labels(**self._mw(rt), stage="apply").observe(
                time.perf_counter() - t0 - rt.replica.waited_s)  # the wait is order_wait's
            self._version_metric(rt)
        return done

    def _version_metric(self, rt: ModelRuntime) -> None:
        self.metrics.model_version.labels(**self._mw(rt)).set(rt.replica.version_time)

    def _housekeeping(self, rt: ModelRuntime) -> None:
        now = time.monotonic()
        o = self.options
        nxt = rt.next
        if now >= nxt.get("heartbeat", 0.0):
            nxt["heartbeat"] = now + o.heartbeat_s
            hb = dumps({"ts": time.time(), "pid": os.getpid(), "host": socket.gethostname(),
                        "version": rt.replica.version, "models": list(self.models)})
            self.client.hset(rt.keys.workers, self.consumer, hb)
            rt.peers = bool(live_workers(self.client, rt.keys, o.stale_s).keys() - {self.consumer})
            self.metrics.heartbeat.labels(**self._mw(rt)).set(time.time())
        if now >= nxt.get("lease", 0.0):
            nxt["lease"] = now + o.lease_ms / 3000.0
            rt.snapshotter.hold_lease()
        if rt.snapshotter.holder:
            if rt.snapshotter.maybe_write(rt.replica):
                self.metrics.snapshots_written.labels(**self._mw(rt)).inc()
            if now >= nxt.get("gauges", 0.0):
                nxt["gauges"] = now + 5.0
                self._gauges(rt)
            if now >= nxt.get("cleanup", 0.0):
                nxt["cleanup"] = now + o.stale_s
                removed = remove_dead_consumers(self.client, rt.keys, o.stale_s, self.consumer)
                if removed:
                    log.info("model %s: removed dead consumers %s", rt.name, removed)
        if now >= nxt.get("observe", 0.0) and rt.replica.applied != rt.observed_applied:
            nxt["observe"] = now + o.observe_model_s
            rt.observed_applied = rt.replica.applied
            self._observe(rt, "observe_model", rt.replica.model)

    def _gauges(self, rt: ModelRuntime) -> None:
        from streamnb_workers.replica import snapshot_age

        g = stream_gauges(self.client, rt.keys)
        m = self.metrics
        for stream in ("in", "out", "dead", "log"):
            m.stream_length.labels(model=rt.name, stream=stream).set(g[stream])
        m.group_lag.labels(model=rt.name).set(g["lag"])
        m.group_pending.labels(model=rt.name).set(g["pending"])
        age = snapshot_age(self.client, rt.keys)
        if age is not None:
            m.snapshot_age.labels(model=rt.name).set(age)
        m.live_workers.labels(model=rt.name).set(
            len(live_workers(self.client, rt.keys, self.options.stale_s)))

    def _observe(self, rt: ModelRuntime, hook: str, *args: Any) -> None:
        try:
            getattr(rt.observer, hook)(*args)
        except Exception:  # noqa: BLE001 - observation must never stop learning
            log.exception("model %s: observer.%s failed", rt.name, hook)

    # ------------------------------------------------------------------ one batch
    def _process(self, rt: ModelRuntime, entries: list, deliveries: dict[str, int] | None,
                 announced: str | None = None, pipeline: bool = False) -> int:
        """Decode, featurize, predict, learn and commit one batch of entries of ``rt``.

        ``announced``: the batch's ``:inflight`` field if it was announced when read.
        ``pipeline``: the commit may be sent without waiting for its reply, the next batch
        read meanwhile (:meth:`_send_and_prefetch`).
        """
        first_id = _first_id(entries)
        work = CommitWork(announced)
        if announced is None and self.options.order_wait_ms > 0 and entries:
            # announced at once (it may hold labels), so a worker that read the next batch
            # can never look before this one is announced; see workers/ordering.py
            work.inflight = rt.inflight.announce(first_id, len(entries))
        try:
            return self._decode_batch(rt, entries, deliveries, first_id, work, pipeline)
        finally:
            if work.sent is None:  # else the settle of the commit on the wire withdraws it
                self._withdraw(rt, work.inflight)
                work.inflight = None

    def _decode_batch(self, rt: ModelRuntime, entries: list, deliveries: dict[str, int] | None,
                      first_id: str, work: CommitWork, pipeline: bool) -> int:
        mw = self._mw(rt)
        m = self.metrics
        o = self.options
        m.messages_read.labels(**mw).inc(len(entries))
        m.batch_size.labels(**mw).observe(len(entries))
        now = time.time()

        # ---- decode and featurize
        t0 = time.perf_counter()
        dead: list[Dead] = []
        dense_dim = rt.featurizer.dim if rt.featurizer.input == "dense" else None
        msgs: list[tuple[str, InputMessage, bytes]] = []
        order = work.order
        for entry_id, fields in entries:
            eid = as_str(entry_id)
            order.append(eid)
            data = entry_field(fields, DATA_FIELD)
            n_deliv = (deliveries or {}).get(eid, 1)
            if n_deliv > o.max_deliveries:
                dead.append(Dead(eid, "poison", f"delivered {n_deliv} times, the limit is "
                                 f"{o.max_deliveries}", data or b""))
                continue
            if data is None:
                dead.append(Dead(eid, "no_data", "the entry has no 'data' field", b""))
                continue
            try:
                msg = decode_input(data, eid, o.limits, expected_dim=dense_dim)
            except MalformedMessage as exc:
                dead.append(Dead(eid, exc.reason, exc.detail, data))
                continue
            if msg.unknown_keys:
                m.unknown_keys.labels(**mw).inc(msg.unknown_keys)
            msgs.append((eid, msg, data))
        t1 = time.perf_counter()
        m.stage_seconds.labels(**mw, stage="decode").observe(t1 - t0)
        if not any(msg.label is not None for _, msg, _ in msgs):
            self._withdraw(rt, work.inflight)  # it learns nothing: nobody needs to wait for it
            work.inflight = None
        work.dead = dead
        return self._finish_batch(rt, entries, msgs, first_id, now, t1, work, pipeline)

    def _finish_batch(self, rt: ModelRuntime, entries: list,
                      msgs: list[tuple[str, InputMessage, bytes]], first_id: str, now: float,
                      t1: float, work: CommitWork, pipeline: bool) -> int:
        """Featurize, wait for earlier labelled batches, predict, learn and commit."""
        mw = self._mw(rt)
        m = self.metrics
        o = self.options
        items: list[Item] = []
        refs: list[LabelRef] = []
        ref_data: dict[str, bytes] = {}
        dead = work.dead
        payload_msgs = []
        for eid, msg, data in msgs:
            if msg.payload_kind is None:
                refs.append(LabelRef(eid, msg.ref, msg.label, msg.ts or entry_time(eid)))
                ref_data[eid] = data
            else:
                payload_msgs.append((eid, msg, data))
        rows = rt.featurizer.featurize_batch([msg.as_payload() for _, msg, _ in payload_msgs])
        for (eid, msg, data), row in zip(payload_msgs, rows, strict=True):
            if isinstance(row, MalformedMessage):
                dead.append(Dead(eid, row.reason, row.detail, data))
            else:
                items.append(Item(eid, msg, row, data))
        t2 = time.perf_counter()
        m.stage_seconds.labels(**mw, stage="featurize").observe(t2 - t1)
        if items:  # what neither depends on other workers' batches: before the wait
            X = self._prepare_prediction(rt, work, items)
            self._prepare_commit(rt, work, items, refs, X)

        # ---- the previous batch's commit (pipelined) lands before anything reads the model
        rt.own_applied = False
        settled = self._settle(rt)
        # ---- ordered predictions: other workers' earlier labelled batches first, then
        # catch up with the log (batches committed while this one was read and featurized);
        # a worker alone that applied its own delta at the commit (no entry came between)
        # has nothing to catch up with
        current = bool(items) and o.order_wait_ms > 0 and self._await_earlier(rt, first_id)
        current = current or (rt.own_applied and rt.alone())
        if not current and (settled or (items and (o.order_wait_ms > 0 or o.prequential))):
            self._tail(rt)
        t2 = time.perf_counter()
        # after the log tail: it may have brought the model's first classes
        items, refs = self._drop_foreign_labels(rt, msgs, items, refs, dead, ref_data)

        # ---- predict before learning (test-then-train; prequential within the batch)
        predicted = self._predict(rt, items, work.prediction) if items else None
        t3 = time.perf_counter()
        m.stage_seconds.labels(**mw, stage="predict").observe(t3 - t2 + work.prediction_s)

        # ---- learn and commit; rebuilt if ids were lost or cache entries changed
        work.items, work.refs, work.ref_data, work.version = items, refs, ref_data, rt.replica.version
        if self._build_commit(rt, work):
            if pipeline and self._may_pipeline(rt, len(entries)):
                t4 = time.perf_counter()
                self._send_and_prefetch(rt, work)
                m.stage_seconds.labels(**mw, stage="send").observe(time.perf_counter() - t4)
            else:
                self._commit_attempts(rt, work, None)
        if predicted is not None:
            t5 = time.perf_counter()
            self._observe_predictions(rt, predicted, now)
            m.stage_seconds.labels(**mw, stage="observe").observe(time.perf_counter() - t5)
        return len(entries)

    # ------------------------------------------------------------------ the commit
    def _prepare_commit(self, rt: ModelRuntime, w: CommitWork, items: list[Item],
                        refs: list[LabelRef], X: Any) -> None:
        """What the commit needs that no other worker's batch changes: the cache rows and,
        without delayed labels, the batch's statistics (from ``X``, the items' rows
        stacked). Made before the wait for earlier batches of other workers, it is off the
        path from one worker's commit to the next's; :meth:`_build_commit` uses it only
        where it still applies."""
        o = self.options
        t0 = time.perf_counter()
        if o.cache_ttl_s > 0:
            cached = [it for it in items if o.cache_labelled or it.msg.label is None]
            for it, data in zip(cached, rows_to_bytes([it.row for it in cached]), strict=True):
                it.row_bytes = data
        if not refs:
            w.own = self._own_stats(rt, items, X)
        w.prepared_s = time.perf_counter() - t0  # counted in the "learn" stage of the build

    @staticmethod
    def _own_stats(rt: ModelRuntime, items: list[Item], X: Any) -> tuple[list[str], Any] | None:
        """The entry ids of the batch's labelled items and their statistics; None when
        they cannot be made yet (e.g. a label of another type: dropped later, then made
        again by :meth:`_build_commit`)."""
        labelled = [i for i, it in enumerate(items) if it.msg.label is not None]
        stats = None
        if labelled:
            try:
                stats = rt.replica.model.batch_stats(
                    X if len(labelled) == len(items) else X[labelled],
                    [items[i].msg.label for i in labelled],
                    np.array([items[i].msg.weight for i in labelled], dtype=np.float64))
            except ValueError:
                return None
        return [items[i].entry_id for i in labelled], stats

    def _prepare_prediction(self, rt: ModelRuntime, w: CommitWork, items: list[Item]) -> Any:
        """The batch's rows stacked (returned) and the part of the prequential prediction
        that depends on the batch alone (the model's ``prequential_plan``: for
        MultinomialNB the validated rows and, without its C loop, the sort of the nonzeros
        and the in-batch prefix sums), made before
        the wait for other workers' batches, off the path from one worker's commit to the
        next's."""
        t0 = time.perf_counter()
        X = rt.featurizer.stack([it.row for it in items])
        plan = None
        model = rt.replica.model
        if self.options.prequential and model.cheap_prequential:
            try:
                plan = model.prequential_plan(
                    X, [it.msg.label for it in items],
                    np.array([it.msg.weight for it in items], dtype=np.float64))
            except ValueError:  # e.g. a label of another type: dropped, then predicted anew
                plan = None
        w.prediction = ([it.entry_id for it in items], X, plan)
        w.prediction_s = time.perf_counter() - t0
        return X

    def _build_commit(self, rt: ModelRuntime, w: CommitWork) -> bool:
        """Resolve the delayed labels and build ``w.req``; False if there is nothing to
        commit (every entry was lost)."""
        o = self.options
        tl = time.perf_counter()
        items, refs = w.items, w.refs
        batch_labels = {it.msg.id: it.msg.label for it in items}
        batch_preds = {it.msg.id: (it.log_proba, it.msg.ts or entry_time(it.entry_id))
                       for it in items}
        outside = [r.ref for r in refs if r.ref not in batch_labels]
        cached = fetch_cached(self.client, rt.keys, outside, int(time.time() * 1000)) \
            if o.cache_ttl_s > 0 else {}
        # a cached row that does not fit this model (tampered, other config): as expired
        cached = {k: c if c is None or rt.featurizer.fits(c.row) else None
                  for k, c in cached.items()}
        res = resolve_refs(refs, batch_labels, batch_preds, cached)
        learn = [(it, res.in_batch.get(it.msg.id, it.msg.label)) for it in items]
        add_rows = [(it.row, lab, it.msg.weight) for it, lab in learn if lab is not None]
        n_learnt = len(add_rows) + res.n_learnt
        add_rows += res.adds
        if w.own is not None and not res.adds and \
                w.own[0] == [it.entry_id for it, lab in learn if lab is not None]:
            add = w.own[1]  # made before the wait (_prepare_commit): the same rows
        else:
            add = self._stats(rt, add_rows)
        sub = self._stats(rt, res.subs)
        batch_id = uuid.uuid4().hex[:16]
        log_data = encode_delta(add, sub, n_learnt, self.consumer, batch_id) \
            if (add is not None or sub is not None) else None
        outputs = [output_for(it.msg, it.label, it.log_proba, w.version, self.consumer,
                              learned=lab is not None) for it, lab in learn]
        why = "never seen, or its cache entry expired" + (
            "" if o.cache_labelled else "; messages learnt on arrival are not cached: --no-cache-labelled")
        all_dead = w.dead + [Dead(r.entry_id, REF_EXPIRED, f"no cached message with id {r.ref!r} "
                                  f"({why})", w.ref_data[r.entry_id])
                             for r in res.expired]
        all_dead.sort(key=lambda d: parse_id(d.entry_id))
        cache_writes: list[CacheWrite] = []
        registry = None
        if o.cache_ttl_s > 0:
            entries = [(it.msg.id, encode_entry(
                encode_label(lab), it.row.to_bytes() if it.row_bytes is None else it.row_bytes,
                it.label, it.log_proba, it.msg.weight, batch_preds[it.msg.id][1]))
                for it, lab in learn if lab is None or o.cache_labelled]
            if entries:
                cache_writes, registry = batch_writes(
                    rt.keys, int(o.cache_ttl_s * 1000), int(time.time() * 1000), entries)
        ids = [it.entry_id for it in items] + [d.entry_id for d in w.dead] + \
            [r.entry_id for r in refs]
        if not ids:
            return False
        in_commit = set(ids)
        in_order = [eid for eid in w.order if eid in in_commit]
        if len(in_order) == len(ids):  # (else as they are: the script checks any order)
            ids = in_order
        w.req = CommitRequest(
            ids=ids, outputs=outputs,
            dead=[encode_dead(d.entry_id, d.reason, d.detail, d.data) for d in all_dead],
            log_data=log_data, n_learnt=n_learnt, cache_writes=cache_writes,
            cache_cas=res.cas, cache_registry=registry,
            decay_every=rt.config.decay_every,
            decay_data=encode_decay(rt.config.decay_factor) if rt.config.decay_every else b"",
            inflight_key=rt.keys.inflight if w.inflight else None, inflight_field=w.inflight)
        w.learn, w.res, w.all_dead, w.add_rows = learn, res, all_dead, add_rows
        self.metrics.stage_seconds.labels(**self._mw(rt), stage="learn").observe(
            time.perf_counter() - tl + w.prepared_s)
        w.prepared_s = 0.0
        return True

    def _commit_attempts(self, rt: ModelRuntime, w: CommitWork, result: CommitResult | None) -> None:
        """Commit ``w`` (already built; ``result``: the reply of a first attempt already
        sent), rebuilding it after lost ids or changed cache entries."""
        o = self.options
        for attempt in range(o.max_commit_attempts):
            if attempt and not self._build_commit(rt, w):
                return
            if result is None:
                tc = time.perf_counter()
                result = commit_batch(self.client, rt.keys, self.consumer, w.req, o.out_maxlen,
                                      o.dead_maxlen)
                self.metrics.stage_seconds.labels(**self._mw(rt), stage="commit").observe(
                    time.perf_counter() - tc)
            if self._after_commit(rt, w, result):
                return
            result = None
        raise StreamnbError(f"model {rt.name}: commit failed {o.max_commit_attempts} times; "
                            "the batch stays pending")

    def _after_commit(self, rt: ModelRuntime, w: CommitWork, result: CommitResult) -> bool:
        """Account for a committed batch (True), or drop its lost ids for the next attempt."""
        if result.ok:
            if w.req.inflight_key:
                rt.inflight.withdrawn_by_commit(w.inflight)
                w.inflight = None
            self._apply_own_delta(rt, w, result)
            # the log (our delta included) is applied by the next tail
            self._committed(rt, w.learn, w.res, w.all_dead, w.add_rows, len(w.req.outputs))
            return True
        self.metrics.commit_conflicts.labels(**self._mw(rt)).inc()
        if result.lost:
            lost = set(result.lost)
            log.info("model %s: %d entries were claimed by another worker; committing the rest",
                     rt.name, len(lost))
            w.items = [it for it in w.items if it.entry_id not in lost]
            w.dead = [d for d in w.dead if d.entry_id not in lost]
            w.refs = [r for r in w.refs if r.entry_id not in lost]
        # conflicts: cache entries changed under us; re-read them and rebuild
        return False

    def _apply_own_delta(self, rt: ModelRuntime, w: CommitWork, result: CommitResult) -> None:
        """Apply the commit's delta from the bytes sent, when the log held nothing after
        the replica's version (:meth:`Replica.apply_own`): no read of it back, and for a
        worker alone no tail before the next prediction (``rt.own_applied``)."""
        data = w.req.log_data if w.req is not None else None
        if not data or not result.delta_id or result.delta_id != result.log_id:
            return  # nothing logged, or decay entries after the delta: the tail applies them
        t0 = time.perf_counter()
        if rt.replica.apply_own(result.delta_id, data, result.prev_id):
            rt.own_applied = True
            mw = self._mw(rt)
            self.metrics.deltas_applied.labels(**mw).inc()
            self.metrics.stage_seconds.labels(**mw, stage="apply").observe(time.perf_counter() - t0)
            self._version_metric(rt)

    def _may_pipeline(self, rt: ModelRuntime, n_entries: int) -> bool:
        """Send this commit without waiting? Only for a full batch (more is likely waiting;
        a partial one is the tail of a backlog or live traffic, where the reply is read at
        once), on one Redis server (not Cluster), and not when stopping."""
        o = self.options
        return (o.pipeline and n_entries >= o.batch and not self.stopping
                and not self.connector.cluster)

    def _send_and_prefetch(self, rt: ModelRuntime, w: CommitWork) -> None:
        """Send this batch's commit without waiting, with the next batch in hand: Redis
        runs the script while the next batch is decoded and featurized.

        The next batch usually came with the previous commit's reply (below). Otherwise it
        is read first, in a round trip of its own: behind the script the read would wait
        for it (Redis answers the commands of one write together); its announcement goes
        in the commit's write, ahead of the script. When the batch in hand is full, the
        one after it is read behind the script, in the same write (a ``MULTI`` of
        workers/read.lua, which announces it, and the read: one step): its entries come with the commit's reply,
        and no read waits on the way (:meth:`_take_read_ahead`). Not with ordered
        predictions when other workers serve the model (:meth:`ModelRuntime.alone`): a
        batch read that early is committed later, and they would wait for it."""
        o = self.options
        before: list[list[Any]] = []
        if rt.prefetched is None:
            t0 = time.perf_counter()
            reply = self.reader.xreadgroup(GROUP, self.consumer, {rt.keys.input: ">"},
                                           count=o.batch) or []
            entries = [e for _, es in reply for e in es]
            if entries:
                self.metrics.stage_seconds.labels(**self._mw(rt), stage="read").observe(
                    time.perf_counter() - t0)
                announced = None
                if o.order_wait_ms > 0:
                    announced, command = rt.inflight.announcement(_first_id(entries), len(entries))
                    before.append(command)
                rt.prefetched = (entries, announced)
        after = []
        if rt.prefetched is not None and len(rt.prefetched[0]) >= o.batch and \
                (o.order_wait_ms == 0 or rt.alone()):
            after += read_commands(rt.keys, self.consumer, o.batch, o.order_wait_ms > 0)
        w.sent = send_commit(self.client, rt.keys, self.consumer, w.req, o.out_maxlen,
                             o.dead_maxlen, before, after)
        rt.in_flight = w

    def _take_read_ahead(self, rt: ModelRuntime, reply: Any) -> None:
        """The batch read behind a commit (:meth:`_send_and_prefetch`; ``reply``: the
        reply of the read's last command): the next one to process. A failed read reads
        nothing; a batch read whose announcement failed is announced now."""
        try:
            field, entries = read_reply(reply, announced=self.options.order_wait_ms > 0)
        except redis.RedisError as exc:
            log.warning("model %s: reading ahead failed: %s", rt.name, exc)
            return
        if field is None and entries and self.options.order_wait_ms > 0:
            # the announcing script failed (not loaded: e.g. Redis restarted): in a round
            # trip of its own, and the script loaded for the next time
            field = rt.inflight.announce(_first_id(entries), len(entries))
            READ_SCRIPT.load(self.client)
        if field is not None:
            rt.inflight.fields.add(field)
        if not entries:
            self._withdraw(rt, field)
        elif rt.prefetched is None:
            rt.prefetched = (entries, field)
        else:  # (not on the worker's path) its entries are this consumer's pending ones
            self._withdraw(rt, field)
            rt.pending_phase = True

    def _settle(self, rt: ModelRuntime) -> bool:
        """Read the reply of the commit on the wire, if any (retrying it if it failed)."""
        w = rt.in_flight
        if w is None:
            return False
        rt.in_flight = None
        tc = time.perf_counter()
        try:
            result = w.sent.result()  # type: ignore[union-attr]
            self.metrics.stage_seconds.labels(**self._mw(rt), stage="commit").observe(
                time.perf_counter() - tc)
            if w.sent.after:  # type: ignore[union-attr]  # the read behind the commit
                self._take_read_ahead(rt, w.sent.after[-1])  # type: ignore[union-attr]
            self._commit_attempts(rt, w, result)
        finally:
            self._withdraw(rt, w.inflight)
        return True

    def _abandon(self, rt: ModelRuntime, withdraw: bool = True) -> None:
        """After an error: forget the commit on the wire and the batch read ahead. Their
        entries are this consumer's pending ones, redone from there (``pending_phase``);
        ``withdraw``: delete this consumer's announcements (else they go stale in 10 s)."""
        w, rt.in_flight, rt.prefetched = rt.in_flight, None, None
        if w is not None and w.sent is not None:
            w.sent.abandon()
        try:
            rt.inflight.forget(delete=withdraw)
        except redis.RedisError as exc:
            log.warning("model %s: could not withdraw in-flight announcements: %s", rt.name, exc)

    def _await_earlier(self, rt: ModelRuntime, first_id: str) -> bool:
        """Wait (at most ``order_wait_ms``) for other workers' labelled batches that start
        before ``first_id`` to be committed, applying the log as it grows. True if the
        wait ended by applying the log (then the model is current)."""
        res = wait_for_earlier(rt.inflight, first_id, self.options.order_wait_ms / 1000.0,
                               lambda batches, block_ms: self._tail(rt, batches, block_ms))
        if res.waited_for:
            mw = self._mw(rt)
            self.metrics.order_wait_seconds.labels(**mw).observe(res.seconds)
            if res.timed_out:
                self.metrics.order_wait_timeouts.labels(**mw).inc()
                log.info("model %s: waited %.0f ms for %d earlier labelled batch(es) of other "
                         "workers; predicting batch %s without them", rt.name, res.seconds * 1000,
                         res.waited_for, first_id)
        return res.caught_up

    def _withdraw(self, rt: ModelRuntime, name: str | None) -> None:
        if name is None:
            return
        try:
            rt.inflight.withdraw(name)
        except redis.RedisError as exc:  # it goes stale in 10 s; others wait at most that long
            log.warning("model %s: could not withdraw the in-flight announcement: %s", rt.name, exc)

    @staticmethod
    def _drop_foreign_labels(rt: ModelRuntime, msgs: list[tuple[str, InputMessage, bytes]],
                             items: list[Item], refs: list[LabelRef], dead: list[Dead],
                             ref_data: dict[str, bytes]) -> tuple[list[Item], list[LabelRef]]:
        """Dead-letter (``bad_label``) every label of another type than the model's classes,
        or, before the first class, than the batch's first label: one model, one label type."""
        known = rt.replica.model.stats["classes"].labels
        first = next((msg.label for _, msg, _ in msgs if msg.label is not None), None)
        if first is None:
            return items, refs
        want = type(known[0]) if known else type(first)
        candidates = [(it.entry_id, it.msg.label, it.data) for it in items]
        candidates += [(r.entry_id, r.label, ref_data[r.entry_id]) for r in refs]
        foreign = {eid: (label, data) for eid, label, data in candidates
                   if label is not None and type(label) is not want}
        if not foreign:
            return items, refs
        dead += [Dead(eid, "bad_label", f"label {label!r} is {type(label).__name__}, but this "
                      f"model's labels are {want.__name__}", data)
                 for eid, (label, data) in foreign.items()]
        return ([it for it in items if it.entry_id not in foreign],
                [r for r in refs if r.entry_id not in foreign])

    def _predict(self, rt: ModelRuntime, items: list[Item],
                 prepared: tuple[list[str], Any, Any] | None = None) -> Predicted | None:
        """Predict and decide every item. Prequential (the default): item i is predicted by
        the replica plus the labelled items before it in the batch, as one-at-a-time
        processing would; the replica itself is not touched (it changes only by the log).
        ``prepared``: :meth:`_prepare_prediction` of the batch, used if the items are still
        the same. Returns what the observer is shown once the commit is sent (None: no item
        had a class to predict)."""
        prequential = self.options.prequential and rt.replica.model.cheap_prequential
        model = rt.replica.model
        if prepared is not None and prepared[0] == [it.entry_id for it in items]:
            X, plan = prepared[1], prepared[2]
        else:  # items were dropped since (labels of another type): stacked again
            X, plan = rt.featurizer.stack([it.row for it in items]), None
        n = len(items)
        oov = None
        if prequential:
            pred = model.predict_log_proba_prequential(
                X, [it.msg.label for it in items],
                np.array([it.msg.weight for it in items], dtype=np.float64), plan=plan)
            classes, lp, n_known = list(pred.classes), pred.log_proba, pred.n_known
            log_prior, oov = pred.log_prior, pred.unseen_share
        else:  # the whole batch with the model as it was before the batch
            try:
                classes = list(model.classes_)
                lp = model.predict_log_proba(X)
            except NotFittedError:
                classes, lp = [], np.zeros((n, 0))
            counts = np.asarray(model.stats["classes"].counts, dtype=np.float64)
            n_known = np.full(n, len(classes), dtype=np.int64)
            with np.errstate(divide="ignore"):
                prior = np.log(counts) - math.log(counts.sum()) if counts.sum() > 0 else \
                    np.full(len(classes), np.nan)
            log_prior = np.broadcast_to(prior, lp.shape)
        classes = [c.item() if hasattr(c, "item") else c for c in classes]
        # Decide rows that knew the same classes together; with a class-prior override the
        # learnt priors differ row by row (prequential), so each row is decided alone.
        per_row = prequential and rt.rule.class_prior is not None
        groups: dict[Any, list[int]] = {}
        for i, k in enumerate(n_known.tolist()):
            if k > 0:
                groups.setdefault(i if per_row else k, []).append(i)
        dec_lp = np.full(lp.shape, -np.inf)
        unsure = np.zeros(n, dtype=bool)
        for it in items:
            it.label, it.log_proba, it.model_log_proba = None, {}, None
        for rows in groups.values():
            k = int(n_known[rows[0]])
            prior_k = log_prior[rows[0], :k]
            dec = rt.rule.decide(lp[rows, :k], classes[:k],
                                 prior_k if np.isfinite(prior_k).any() else None)
            dec_lp[rows, :k] = dec.log_proba
            unsure[rows] = dec.unsure
            known, decided = classes[:k], dec.log_proba.tolist()  # (Python floats)
            for j, i in enumerate(rows):
                it = items[i]
                it.label = dec.labels[j]
                it.log_proba = dict(zip(known, decided[j], strict=True))
                it.model_log_proba = lp[i]  # scored against its label once the batch commits
        done = np.flatnonzero(n_known > 0)
        if not done.size:
            return None
        rt.predicted_classes = classes
        return Predicted(classes, [items[i] for i in done], dec_lp[done], unsure[done],
                         None if oov is None else oov[done])

    def _observe_predictions(self, rt: ModelRuntime, p: Predicted, now: float) -> None:
        """Message ages and the observer's view of one batch's predictions: run once the
        commit is on its way (off the path from one worker's commit to the next's), with
        the model the batch was predicted with (the log is applied only after)."""
        ages = np.array([max(0.0, now - entry_time(it.entry_id)) for it in p.items])
        observe_many(self.metrics.message_age.labels(**self._mw(rt)), ages)
        oov = p.oov_share if p.oov_share is not None else self._oov_share(rt.replica.model, p.items)
        self._observe(rt, "observe_predictions", p.classes, p.log_proba, oov, ages, p.unsure)

    @staticmethod
    def _oov_share(model: Any, items: list[Item]) -> np.ndarray:
        """Share of each message's features never seen by the model (0 for dense input);
        where the prediction found it on the way (:class:`Predicted`), that is used instead."""
        out = np.zeros(len(items))
        fc = model.stats.parts.get("features") if hasattr(model.stats, "parts") else None
        if fc is None or not hasattr(fc, "column_counts"):
            return out
        parts = [it.row.indices if it.row.indices is not None else np.empty(0, np.int32)
                 for it in items]
        sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        if not sizes.any():
            return out
        idx = np.concatenate(parts)  # one lookup for the whole batch
        unseen = ~fc.column_counts(idx).any(axis=0) if len(fc.labels) else np.ones(idx.size, bool)
        row = np.repeat(np.arange(len(items)), sizes)
        n_unseen = np.bincount(row, weights=unseen, minlength=len(items))
        has = sizes > 0
        out[has] = 1.0 - (sizes[has] - n_unseen[has]) / sizes[has]
        return out

    def _stats(self, rt: ModelRuntime, rows: list[tuple[Row, Any, float]]) -> Any:
        if not rows:
            return None
        X = rt.featurizer.stack([r for r, _, _ in rows])
        return rt.replica.model.batch_stats(X, [lab for _, lab, _ in rows],
                                            np.array([w for _, _, w in rows], dtype=np.float64))

    def _committed(self, rt: ModelRuntime, learn: list, res: Any, dead: list[Dead],
                   add_rows: list, n_out: int) -> None:
        m, mw = self.metrics, self._mw(rt)
        m.commits.labels(**mw).inc()
        m.messages_predicted.labels(**mw).inc(n_out)
        # one inc per class and batch (not per message): the same totals
        for lab, n in Counter(str(lab) for _, lab, _ in add_rows).items():
            m.messages_learned.labels(**mw, **{"class": lab}).inc(n)
        for lab, n in Counter(str(lab) for lab in res.unlearned).items():
            m.messages_unlearned.labels(**mw, **{"class": lab}).inc(n)
        if res.corrections:
            m.corrections.labels(**mw).inc(res.corrections)
        for d in dead:
            m.dead_letters.labels(**mw, reason=d.reason).inc()
        t0 = time.perf_counter()
        scored = [it for it, _ in learn if it.msg.label is not None and it.model_log_proba is not None]
        if scored:  # test-then-train, counted once: only what this commit learnt
            self._observe(rt, "score_labelled", rt.predicted_classes,
                          np.vstack([it.model_log_proba for it in scored]),
                          [it.msg.label for it in scored])
        if res.delayed:
            classes, mat, truth, delays = delayed_matrix(res.delayed)
            if truth:
                self._observe(rt, "score_delayed", classes, mat, truth, delays)
        m.stage_seconds.labels(**mw, stage="score").observe(time.perf_counter() - t0)


# ---------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> int:
    """``python -m streamnb_workers.worker``: a bare worker for tests and debugging (the supported
    command is ``streamnb worker``). Specs and options are JSON."""
    from streamnb_workers.connection import RedisSettings, UrlConnector

    p = argparse.ArgumentParser(prog="python -m streamnb_workers.worker")
    p.add_argument("--redis", required=True)
    p.add_argument("--spec", action="append", required=True,
                   help='JSON ModelSpec, e.g. {"name": "mail", "kind": "multinomial"}')
    p.add_argument("--options", default="{}", help="JSON WorkerOptions fields")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    specs = [ModelSpec(**json.loads(s)) for s in a.spec]
    worker = Worker(UrlConnector(RedisSettings(a.redis)), specs, WorkerOptions(**json.loads(a.options)))
    tune_gc()
    return worker.run()


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["Worker", "WorkerOptions", "ModelSpec", "ensure_group", "error_kind", "main", "tune_gc"]
