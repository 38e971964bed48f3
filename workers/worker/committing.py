"""A batch's commit from its content to its reply: built (:func:`build`), committed at
once (:func:`commit`) or sent without waiting while the next batch is decoded
(:func:`send_ahead`, then :func:`settle`), retried after lost ids or changed cache
entries; once it lands, its announcement is gone and the worker's own delta applied
(what it is counted and scored as: workers/worker/accounting.py, called by whoever
commits or settles it).

Pipelined commits (``WorkerOptions.send_ahead``): after building the commit of a full
batch, the worker sends it on a connection of its own, with the next batch in hand (read
first if it was not read behind the previous commit), decodes and featurizes that batch
while Redis runs the script, and reads the reply (:func:`settle`) before it predicts it,
so the predictions and what is learnt are those of one batch after the other. When the
batch in hand is full and the worker is alone on the model, the batch after it is read
behind the script, in the same write (:meth:`ModelRuntime.reads_for_commit`): its
entries come with the commit's reply. See docs/worker.md, "Pipelined commits".
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

import msgpack
import redis

from streamnb.exceptions import StreamnbError
from streamnb_workers.replication.challenger import Promotion
from streamnb_workers.replication.log_entries import SourceForget
from streamnb_workers.replication.replica import encode_class_drop, encode_decay, encode_delta
from streamnb_workers.store.commit import (
    CommitRequest,
    CommitResult,
    commit_batch,
)
from streamnb_workers.store.keys import source_epochs_key
from streamnb_workers.store.label_cache import batch_writes, fetch_cached
from streamnb_workers.wire.learn_keys import known_keys, record_prefix
from streamnb_workers.wire.learn_sources import DEFAULT_SOURCE
from streamnb_workers.wire.outputs import encode_dead
from streamnb_workers.worker.batch import Dead
from streamnb_workers.worker.commit_content import CommitContent, PredictedBatch, commit_content
from streamnb_workers.worker.commit_wire import Built
from streamnb_workers.worker.learn_weights import AutolearnPolicy
from streamnb_workers.worker.runtime import ModelRuntime

__all__ = ["CLASS_HOLDS_WEIGHT", "Committed", "abandon", "build", "commit",
           "refuse_unforced_removals", "send_ahead", "settle"]

#: Dead-letter reason of a class removal sent with ``force: false`` for a class with weight.
CLASS_HOLDS_WEIGHT = "class_holds_weight"

log = logging.getLogger("streamnb.worker")


@dataclass(frozen=True, slots=True)
class Committed:
    """A batch's commit that landed: the batch as committed (without the entries other
    workers claimed meanwhile), the commit as built, its reply, and whether the worker
    applied its own delta from the bytes it sent (nothing came between)."""

    batch: PredictedBatch
    built: Built
    result: CommitResult
    own_applied: bool


# ---------------------------------------------------------------------- build
def build(rt: ModelRuntime, batch: PredictedBatch, prepared_s: float = 0.0) -> Built | None:
    """Read the cache entries the batch's labels refer to and build its commit; None if
    nothing is left to commit (every entry was lost). ``prepared_s``: seconds spent on it
    before the wait for other workers, counted in the ``learn`` stage with the rest."""
    o = rt.options
    with rt.stage("learn") as learn:
        learn.add(prepared_s)
        cached = fetch_cached(rt.client, rt.keys, batch.outside_refs,
                              int(time.time() * 1000)) if o.cache_ttl_s > 0 else {}
        # what a forget subtracts, and a correction moves, is what was recorded for its key
        unread = [f.msg.key for f in batch.forgets if f.msg.key not in batch.key_state]
        unread += [c.learn_key for c in cached.values() if c is not None and
                   c.learn_key is not None and c.learn_key not in batch.key_state]
        if unread:
            batch.key_state.update(known_keys(rt.client, rt.keys.learnt_keys,
                                              list(dict.fromkeys(unread))))
        batch = refuse_unforced_removals(batch, rt.replica.model)
        content = commit_content(batch, cached, rt.replica.model, rt.featurizer, rt.consumer,
                                 cache=o.cache_ttl_s > 0, cache_labelled=o.cache_labelled,
                                 epochs=rt.replica.epochs,
                                 known_sources=set(rt.replica.sources.parts) or {DEFAULT_SOURCE},
                                 max_sources=o.max_sources,
                                 autolearn=AutolearnPolicy(o.autolearn_score,
                                                           o.autolearn_min_class_weight,
                                                           o.autolearn_per_batch)
                                 if o.autolearn else None,
                                 challenger=rt.replica.challenger,
                                 train_only=rt.config.training == "train")
        if content is None:
            learn.cancel()
            return None
        return Built(content, _request(rt, content, batch.announced))


def refuse_unforced_removals(batch: PredictedBatch, model: Any) -> PredictedBatch:
    """``batch`` with each class removal sent with ``force: false`` whose class ``model``
    holds with weight made a dead letter ``class_holds_weight`` (``streamnb forget
    --class`` as a user that cannot read the model leaves that check to the workers)."""
    unforced = [d for d in batch.class_drops if not isinstance(d[1], (Promotion, SourceForget))
                and msgpack.unpackb(d[2], raw=False).get("force", True) is False]
    if not unforced:
        return batch
    classes = model.stats["classes"]
    weights = {lab: float(w) for lab, w in zip(classes.labels, classes.counts, strict=True)}
    refused = {eid: (label, data) for eid, label, data in unforced if weights.get(label, 0.0) > 0}
    if not refused:
        return batch
    return replace(batch, class_drops=[d for d in batch.class_drops if d[0] not in refused],
                   dead=batch.dead + [Dead(eid, CLASS_HOLDS_WEIGHT, f"class {label!r} holds "
                                           f"weight {weights[label]:g}: send force true to "
                                           "remove it with what was learnt under it", data)
                                      for eid, (label, data) in refused.items()])


def _request(rt: ModelRuntime, content: CommitContent, announced: str | None) -> CommitRequest:
    """The commit script's request for ``content`` (``announced``: the batch's
    ``:inflight`` field, deleted by the commit)."""
    add, sub = content.add, content.sub
    # (an entry with score codes alone too: the window learns every labelled prediction)
    log_data = encode_delta(add, sub, content.n_learnt, rt.consumer, uuid.uuid4().hex[:16],
                            content.default_epoch, content.sources,
                            score_codes=content.score_codes, challenger=content.challenger_add,
                            challenger_sub=content.challenger_sub,
                            challenger_sources=content.challenger_sources) \
        if (add is not None or sub is not None or content.sources or content.score_codes
            or content.challenger_add is not None or content.challenger_sub is not None
            or content.challenger_sources) else None
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
        if keys_max or content.forget_keys or content.relabel_keys or content.drop_classes
        else None,
        learn_keys=content.learn_keys if keys_max else [],
        forget_keys=content.forget_keys, relabel_keys=content.relabel_keys, keys_max=keys_max,
        class_drops=[c.commit_entry() if isinstance(c, (Promotion, SourceForget)) else
                     (encode_class_drop(c), record_prefix(c)) for c in content.drop_classes],
        source_bumps=(source_epochs_key(rt.keys), [c.source for c in content.drop_classes
                                                   if isinstance(c, SourceForget)]))


# ---------------------------------------------------------------------- commit, retry
def commit(rt: ModelRuntime, batch: PredictedBatch, built: Built,
           result: CommitResult | None = None) -> Committed | None:
    """Commit ``batch`` (``built``; ``result``: the reply of a first attempt already
    sent), rebuilt without the ids another worker claimed meanwhile, or with the cache
    entries read again after one changed; at most ``max_commit_attempts`` times. None
    if nothing was left to commit."""
    o = rt.options
    for attempt in range(o.max_commit_attempts):
        if attempt:
            rebuilt = build(rt, batch)
            if rebuilt is None:
                return None
            built = rebuilt
        if result is None:
            with rt.stage("commit"):
                result = commit_batch(rt.client, rt.keys, rt.consumer, built.request,
                                      o.out_maxlen, o.dead_maxlen)
        if result.ok:
            if built.request.inflight_key:  # its announcement is gone with it
                rt.inflight.withdrawn_by_commit(batch.announced)
            return Committed(batch, built, result, apply_own_delta(rt, built.request, result))
        if result.lost or result.conflicts:  # (keys learnt before are counted as such)
            rt.series(rt.metrics.commit_conflicts).inc()
        if result.lost:
            log.info("model %s: %d entries were claimed by another worker; committing the rest",
                     rt.name, len(result.lost))
            batch = batch.without(set(result.lost))
        if result.keys:  # learnt (or forgotten) meanwhile: as they are now, then rebuilt
            batch.key_state.update(known_keys(rt.client, rt.keys.learnt_keys, result.keys))
        result = None  # conflicts: cache entries changed under us; read again and rebuilt
    raise StreamnbError(f"model {rt.name}: commit failed {o.max_commit_attempts} times; "
                        "the batch stays pending")


def apply_own_delta(rt: ModelRuntime, request: CommitRequest, result: CommitResult) -> bool:
    """Apply the commit's delta from the bytes sent, when the log held nothing after the
    replica's version (:meth:`Replica.apply_own`): no read of it back, and for a worker
    alone no tail before the next prediction. Whether it did."""
    data = request.log_data
    if not data or not result.delta_id or result.delta_id != result.log_id:
        return False  # nothing logged, or decay entries after the delta: the tail applies them
    with rt.stage("apply") as apply:
        applied = rt.replica.apply_own(result.delta_id, data, result.prev_id)
        if not applied:
            apply.cancel()
    if applied:
        rt.series(rt.metrics.deltas_applied).inc()
        rt.version_metric()
    return applied


# ---------------------------------------------------------------------- pipelined
def send_ahead(rt: ModelRuntime, batch: PredictedBatch, built: Built) -> None:
    """Send this batch's commit without waiting, with the next batch in hand and the
    reads it carries (:meth:`ModelRuntime.reads_for_commit`): Redis runs the script while
    the next batch is decoded and featurized."""
    rt.wire.send(batch, built, rt.reads_for_commit())


def settle(rt: ModelRuntime) -> tuple[bool, Committed | None]:
    """Read the reply of the commit on the wire, if any (retrying it if it failed):
    whether there was one, and what it committed (None: nothing)."""
    f = rt.wire.take()
    if f is None:
        return False, None
    try:
        with rt.stage("commit"):
            result = f.sent.result()
        if f.sent.after:  # the read behind the commit
            rt.take_read_behind(f.sent.after[-1])
        return True, commit(rt, f.batch, f.built, result)
    finally:
        rt.withdraw(f.batch.announced)  # (a no-op once the commit withdrew it)


def abandon(rt: ModelRuntime, withdraw: bool = True) -> None:
    """After an error: forget the commit on the wire and the batch read ahead. Their
    entries are this consumer's pending ones, redone from there (``pending_phase``);
    ``withdraw``: delete this consumer's announcements (else they go stale in 10 s)."""
    rt.wire.abandon()
    rt.take_read_ahead()
    try:
        rt.inflight.forget(delete=withdraw)
    except redis.RedisError as exc:
        log.warning("model %s: could not withdraw in-flight announcements: %s", rt.name, exc)
