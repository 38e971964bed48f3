"""A batch's commit from its content to its reply: built (:func:`build`), committed at
once (:func:`commit`) or sent without waiting while the next batch is decoded
(:func:`send_ahead`, then :func:`settle`), retried after lost ids or changed cache
entries, and accounted for once it lands (metrics, scores, the worker's own delta).

Pipelined commits (``WorkerOptions.pipeline``): after building the commit of a full
batch, the worker sends it on a connection of its own, with the next batch in hand (read
first if it was not read behind the previous commit), decodes and featurizes that batch
while Redis runs the script, and reads the reply (:func:`settle`) before it predicts it,
so the predictions and what is learnt are those of one batch after the other. When the
batch in hand is full and the worker is alone on the model, the batch after it is read
behind the script, in the same write (workers/worker/read_ahead.py): its entries come with the
commit's reply. See docs/worker.md, "Pipelined commits".
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import redis

from streamnb.exceptions import StreamnbError
from streamnb_workers.replication.replica import encode_decay, encode_delta
from streamnb_workers.store.commit import (
    CommitRequest,
    CommitResult,
    SentCommit,
    commit_batch,
    send_commit,
)
from streamnb_workers.store.label_cache import batch_writes, fetch_cached
from streamnb_workers.wire.learn_keys import known_keys
from streamnb_workers.wire.outputs import encode_dead
from streamnb_workers.wire.stream_ids import first_id
from streamnb_workers.worker.commit_content import CommitContent, PredictedBatch, commit_content
from streamnb_workers.worker.intake import read_new
from streamnb_workers.worker.labels import delayed_matrix
from streamnb_workers.worker.read_ahead import READ_SCRIPT, read_commands, read_reply
from streamnb_workers.worker.runtime import ReadBatch

if TYPE_CHECKING:
    from streamnb_workers.worker.runtime import ModelRuntime

__all__ = ["Built", "InFlight", "abandon", "build", "commit", "send_ahead", "settle"]

log = logging.getLogger("streamnb.worker")


@dataclass(frozen=True, slots=True)
class Built:
    """A batch's commit as built: what it writes, and the request that writes it."""

    content: CommitContent
    request: CommitRequest


@dataclass(frozen=True, slots=True)
class InFlight:
    """A commit on the wire: the batch it commits, the commit as built, and the call whose
    reply is still to be read."""

    batch: PredictedBatch
    built: Built
    sent: SentCommit


# ---------------------------------------------------------------------- build
def build(rt: ModelRuntime, batch: PredictedBatch, prepared_s: float = 0.0) -> Built | None:
    """Read the cache entries the batch's labels refer to and build its commit; None if
    nothing is left to commit (every entry was lost). ``prepared_s``: seconds spent on it
    before the wait for other workers, counted in the ``learn`` stage with the rest."""
    o = rt.options
    t0 = time.perf_counter()
    cached = fetch_cached(rt.client, rt.keys, batch.outside_refs, int(time.time() * 1000)) \
        if o.cache_ttl_s > 0 else {}
    unread = [f.msg.key for f in batch.forgets if f.msg.key not in batch.key_state]
    if unread:  # what a forget subtracts is what was recorded for its key
        batch.key_state.update(known_keys(rt.client, rt.keys.learnt_keys, unread))
    content = commit_content(batch, cached, rt.replica.model, rt.featurizer, rt.consumer,
                             cache=o.cache_ttl_s > 0, cache_labelled=o.cache_labelled)
    if content is None:
        return None
    built = Built(content, _request(rt, content, batch.announced))
    rt.labels.stage("learn", time.perf_counter() - t0 + prepared_s)
    return built


def _request(rt: ModelRuntime, content: CommitContent, announced: str | None) -> CommitRequest:
    """The commit script's request for ``content`` (``announced``: the batch's
    ``:inflight`` field, deleted by the commit)."""
    add, sub = content.add, content.sub
    log_data = encode_delta(add, sub, content.n_learnt, rt.consumer, uuid.uuid4().hex[:16]) \
        if (add is not None or sub is not None) else None
    writes, registry = [], None
    if content.cache_entries:
        writes, registry = batch_writes(rt.keys, int(rt.options.cache_ttl_s * 1000),
                                        int(time.time() * 1000), content.cache_entries)
    decay_every = rt.config.decay_every
    keys_max = rt.options.learnt_keys_max
    return CommitRequest(
        ids=content.ids, outputs=content.outputs,
        dead=[encode_dead(d.entry_id, d.reason, d.detail, d.data) for d in content.dead],
        log_data=log_data, n_learnt=content.n_learnt, cache_writes=writes,
        cache_cas=content.resolution.cas, cache_registry=registry, decay_every=decay_every,
        decay_data=encode_decay(rt.config.decay_factor) if decay_every else b"",
        inflight_key=rt.keys.inflight if announced else None, inflight_field=announced,
        key_store=(rt.keys.learnt_keys, rt.keys.key_order)
        if keys_max or content.forget_keys or content.relabel_keys else None,
        learn_keys=content.learn_keys if keys_max else [],
        forget_keys=content.forget_keys, relabel_keys=content.relabel_keys, keys_max=keys_max)


