"""A worker's duties besides its batches, per model, each on a timer of its own: the
heartbeat, the snapshot lease, and for the lease holder snapshots, the trim of ``:in``,
stream gauges and the removal of dead consumers; the observer's look at the model; the claims of idle entries
(workers/worker/intake.py); each on its timer (workers/worker/timers.py).

A worker serving many models (more than :data:`FEW_MODELS`) runs them in slices
(:class:`DutyRound`): a step runs the duties of the models in turn for as long as the rest
of the previous step took (at least :data:`DUTY_SLICE_S`, at most :data:`DUTY_SLICE_MAX_S`,
which is the slice after a step that handled no entry),
and the next step goes on from there without blocking on its read, so duties come due
together (after a long step) never hold up a batch for long, and take at most about half
the worker's time while they are overdue; and a
step settles and tails the models it had a batch of or a commit on the wire, the other
held replicas every ``IDLE_TAIL_S`` (workers/worker/timers.py).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from streamnb.encoding import dumps
from streamnb_workers.observe import token_names
from streamnb_workers.replication.replica import snapshot_age
from streamnb_workers.replication.snapshotter import (
    delete_consumer_if_idle,
    live_workers,
    remove_dead_consumers,
    stream_gauges,
)
from streamnb_workers.store.input_trim import trim_input
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import entry_time
from streamnb_workers.worker.accounting import settle_and_tail
from streamnb_workers.worker.runtime import ModelRuntime

__all__ = ["DUTY_SLICE_MAX_S", "DUTY_SLICE_S", "FEW_MODELS", "DutyRound", "beat_many", "drop_sampled_gauges", "heartbeat",
           "housekeeping", "leave", "sample_gauges", "settle_models", "tail_many", "trim_consumed_input"]

log = logging.getLogger("streamnb.worker")

#: Up to this many models a worker runs every model's duties, and settles and tails every
#: model, each step (as the announced read of workers/worker/intake.py, 8).
FEW_MODELS = 8
#: Seconds of a step the duties of many models may take at least, and at most (then the
#: next step goes on): between them, as long as the rest of the previous step.
DUTY_SLICE_S = 0.05
DUTY_SLICE_MAX_S = 0.5
#: With many models, the heartbeats and lease renewals a step sends at most, and in one
#: pipeline (:func:`beat_many`).
BEATS_A_STEP = 2048
BEATS_A_PIPELINE = 256
#: Names of the models served a heartbeat lists at most (each model's heartbeat: with
#: 10,000 models all their names would be 60 KB a heartbeat, 10,000 every period).
HEARTBEAT_MODELS = 16


class DutyRound:
    """Which models' duties a step runs (see the module docstring).

    >>> from types import SimpleNamespace
    >>> models = [SimpleNamespace(name=str(i), pending_phase=False,
    ...                           config=SimpleNamespace(training="in")) for i in range(10)]
    >>> ticks = iter(range(100))
    >>> d = DutyRound(slice_s=2.5, max_s=2.5, clock=lambda: next(ticks))
    >>> models[5].pending_phase = True  # its pending entries are redone all the same
    >>> [(rt.name, due) for rt, due in d.walk(models)], d.overdue
    ([('0', True), ('1', True), ('2', True), ('5', False)], True)
    >>> [rt.name for rt, due in d.walk(models) if due]
    ['3', '4', '5']
    """

    def __init__(self, slice_s: float = DUTY_SLICE_S, max_s: float = DUTY_SLICE_MAX_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.slice_s, self.max_s, self.clock = slice_s, max_s, clock
        #: Where the next step's duties start, and whether some were left for it.
        self.cursor, self.overdue = 0, False
        #: When the last walk's duties ended (the rest of the step runs from there), and
        #: whether the step after it handled no entry (:meth:`after_step`).
        self.ended: float | None = None
        self.idle = False

    def walk(self, models: Sequence[Any], away: Any = ()) -> Iterator[tuple[Any, bool]]:
        """The models of ``models`` whose intake runs this step, the next step's first
        first, and whether their duties run: all of them for :data:`FEW_MODELS` or fewer,
        else those whose duties run while the slice lasts and the others that have pending
        entries to redo, a ``:train`` stream to move, or are ``away`` (in an outage)."""
        n = len(models)
        if n <= FEW_MODELS:
            self.overdue = False
            yield from ((rt, True) for rt in models)
            return
        start, t0, ran = self.cursor % n, self.clock(), 0
        rest = self.slice_s if self.ended is None or not self.overdue else t0 - self.ended
        budget = self.max_s if self.idle else min(self.max_s, max(self.slice_s, rest))
        self.overdue = False
        for i in range(n):
            rt = models[(start + i) % n]
            due = not self.overdue
            if due or rt.pending_phase or rt.config.training == "train" or rt.name in away:
                yield rt, due
            if due:
                ran += 1
                self.overdue = ran < n and self.clock() - t0 > budget
        self.cursor, self.ended = start + ran, self.clock()

    def after_step(self, handled: int) -> None:
        """The step handled ``handled`` entries: after one that handled none, the next
        slice is the longest (nobody waits for a batch)."""
        self.idle = not handled

    @staticmethod
    def settles(rt: Any, touched: set[str], n_models: int) -> bool:
        """Whether a step settles and tails ``rt``: always with few models; else when it
        had a batch (``touched``) or has a commit on the wire, and every ``idle_tail`` a
        held replica."""
        if n_models <= FEW_MODELS or rt.name in touched or rt.wire.in_flight is not None:
            return True
        return not rt.replica.evicted and rt.timers.idle_tail.fire(time.monotonic())

def settle_models(guard: Any, live: list[ModelRuntime], touched: set[str]) -> None:
    """At a step's end, those of ``live`` served in it and not holding a batch read ahead
    (whose commit runs on) that :meth:`DutyRound.settles`: the reply of each one's commit
    on the wire read and accounted for, then its log applied (``settle_and_tail``,
    through ``guard``: workers/worker/outages.py). With many models on one node, those
    with no commit on the wire read their logs in one round trip (:func:`tail_many`)."""
    rts = [rt for rt in guard.serving(live)
           if rt.read_ahead is None and DutyRound.settles(rt, touched, len(live))]
    quiet = [rt for rt in rts if rt.wire.in_flight is None] \
        if len(live) > FEW_MODELS and not guard.active else []
    tail_many(quiet)
    for rt in [rt for rt in rts if rt.wire.in_flight is not None] if quiet else rts:
        guard(rt, settle_and_tail, rt)


def tail_many(rts: list[ModelRuntime]) -> None:
    """The logs of ``rts`` (held replicas' only: an evicted one applies nothing) applied,
    their first reads (``Replica.tail_commands``) in one round trip each
    :data:`BEATS_A_PIPELINE` models."""
    held = [rt for rt in rts if not rt.replica.evicted]
    replicas = held[0].replicas if held else None  # (the worker's cache, shared)
    for j in range(0, len(held), BEATS_A_PIPELINE):  # (each reply holds the last entry applied)
        chunk = held[j:j + BEATS_A_PIPELINE]
        pipe = chunk[0].client.pipeline(transaction=False)
        for rt in chunk:
            rt.replica.tail_commands(pipe)
        replies = pipe.execute(raise_on_error=False)
        for i, rt in enumerate(chunk):
            first = replies[3 * i:3 * i + 3]
            rt.tail(first=None if any(isinstance(r, Exception) for r in first) else first)
        if replicas is not None:  # what the deltas applied grew, measured: evictions
            replicas.before_read()


def housekeeping(rt: ModelRuntime, served: list[str], now: float | None = None) -> None:
    """Whatever of the model's duties is due (``served``: every model the worker serves,
    for its heartbeat)."""
    now = time.monotonic() if now is None else now
    t = rt.timers
    if t.heartbeat.fire(now):
        heartbeat(rt, served)
    was_holder = rt.snapshotter.holder
    if t.lease.fire(now):
        rt.snapshotter.hold_lease()
    if rt.snapshotter.holder:
        if rt.snapshotter.maybe_write(rt.replica):
            rt.series(rt.metrics.snapshots_written).inc()
        if rt.options.input_trim_s > 0 and t.trim_input.fire(now):
            trim_consumed_input(rt)
        if rt.options.model_metrics and t.gauges.fire(now):  # (pooled, they would mean nothing)
            sample_gauges(rt)
        if t.cleanup.fire(now):
            removed = remove_dead_consumers(rt.client, rt.keys, rt.options.stale_s, rt.consumer)
            if removed:
                log.info("model %s: removed dead consumers %s", rt.name, removed)
    if was_holder and not rt.snapshotter.holder:
        drop_sampled_gauges(rt)  # the lease moved: the new holder samples them, ours go stale
    if rt.token_names is not None and rt.token_names.changed and t.names.fire(now):
        publish_token_names(rt)
    if t.observe.due(now) and rt.observe_model():
        t.observe.restart(now)
        if rt.replicas is not None:  # (the observer may build the model's tables)
            rt.replicas.measure(rt.name)


def leave(rt: ModelRuntime) -> None:
    """At a clean shutdown: the log applied, the token names published, the last snapshot
    written and the lease released (by its holder), the heartbeat dropped, and this
    consumer deleted from the group if it has nothing pending; Redis errors are logged."""
    try:
        rt.replica.catch_up()
        publish_token_names(rt)
        if rt.snapshotter.holder:
            rt.snapshotter.maybe_write(rt.replica, final=True)
            rt.snapshotter.release()
        rt.client.hdel(rt.keys.workers, rt.consumer)
        delete_consumer_if_idle(rt.client, rt.keys, rt.consumer)
    except Exception as exc:  # noqa: BLE001 - Redis may be gone; nothing is lost
        log.warning("model %s: clean shutdown incomplete: %s", rt.name, exc)


def publish_token_names(rt: ModelRuntime) -> None:
    """Replace ``{M}:tokens`` with the names this worker counted, if they changed since it
    last did (on the timer, and at a clean shutdown)."""
    names = rt.token_names
    if names is not None and names.changed:
        names.changed = False
        token_names.publish(rt.client, rt.keys.tokens, names.table(rt.featurizer.hasher))


def heartbeat(rt: ModelRuntime, served: list[str]) -> None:
    """Write this worker's heartbeat in ``:workers`` and see whether others are alive."""
    rt.client.hset(rt.keys.workers, rt.consumer, heartbeat_value(rt, served))
    beaten(rt, rt.client.hgetall(rt.keys.workers))


