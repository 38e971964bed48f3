"""The worker loop: start, then step until stopped (housekeeping, claims, own pending
entries, new entries, their batches, the commits' replies, the log); reconnect with
bounded backoff after Redis errors; a warm shutdown at the first signal, a cold one at
the second.

One iteration (:meth:`Worker.step`): per model, housekeeping (workers/worker/housekeeping.py)
and claims of idle entries, then its own pending entries first after a (re)start; then
``XREADGROUP ... >`` over every model's ``:in`` (the batches read ahead behind commits
first); per batch workers/worker/process.py; then per model the reply of the commit on the wire
and the log. See docs/worker.md.

>>> import fakeredis, msgpack
>>> from streamnb_workers.store.connection import ClientConnector
>>> from streamnb_workers.store.model_config import ModelSpec
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

import logging
import os
import signal
import threading
import time
from dataclasses import replace
from typing import Any

from streamnb.exceptions import StreamnbError
from streamnb_workers.observe.health import RedisHealth
from streamnb_workers.observe.metrics import Metrics, default_metrics
from streamnb_workers.replication.read_plan import ReadPlan
from streamnb_workers.replication.replica_cache import (
    CacheMetrics,
    ReplicaCache,
    resident_bytes,
)
from streamnb_workers.replication.shards import ShardSum, shard_names, shard_spec
from streamnb_workers.replication.user_sum import UserModelWatch, UserSum
from streamnb_workers.store.access import check_access
from streamnb_workers.store.backoff import Backoff
from streamnb_workers.store.commit import COMMIT_SCRIPT
from streamnb_workers.store.connection import (
    Connector,
    UrlConnector,
    close_clients,
    is_access_error,
)
from streamnb_workers.store.errors import UNREACHABLE_KINDS, error_kind
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelConfig, ModelSpec, ensure_config
from streamnb_workers.worker.accounting import account
from streamnb_workers.worker.committing import abandon, settle
from streamnb_workers.worker.heap import HeapTrimmer
from streamnb_workers.worker.housekeeping import (
    FEW_MODELS,
    DutyRound,
    beat_many,
    drop_sampled_gauges,
    housekeeping,
    leave,
    settle_models,
)
from streamnb_workers.worker.intake import (
    READ_SCRIPT,
    ReadBatch,
    all_done,
    ensure_group,
    in_stream_order,
    move_training,
    read_each,
    read_groups,
    training_done,
)
from streamnb_workers.worker.options import WorkerOptions
from streamnb_workers.worker.outages import ModelGuard
from streamnb_workers.worker.process import process_batch
from streamnb_workers.worker.redo import claim_idle_entries, redo_pending
from streamnb_workers.worker.restore import restore_lost_keys, restore_models
from streamnb_workers.worker.runtime import ModelRuntime

__all__ = ["Worker"]

log = logging.getLogger("streamnb.worker")
#: Models whose commands the start-up access check runs (each about 30 round trips).
ACCESS_CHECKED = 16

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
        #: Per model or shard served (a model of K shards: its K shards' names).
        self.models: dict[str, ModelRuntime] = {}
        #: The names of the models (of ``specs``) being served; the configs of those in
        #: shards (each shard's runtime is in :attr:`models`).
        self.served: set[str] = set()
        self.sharded: dict[str, ModelConfig] = {}
        self.client: Any = None
        self.reader: Any = None
        self._stop = threading.Event()
        self._signals = 0
        self.started = False
        #: Redis was found unreachable: every model's reachable gauge reads 0 until it answers.
        self._unreachable = False
        self.backoff = Backoff(self.options.backoff_base_s, self.options.backoff_cap_s)
        self.heap = HeapTrimmer(self.options.release_memory_s)
        self.health = RedisHealth(self.options.healthz_grace_s,
                                  self.metrics.redis_up.labels(worker=self.consumer))
        #: Each model's part of a step, and the models away while the others are served.
        self.guard = ModelGuard(lambda: Backoff(self.options.backoff_base_s,
                                                self.options.backoff_cap_s))
        #: Check each model's keys before the next step (after a reconnect or NOGROUP):
        #: Redis may have come back without them (workers/worker/restore.py).
        self.check_keys = False
        # the bound is the process's resident memory: replicas, runtimes and heap slack
        self.replicas = ReplicaCache(self.options.replica_memory,
                                     CacheMetrics(self.metrics, self.consumer),
                                     resident_bytes, self.heap.trim)
        #: What the models share: a featurizer a featurizer config, pooled series (runtime.py).
        self.shared: dict = {}
        self.users, self.users_due = UserModelWatch(), 0.0  # per-user models: next look
        self.duties = DutyRound()  # many models: their duties in slices (housekeeping.py)
        #: Many models: new entries read in groups within the bound (read_plan.py).
        self.plan = ReadPlan.within(self.options.replica_memory)

    # ------------------------------------------------------------------ lifecycle
    def connect(self) -> None:
        self.client = self.connector.client()
        self.reader = self.connector.reader(self.options.block_ms)
        self.guard.clients = tuple({id(c): c for c in (self.client, self.reader)}.values())
        for rt in self.models.values():
            rt.set_clients(self.client, self.reader)

    def start(self) -> None:
        """Connect, create or verify each model's config and group, load the replicas."""
        if self.client is None:
            self.connect()
        if isinstance(self.connector, UrlConnector) and not self.models:
            # ACL/credentials: fail now, in one line (the first models: as per-user ones)
            check_access(self.client, [s.name for s in self.specs[:ACCESS_CHECKED]],
                         where=self.connector.settings.describe())
        if self.options.send_ahead and not self.connector.cluster:
            for script in (COMMIT_SCRIPT, READ_SCRIPT):  # pipelined writes send EVALSHA only
                script.load(self.client)
        for spec in self.specs:
            if spec.name in self.served:
                continue
            if self.options.explain is not None:  # (a model setting: workers agree on it)
                spec = replace(spec, explain=self.options.explain)
            cfg = ensure_config(self.client, spec)
            # several models (or shards): no batch held out of turn
            alone = len(self.specs) == 1 and cfg.shards == 1 and not self.options.per_user_s
            if cfg.shards == 1:
                self._serve(cfg, alone)
            else:
                shards = [self._serve(ensure_config(self.client, shard_spec(cfg, name)), alone)
                          for name in shard_names(spec.name, cfg.shards)]
                total = ShardSum(cfg, [rt.replica for rt in shards])
                for rt in shards:
                    rt.sum_shards(total)
                self.sharded[spec.name] = cfg
            self.served.add(spec.name)
        self._serve_users()
        self.started = True
        self.health.up()

    def _serve(self, cfg: ModelConfig, alone: bool) -> ModelRuntime:
        """Start serving the model (or shard) stored as ``cfg``: its group, its replica
        (``alone``: the only model the worker serves, whose batches are read ahead)."""
        ensure_group(self.client, ModelKeys(cfg.name))
        cache = None if "|" in cfg.name else self.replicas  # (a shard's: held for good)
        rt = ModelRuntime(cfg, self.client, self.options, self.metrics, self.reader, alone, cache,
                          self.shared)
        if cache is None:  # else loaded if it fits by the cache (workers/worker/runtime.py)
            rt.replica.load()
        rt.timers.cleanup.restart(now := time.monotonic())  # (others' heartbeats: as in _recover)
        rt.timers.idle_tail.restart(now)  # (just loaded, if held)
        self.models[cfg.name] = rt
        self.metrics.start_series(rt.label, self.consumer)
        rt.version_metric()
        rt.series(self.metrics.worker_up).set(1)
        rt.series(self.metrics.model_reachable).set(1)
        log.info("worker %s serves model %s (%s) at version %s", self.consumer, cfg.name,
                 cfg.kind, rt.replica.version)
        return rt

    def _serve_users(self) -> None:
        """Serve the per-user models registered since the last look (user_sum.py)."""
        if not self.options.per_user_s or time.monotonic() < self.users_due:
            return
        self.users_due = time.monotonic() + self.options.per_user_s
        for model, cfg in self.users.new_models(self.client, list(self.served), self.models):
            if model in self.sharded:  # (shards are held for good)
                base = self.models[shard_names(model, self.sharded[model].shards)[0]].summed
            else:  # the sums read it: never evicted (workers/replication/replica_cache.py)
                self.models[model].use_replica()
                self.replicas.pin(model)
                base = self.models[model].replica
            rt = self._serve(cfg, False)
            rt.sum_shards(UserSum(cfg, base, rt.replica, self.options.user_min_weight), user=True)
            self.replicas.attach(cfg.name, rt.summed)  # counted with the user's, dropped with it

    def request_stop(self) -> None:
        """Finish the current batch, commit it, and return from :meth:`run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

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
                if len(self.guard.outages) < len(self.models):
                    self.health.up()
                if self._unreachable:  # Redis answered again: its models are reachable
                    self._unreachable = False
                    for rt in self.models.values():
                        if rt.name not in self.guard.outages:
                            rt.series(self.metrics.model_reachable).set(1)
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

    def _on_signal(self, signum: int, frame: Any) -> None:
        """The first signal: a warm shutdown; the second: a cold one."""
        self._signals += 1
        if self._signals == 1:
            log.info("signal %d: finishing the current batch, then exiting (again: exit now)", signum)
            self.request_stop()
        else:
            log.warning("second signal %d: exiting now; uncommitted messages stay pending", signum)
            os._exit(1)

    def _unexpected_error(self) -> None:
        """After an error that is not Redis being away (a bug, a message not handled): log
        and count it, wait a second, redo the pending entries one at a time (``isolate``):
        only the entry that fails reaches ``max_deliveries`` and goes to ``:dead``."""
        log.exception("worker %s: unexpected error; the batch stays pending", self.consumer)
        for rt in self.models.values():
            rt.series(self.metrics.worker_errors).inc()
        self._stop.wait(1.0)
        for rt in self.models.values():
            try:
                account(rt, settle(rt)[1])
            except Exception:  # noqa: BLE001 - its batch stays pending
                log.exception("model %s: the commit on the wire failed", rt.name)
            abandon(rt)
            rt.isolate_next()

    def _finish_pipeline(self) -> None:
        """Warm shutdown: process the batch read ahead and read the last commit's reply."""
        for rt in self.models.values():
            try:
                while (ahead := rt.take_read_ahead()) is not None:
                    # (settling a commit may bring the batch read behind it)
                    process_batch(rt, ahead.entries, None, ahead.announced)
                account(rt, settle(rt)[1])
            except Exception as exc:  # noqa: BLE001 - what is not committed stays pending
                log.warning("model %s: the last batches were not committed: %s", rt.name, exc)
                abandon(rt)

    def _recover(self, exc: BaseException) -> None:
        """After a Redis error: count it, wait a bounded backoff, reconnect; the
        uncommitted work is redone from this consumer's pending entries."""
        kind = error_kind(exc) or "other"
        if kind in UNREACHABLE_KINDS:
            self.health.down()
            self._unreachable = True
            for rt in self.models.values():
                drop_sampled_gauges(rt)  # read from Redis: not served while it is away
                rt.series(self.metrics.model_reachable).set(0)
        self.check_keys = True
        for rt in self.models.values() or [None]:
            labels = {"model": rt.label if rt else "-", "worker": self.consumer}
            self.metrics.redis_errors.labels(**labels, kind=kind).inc()
            self.metrics.reconnects.labels(**labels).inc()
        for rt in self.models.values():
            abandon(rt, withdraw=False)  # Redis is away; announcements go stale
        delay = self.backoff.next_delay()
        log.warning("redis %s error at %s: %s; reconnecting in %.2fs (attempt %d)", kind,
                    self.connector.describe(), exc, delay, self.backoff.attempts)
        self._stop.wait(delay)
        old = {id(self.client): self.client, id(self.reader): self.reader}.values()
        for c in old:
            try:
                if c is not None and hasattr(c, "connection_pool"):
                    c.connection_pool.disconnect()
            except Exception:  # noqa: BLE001, S110 - best effort
                pass
        try:
            self.connect()
        except Exception as e2:  # noqa: BLE001 - retried on the next attempt
            log.warning("reconnect failed: %s", e2)
        else:
            if self.connector.cluster:  # new clients learnt the topology anew
                close_clients(old)
        now = time.monotonic()
        for rt in self.models.values():
            rt.redo_pending()  # uncommitted work is redone from our pending entries
            # the other workers' heartbeats went stale in the outage too: judge them dead
            # only once they have had stale_s to write them again
            rt.timers.cleanup.restart(now)

    def shutdown(self) -> None:
        """Leave cleanly: final snapshot if lease holder, release lease, publish token names
        counted since the last time, drop heartbeat, delete this consumer from the group if
        it has nothing pending."""
        for rt in self.models.values():
            rt.series(self.metrics.worker_up).set(0)
            leave(rt)
        log.info("worker %s stopped", self.consumer)

    def step(self, block_ms: int | None = None) -> int:
        """One iteration of the loop; returns the number of entries handled."""
        if not self.started:
            self.start()
        block_ms = self.options.block_ms if block_ms is None else block_ms
        n, served, touched = 0, list(self.models), set()  # touched: models with a batch
        if self.check_keys and not self._restore_lost_keys():
            return 0
        self._serve_users()
        guard = self.guard
        guard.active = bool(self.connector.cluster) and len(self.models) > 1
        now = time.monotonic()
        live = guard.live(list(self.models.values()), now)
        if not live:  # every model away (workers/worker/outages.py): wait for the first retry
            self.health.down()
            self._stop.wait(min(block_ms / 1000.0,
                                max(0.0, guard.outages.next_retry() - now)))
            return 0
        if len(live) > FEW_MODELS and not guard.active:  # (many models: in pipelines)
            beat_many(live, served)
        for rt, duties in self.duties.walk(live, guard.outages):
            got = guard(rt, self._intake, rt, served, duties) or 0
            n += got
            touched.update([rt.name] if got else [])
        live = guard.serving(live)
        # batches read while the previous commit ran (pipelined), then the other models'
        aheads = [(rt, rt.take_read_ahead()) for rt in live]
        batches: list[tuple[ModelRuntime, ReadBatch]] = [(t, a) for t, a in aheads if a]
        rest = [rt for rt, a in aheads if a is None]
        groups: Any = [in_stream_order(batches)]  # (lists of batches, each emptied)
        if not self.stopping and rest:
            wait = 0 if batches or n or self.duties.overdue else block_ms
            if guard.active:  # a read a model, each guarded
                groups = [in_stream_order(batches + read_each(
                    guard, self.reader, self.consumer, rest, self.options.batch, wait,
                    self._announce_reads))]
            else:  # many models: in groups within the memory bound (intake.py)
                plan = self.plan if len(self.models) > FEW_MODELS else None
                self.replicas.read_room = plan.room if plan is not None else 0
                groups = read_groups(self.reader, self.consumer, rest, self.options.batch, wait,
                                     self.connector.cluster, self._announce_reads, plan,
                                     self.replicas.before_read, batches)
        for group in groups:  # (one group's entries held at a time)
            n += self._process(group, touched)
        settle_models(guard, live, touched)  # commits landed, logs applied
        guard.came_back(live)
        self.duties.after_step(n)
        self.heap.after_step(n)
        self.replicas.hold()  # the process's resident memory within the bound
        return n

    def _process(self, group: list[tuple[ModelRuntime, ReadBatch]], touched: set[str]) -> int:
        """Process the batches of ``group`` in its order, emptying it; entries handled."""
        n, ahead_ok = 0, not self.stopping and not self.connector.cluster
        while group:
            rt, batch = group.pop(0)
            touched.add(rt.name)
            if rt.name not in self.guard.failed:
                n += self.guard(rt, process_batch, rt, batch.entries, None, batch.announced,
                                ahead_ok) or 0
        return n

    @property
    def _announce_reads(self) -> bool:
        """Ordered predictions: each batch announced as it is read (intake.py ``read_announced``)."""
        return self.options.order_wait_ms > 0

    def _intake(self, rt: ModelRuntime, served: list[str], duties: bool = True) -> int:
        """Model ``rt``'s housekeeping and claims (``duties``), and own pending entries (a
        model back from away first gets back what Redis lost: workers/worker/restore.py)."""
        if rt.name in self.guard.outages and "settling" in restore_lost_keys(rt):
            self.guard.failed.add(rt.name)  # its group is being made again: soon
            return 0
        if duties:
            housekeeping(rt, served)
        rt.train_token = move_training(rt.client, rt.keys, self.options.batch, rt.config.training)
        n = claim_idle_entries(rt) if duties else 0
        if rt.pending_phase:
            n += redo_pending(rt)
        return n

    def run_until_idle(self, timeout: float = 60.0, block_ms: int = 20) -> None:
        """Process until no model has undelivered or pending entries, then catch up."""
        deadline = time.monotonic() + timeout
        while True:
            n = self.step(block_ms)
            if n == 0 and all(all_done(self.client, rt.keys) and training_done(
                    self.client, rt.keys, rt.config.training) for rt in self.models.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.consumer} not idle after {timeout}s")
        for rt in self.models.values():
            rt.tail()

    def _restore_lost_keys(self) -> bool:
        """Write back what Redis lost of each model (workers/worker/restore.py); False while a
        model's group waits for the other workers' replicas (after a short wait: the step
        reads nothing meanwhile)."""
        if restore_models(self.client, list(self.sharded.values()), list(self.models.values())):
            self._stop.wait(0.25)
            return False
        self.check_keys = False
        return True