# ---------------------------------------------------------------------- commit, retry
def commit(rt: ModelRuntime, batch: PredictedBatch, built: Built,
           result: CommitResult | None = None) -> None:
    """Commit ``batch`` (``built``; ``result``: the reply of a first attempt already
    sent), rebuilt without the ids another worker claimed meanwhile, or with the cache
    entries read again after one changed; at most ``max_commit_attempts`` times."""
    o = rt.options
    for attempt in range(o.max_commit_attempts):
        if attempt:
            rebuilt = build(rt, batch)
            if rebuilt is None:
                return
            built = rebuilt
        if result is None:
            tc = time.perf_counter()
            result = commit_batch(rt.client, rt.keys, rt.consumer, built.request, o.out_maxlen,
                                  o.dead_maxlen)
            rt.labels.stage("commit", time.perf_counter() - tc)
        if result.ok:
            _committed(rt, batch, built, result)
            return
        if result.lost or result.conflicts:  # (keys learnt before are counted as such)
            rt.labels(rt.metrics.commit_conflicts).inc()
        if result.lost:
            log.info("model %s: %d entries were claimed by another worker; committing the rest",
                     rt.name, len(result.lost))
            batch = batch.without(set(result.lost))
        if result.keys:  # learnt (or forgotten) meanwhile: as they are now, then rebuilt
            batch.key_state.update(known_keys(rt.client, rt.keys.learnt_keys, result.keys))
        result = None  # conflicts: cache entries changed under us; read again and rebuilt
    raise StreamnbError(f"model {rt.name}: commit failed {o.max_commit_attempts} times; "
                        "the batch stays pending")


def _committed(rt: ModelRuntime, batch: PredictedBatch, built: Built, result: CommitResult) -> None:
    """A batch committed: its announcement is gone with it, its delta applied if nothing
    came between (the log, our delta included, is otherwise applied by the next tail),
    and it is counted and scored."""
    if built.request.inflight_key:
        rt.inflight.withdrawn_by_commit(batch.announced)
    apply_own_delta(rt, built.request, result)
    m, labels, content = rt.metrics, rt.labels, built.content
    labels(m.commits).inc()
    labels(m.messages_predicted).inc(len(content.outputs))
    # one inc per class and batch (not per message): the same totals
    for lab, n in Counter(str(lab) for lab in content.learnt_labels).items():
        labels(m.messages_learned, **{"class": lab}).inc(n)
    if content.n_duplicates:
        labels(m.messages_already_learnt).inc(content.n_duplicates)
    for lab, n in Counter(str(lab) for lab in content.forgotten_labels).items():
        labels(m.messages_forgotten, **{"class": lab}).inc(n)
    res = content.resolution
    for lab, n in Counter(str(lab) for lab in res.unlearned).items():
        labels(m.messages_unlearned, **{"class": lab}).inc(n)
    if res.corrections:
        labels(m.corrections).inc(res.corrections)
    for d in content.dead:
        labels(m.dead_letters, reason=d.reason).inc()
    t0 = time.perf_counter()
    if content.scored:  # test-then-train, counted once: only what this commit learnt
        rt.observe(rt.observer.score_labelled, batch.classes,
                   np.vstack([lp for lp, _ in content.scored]), [y for _, y in content.scored])
    if res.delayed:
        classes, mat, truth, delays = delayed_matrix(res.delayed)
        if truth:
            rt.observe(rt.observer.score_delayed, classes, mat, truth, delays)
    labels.stage("score", time.perf_counter() - t0)


def apply_own_delta(rt: ModelRuntime, request: CommitRequest, result: CommitResult) -> None:
    """Apply the commit's delta from the bytes sent, when the log held nothing after the
    replica's version (:meth:`Replica.apply_own`): no read of it back, and for a worker
    alone no tail before the next prediction (``rt.own_applied``)."""
    data = request.log_data
    if not data or not result.delta_id or result.delta_id != result.log_id:
        return  # nothing logged, or decay entries after the delta: the tail applies them
    t0 = time.perf_counter()
    if rt.replica.apply_own(result.delta_id, data, result.prev_id):
        rt.own_applied = True
        rt.labels(rt.metrics.deltas_applied).inc()
        rt.labels.stage("apply", time.perf_counter() - t0)
        rt.version_metric()