def heartbeat_value(rt: ModelRuntime, served: list[str]) -> bytes:
    """The model's heartbeat, msgpack: ``ts``, ``pid``, ``host``, ``version``, ``models``
    (at most :data:`HEARTBEAT_MODELS` of those ``served``) and ``n_models``."""
    return dumps({"ts": time.time(), "pid": os.getpid(), "host": socket.gethostname(),
                  "version": rt.replica.version, "models": served[:HEARTBEAT_MODELS],
                  "n_models": len(served)})


def beaten(rt: ModelRuntime, listed: dict) -> None:
    """After a heartbeat: whether another worker's in ``:workers`` (``listed``) is alive."""
    live = live_workers(rt.client, rt.keys, rt.options.stale_s, listed)
    rt.saw_peers(bool(live.keys() - {rt.consumer}))
    rt.series(rt.metrics.heartbeat).set(time.time())


def beat_many(rts: list[ModelRuntime], served: list[str], now: float | None = None) -> int:
    """With many models on one node, before their duties: the heartbeats and lease
    renewals due of at most :data:`BEATS_A_STEP` of ``rts``, in pipelines of
    :data:`BEATS_A_PIPELINE` models (one round trip each, where :func:`housekeeping`
    sends three a model), their timers restarted; returns how many models."""
    now = time.monotonic() if now is None else now
    due = [rt for rt in rts
           if rt.timers.heartbeat.due(now) or rt.timers.lease.due(now)][:BEATS_A_STEP]
    for i in range(0, len(due), BEATS_A_PIPELINE):
        pipe, sent = due[i].client.pipeline(transaction=False), []
        for rt in due[i:i + BEATS_A_PIPELINE]:
            beat, lease = rt.timers.heartbeat.fire(now), rt.timers.lease.fire(now)
            if beat:
                pipe.hset(rt.keys.workers, rt.consumer, heartbeat_value(rt, served))
                pipe.hgetall(rt.keys.workers)
            if lease:
                rt.snapshotter.lease_command(pipe)
            sent.append((rt, beat, lease))
        replies = iter(pipe.execute(raise_on_error=False))
        for rt, beat, lease in sent:
            if beat:
                wrote, listed = next(replies), next(replies)
                for reply in (wrote, listed):
                    if isinstance(reply, Exception):
                        raise reply
                beaten(rt, listed)
            if lease:
                was_holder = rt.snapshotter.holder
                if not rt.snapshotter.leased(next(replies)) and was_holder:
                    drop_sampled_gauges(rt)  # (as in housekeeping)
    return len(due)


def trim_consumed_input(rt: ModelRuntime) -> int:
    """Trim ``:in`` of what every consumer group has acknowledged; returns the entries
    removed."""
    minid, removed = trim_input(rt.client, rt.keys)
    if removed:
        log.debug("model %s: trimmed %d acknowledged entries of :in before %s",
                  rt.name, removed, minid)
    return removed


def sample_gauges(rt: ModelRuntime) -> None:
    """The model's stream lengths, group lag and pending entries, snapshot age and live
    workers, as gauges."""
    g = stream_gauges(rt.client, rt.keys)
    m = rt.metrics
    for stream in ("in", "out", "dead", "log"):
        m.stream_length.labels(model=rt.label, stream=stream).set(g[stream])
    m.group_lag.labels(model=rt.label).set(g["lag"])
    m.group_pending.labels(model=rt.label).set(g["pending"])
    age = snapshot_age(rt.client, rt.keys)
    if age is None:  # no snapshot yet: the age of what only the log holds (0: nothing)
        first = rt.client.xrange(rt.keys.log, count=1)
        age = max(0.0, time.time() - entry_time(as_str(first[0][0]))) if first else 0.0
    m.snapshot_age.labels(model=rt.label).set(age)
    m.live_workers.labels(model=rt.label).set(len(live_workers(rt.client, rt.keys, rt.options.stale_s)))


def drop_sampled_gauges(rt: ModelRuntime) -> None:
    """Remove the gauges :func:`sample_gauges` read from Redis (stream lengths, lag,
    pending, snapshot age, live workers) while Redis cannot be reached: a scrape then
    shows them absent rather than their last values as if they were current. The lease
    holder samples them again once Redis answers."""
    m = rt.metrics
    for stream in ("in", "out", "dead", "log"):
        m.stream_length.remove(rt.label, stream)
    for gauge in (m.group_lag, m.group_pending, m.snapshot_age, m.live_workers):
        gauge.remove(rt.label)