# ---------------------------------------------------------------------- pipelined
def send_ahead(rt: ModelRuntime, batch: PredictedBatch, built: Built) -> None:
    """Send this batch's commit without waiting, with the next batch in hand: Redis runs
    the script while the next batch is decoded and featurized.

    The next batch usually came with the previous commit's reply (below). Otherwise it
    is read first, in a round trip of its own: behind the script the read would wait
    for it (Redis answers the commands of one write together); its announcement goes
    in the commit's write, ahead of the script. When the batch in hand is full, the
    one after it is read behind the script, in the same write (a ``MULTI`` of
    workers/store/scripts/read.lua, which announces it, and the read: one step): its entries come with
    the commit's reply, and no read waits on the way (:func:`take_read_ahead`). Not with
    ordered predictions when other workers serve the model (:meth:`ModelRuntime.alone`):
    a batch read that early is committed later, and they would wait for it."""
    o = rt.options
    before: list[list[Any]] = []
    if rt.read_ahead is None and rt.reads_ahead:
        t0 = time.perf_counter()
        got = read_new(rt.reader, rt.consumer, [rt.keys.input], o.batch, block_ms=0)
        entries = [e for _, es in got for e in es]
        if entries:
            rt.labels.stage("read", time.perf_counter() - t0)
            announced = None
            if o.order_wait_ms > 0:
                announced, command = rt.inflight.announcement(first_id(entries), len(entries))
                before.append(command)
            rt.read_ahead = ReadBatch(entries, announced)
    after = []
    if rt.reads_ahead and rt.read_ahead is not None and len(rt.read_ahead.entries) >= o.batch \
            and (o.order_wait_ms == 0 or rt.alone()):
        after += read_commands(rt.keys, rt.consumer, o.batch, o.order_wait_ms > 0)
    sent = send_commit(rt.client, rt.keys, rt.consumer, built.request, o.out_maxlen,
                       o.dead_maxlen, before, after)
    rt.in_flight = InFlight(batch, built, sent)


def take_read_ahead(rt: ModelRuntime, reply: Any) -> None:
    """The batch read behind a commit (:func:`send_ahead`; ``reply``: the reply of the
    read's last command): the next one to process. A failed read reads nothing; a batch
    read whose announcement failed is announced now."""
    announce = rt.options.order_wait_ms > 0
    try:
        field, entries = read_reply(reply, announced=announce)
    except redis.RedisError as exc:
        log.warning("model %s: reading ahead failed: %s", rt.name, exc)
        return
    if field is None and entries and announce:
        # the announcing script failed (not loaded: e.g. Redis restarted): in a round
        # trip of its own, and the script loaded for the next time
        field = rt.inflight.announce(first_id(entries), len(entries))
        READ_SCRIPT.load(rt.client)
    if field is not None:
        rt.inflight.fields.add(field)
    if not entries:
        rt.withdraw(field)
    elif rt.read_ahead is None:
        rt.read_ahead = ReadBatch(entries, field)
    else:  # (not on the worker's path) its entries are this consumer's pending ones
        rt.withdraw(field)
        rt.pending_phase = True


def settle(rt: ModelRuntime) -> bool:
    """Read the reply of the commit on the wire, if any (retrying it if it failed);
    False if there was none."""
    f = rt.in_flight
    if f is None:
        return False
    rt.in_flight = None
    tc = time.perf_counter()
    try:
        result = f.sent.result()
        rt.labels.stage("commit", time.perf_counter() - tc)
        if f.sent.after:  # the read behind the commit
            take_read_ahead(rt, f.sent.after[-1])
        commit(rt, f.batch, f.built, result)
    finally:
        rt.withdraw(f.batch.announced)  # (a no-op once the commit withdrew it)
    return True


def abandon(rt: ModelRuntime, withdraw: bool = True) -> None:
    """After an error: forget the commit on the wire and the batch read ahead. Their
    entries are this consumer's pending ones, redone from there (``pending_phase``);
    ``withdraw``: delete this consumer's announcements (else they go stale in 10 s)."""
    f, rt.in_flight, rt.read_ahead = rt.in_flight, None, None
    if f is not None:
        f.sent.abandon()
    try:
        rt.inflight.forget(delete=withdraw)
    except redis.RedisError as exc:
        log.warning("model %s: could not withdraw in-flight announcements: %s", rt.name, exc)
