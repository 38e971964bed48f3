"""What a predicted batch's commit writes, as values, Redis nowhere: the outputs, the
dead letters, the cache entries and the delta of the labels learnt, given the cache
entries its label-only messages refer to (workers/worker/committing.py reads those and
sends the result).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from streamnb.features import Row
from streamnb_workers.defaults import DEFAULT_MAX_SOURCES
from streamnb_workers.replication.challenger import (
    batch_stats,
    by_teacher,
    cache_part,
    challenger_delta,
    challenger_output,
    challenger_weights,
    recorded_sub,
)
from streamnb_workers.store.label_cache import CachedMessage, encode_entries
from streamnb_workers.wire.learn_keys import (
    decode_record,
    encode_record,
    fresh_records,
    record_teacher,
)
from streamnb_workers.wire.learn_sources import (
    AUTOLEARN,
    DEFAULT_SOURCE,
    Teacher,
    is_stale,
    teacher_of,
)
from streamnb_workers.wire.outputs import verdict_output
from streamnb_workers.wire.stream_ids import entry_times, parse_id, stream_ranks
from streamnb_workers.worker.batch import Dead, Decoded, Featurized, Item, Predictions, Verdict
from streamnb_workers.worker.labels import REF_EXPIRED, LabelRef, Resolution, replaces, resolve_refs
from streamnb_workers.worker.learn_weights import AutolearnPolicy, autolearn_key, autolearnt

__all__ = ["ALREADY_LEARNT", "AUTOLEARNT", "NOT_LEARNT_KEY", "RELEARNT", "TOO_MANY_SOURCES", "CommitContent", "PredictedBatch",
           "batch_stats", "commit_content"]

#: ``reason`` of a labelled message's output when its key was learnt before, with its label.
ALREADY_LEARNT = "already_learnt"
#: ``reason`` of a labelled message's output when its key was learnt before under another
#: label: what was recorded for the key is subtracted and the new label learnt (the
#: output's ``was`` is the label recorded before).
RELEARNT = "relearnt"
#: Dead-letter reason of a forget whose key is not (or no longer) learnt.
NOT_LEARNT_KEY = "not_learnt"
#: ``reason`` of an unlabelled message's output when it was learnt from its own verdict.
AUTOLEARNT = "autolearnt"
#: Dead-letter reason of a label from a new source when the model holds the most sources.
TOO_MANY_SOURCES = "too_many_sources"


@dataclass(frozen=True, slots=True)
class PredictedBatch:
    """What a batch's commit is built from (and rebuilt from, without the entries another
    worker claimed meanwhile): every entry id in the order read, the items and their
    verdicts, the label-only messages, the dead letters so far, the model version of the
    predictions, the classes of the verdicts' model log posteriors, the statistics of the
    items' own labels made before the wait for other workers (their entry ids and the
    statistics, or None), the cache rows made then (entry id -> bytes), and the batch's
    announcement, which its commit deletes."""

    order: list[str]
    items: list[Item]
    verdicts: list[Verdict]
    refs: list[LabelRef]
    ref_data: dict[str, bytes]
    dead: list[Dead]
    version: str
    classes: list[Any]
    own: tuple[list[str], Any] | None = None
    row_bytes: dict[str, bytes] | None = None
    #: The batch's ``:inflight`` announcement (None: not announced, or withdrawn).
    announced: str | None = None
    #: The forgets (featurized, not predicted).
    forgets: list[Item] = field(default_factory=list)
    #: Learn-once key -> its record in ``{M}:keys`` as last read (None: not learnt); a key
    #: not in it is taken as not learnt, which the commit script checks
    #: (workers/worker/committing.py fills it in).
    key_state: dict[str, bytes | None] = field(default_factory=dict)
    #: Whether a labelled message is learnt once per key (False: every time it comes).
    learn_once: bool = True
    #: The class removals ``(entry id, class, bytes)``, in stream order.
    class_drops: list[tuple[str, Any, bytes]] = field(default_factory=list)
    #: With a challenger: its item (its row) and verdict per item (None: not predicted).
    challenger: list[tuple[Item, Verdict] | None] | None = None
    #: The entry ids of the items no delayed label may teach (a model stored with
    #: ``training: train``: they did not come from ``:train``); they are not cached.
    untaught: frozenset[str] = frozenset()

    @classmethod
    def of(cls, decoded: Decoded, batch: Featurized, predictions: Predictions | None,
           version: str, own: tuple[list[str], Any] | None, row_bytes: dict[str, bytes] | None,
           announced: str | None, learn_once: bool) -> PredictedBatch:
        """A batch decoded (``decoded``), featurized (``batch``) and predicted
        (``predictions``; None without items), with the model ``version`` it was
        predicted with and what was made of it before the wait (``own``, ``row_bytes``)."""
        return cls(order=decoded.order, items=batch.items,
                   verdicts=predictions.verdicts if predictions else [], refs=batch.refs,
                   ref_data=batch.ref_data, dead=batch.dead, version=version,
                   classes=predictions.classes if predictions else [], own=own,
                   row_bytes=row_bytes, announced=announced, forgets=batch.forgets,
                   learn_once=learn_once, class_drops=batch.class_drops,
                   untaught=decoded.untaught)

    def without(self, lost: set[str]) -> PredictedBatch:
        """This batch without the entries ``lost``."""
        kept = [i for i, it in enumerate(self.items) if it.entry_id not in lost]
        return replace(self, items=[self.items[i] for i in kept],
                       verdicts=[self.verdicts[i] for i in kept],
                       refs=[r for r in self.refs if r.entry_id not in lost],
                       dead=[d for d in self.dead if d.entry_id not in lost],
                       forgets=[f for f in self.forgets if f.entry_id not in lost],
                       class_drops=[d for d in self.class_drops if d[0] not in lost],
                       challenger=None if self.challenger is None else
                       [self.challenger[i] for i in kept])

    @property
    def outside_refs(self) -> list[str]:
        """The message ids the labels refer to that are not in the batch (in the cache)."""
        if not self.refs:
            return []
        here = {it.msg.id for it in self.items if it.entry_id not in self.untaught}
        return [r.ref for r in self.refs if r.ref not in here]


@dataclass(frozen=True, slots=True)
class CommitContent:
    """What one commit writes, as values: the entry ids it acknowledges (in stream order
    when it can), the outputs, the dead letters (in stream order), the cache entries
    ``(message id, entry)``, the statistics added and subtracted (of the default source's
    current epoch; the other sources' in ``sources``) and the number of messages learnt; and for the worker's metrics and scores: the labels learnt, the
    resolution of the label-only messages, and the items scored against their own label
    (their model log posteriors and their labels)."""

    ids: list[str]
    outputs: list[bytes]
    dead: list[Dead]
    cache_entries: list[tuple[str, bytes]]
    add: Any
    sub: Any
    n_learnt: int
    learnt_labels: list[Any]
    resolution: Resolution
    scored: list[tuple[np.ndarray, Any]]
    #: ``(key, record)`` of each key learnt (checked absent, then recorded) and each key
    #: forgotten (checked to hold that record, then deleted) by the commit.
    learn_keys: list[tuple[str, bytes]] = field(default_factory=list)
    forget_keys: list[tuple[str, bytes]] = field(default_factory=list)
    #: ``(key, record read, new record)`` of learnt keys relearnt under another label
    #: (by a labelled message or a ``ref`` label): checked to hold the record read, then
    #: rewritten.
    relabel_keys: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    #: Labelled messages not learnt because their key was; labels of the forgets.
    n_duplicates: int = 0
    forgotten_labels: list[Any] = field(default_factory=list)
    #: The label recorded before for each labelled message relearnt under a new one.
    relearnt_was: list[Any] = field(default_factory=list)
    #: The default source's epoch (what ``add`` and ``sub`` are of), and ``(teacher, add,
    #: sub)`` of every other teacher, by source name.
    default_epoch: int = 0
    sources: list[tuple[Teacher, Any, Any]] = field(default_factory=list)
    #: Unlabelled messages learnt from their own verdict (``worker --autolearn``).
    n_autolearnt: int = 0
    #: The classes removed, in stream order (after the batch's delta: docs/worker.md).
    drop_classes: list[Any] = field(default_factory=list)
    #: The score codes of the labelled items, in order, for the model's score window.
    score_codes: list[int] = field(default_factory=list)
    #: The challenger's statistics learnt and unlearnt in the batch (None: none).
    challenger_add: Any = None
    challenger_sub: Any = None
    challenger_sources: list[tuple[Teacher, Any, Any]] = field(default_factory=list)


def commit_content(batch: PredictedBatch, cached: dict[str, CachedMessage | None],
                   model: Any, featurizer: Any, worker: str, cache: bool,
                   cache_labelled: bool, epochs: dict[str, int] | None = None,
                   known_sources: Collection[str] = (DEFAULT_SOURCE,),
                   max_sources: int = DEFAULT_MAX_SOURCES,
                   autolearn: AutolearnPolicy | None = None,
                   challenger: Any = None, train_only: bool = False) -> CommitContent | None:
    """What the commit of ``batch`` writes, given the cache entries read for its labels
    (``cached``; an entry whose row does not fit this model is as good as expired);
    None when nothing is left to commit. ``cache``: whether messages are cached at all;
    ``cache_labelled``: also those learnt in their batch. ``epochs``: the current epoch
    of each source (workers/wire/learn_sources.py), as the worker's replica holds them;
    ``known_sources``: the sources it holds parts of; a label from another one, past
    ``max_sources`` of them, is a dead letter. ``autolearn``: learn the confident verdicts
    of unlabelled messages under the source ``autolearn`` (workers/worker/learn_weights.py).
    ``train_only``: the model is stored with ``training: train`` (said in ``ref_expired``)."""
    epochs = epochs or {}
    # (no source named, none forgotten: every row is the default's, as before sources)
    named = any(it.msg.source is not None for it in batch.items) or \
        any(r.source is not None for r in batch.refs)
    if named:
        batch = _within_bound(batch, set(known_sources), max_sources)
    items, verdicts = batch.items, batch.verdicts
    auto = autolearnt(batch.items, batch.verdicts, model, autolearn, set(known_sources),
                      max_sources)
    named = named or bool(auto)
    # (a label teaches a message of its batch unless :in brought it to a training: train model)
    untaught = batch.untaught
    times = {it.msg.id: it.msg.ts or t for it, t in zip(items, entry_times(
        [it.entry_id for it in items]).tolist(), strict=True) if it.entry_id not in untaught}
    batch_labels, batch_preds = ({it.msg.id: it.msg.label for it in items if it.entry_id not in untaught},
                                 {it.msg.id: (v.log_proba, times[it.msg.id]) for it, v in zip(
                                     items, verdicts, strict=True) if it.entry_id not in untaught}
                                 ) if batch.refs else ({}, {})
    # a cached row that does not fit this model (tampered, other config): as expired
    cached = {k: c if c is None or featurizer.fits(c.row) else None for k, c in cached.items()}
    res = resolve_refs(batch.refs, batch_labels, batch_preds, cached, batch.key_state, epochs)
    learnt = [it.msg.label if it.entry_id in batch.untaught else
              res.in_batch.get(it.msg.id, it.msg.label) for it in items]
    default = teacher_of(None, epochs)
    teachers = [teacher_of(res.in_batch_source.get(it.msg.id, it.msg.source), epochs)
                for it in items] if named else [default] * len(items)
    auto = {i: lab for i, lab in auto.items() if learnt[i] is None}  # (no label came for it)
    for i, label in auto.items():
        learnt[i], teachers[i] = label, teacher_of(AUTOLEARN, epochs)
        items[i].msg.key = autolearn_key(items[i].msg)
    # an item's own label is learnt with the weight its verdict gave it (error weight)
    weights = [v.weight if lab is not None and lab == it.msg.label else it.msg.weight
               for it, v, lab in zip(items, verdicts, learnt, strict=True)]
    ch = batch.challenger or [None] * len(items)
    ch_weights = challenger_weights(items, learnt, ch, auto) if challenger is not None \
        else [None] * len(items)
    once = _learn_once(items, learnt, weights, teachers, batch.forgets, batch.key_state,
                       res.key_relabels, batch.learn_once, epochs, ch_weights)
    duplicate = once.duplicate
    for i in [i for i in auto if duplicate[i]]:  # its key is learnt: it stays unlabelled
        duplicate[i], learnt[i] = False, None
        del auto[i]
    learnt = [None if dup else lab for lab, dup in zip(learnt, duplicate, strict=True)]
    add_rows = [(it.row, lab, w, t) for it, lab, w, t in
                zip(items, learnt, weights, teachers, strict=True) if lab is not None]
    n_learnt = len(add_rows) - len(once.was) + res.n_learnt  # (a relearnt one was counted)
    add_rows += res.adds
    adds = by_teacher(add_rows) if named or epochs else {default: add_rows}
    subs = by_teacher(res.subs + once.subs)
    if batch.own is not None and not res.adds and set(adds) <= {default} and \
            batch.own[0] == [it.entry_id for it, lab in zip(items, learnt, strict=True)
                             if lab is not None]:
        add = batch.own[1]  # made before the wait for other workers: the same rows
    else:
        add = batch_stats(model, featurizer, adds.get(default, []))
    sub = batch_stats(model, featurizer, subs.get(default, []))
    sources = [(t, batch_stats(model, featurizer, adds.get(t, [])),
                batch_stats(model, featurizer, subs.get(t, [])))
               for t in sorted((set(adds) | set(subs)) - {default})]
    was = once.was
    outputs = [verdict_output(it.msg, v, batch.version, worker, lab is not None,
                              ALREADY_LEARNT if dup else RELEARNT if i in was else
                              AUTOLEARNT if i in auto else None, was.get(i) if was else None,
                              None if c is None else challenger_output(c[1]))
               for i, (it, v, lab, dup, c) in enumerate(zip(items, verdicts, learnt, duplicate,
                                                            ch, strict=True))]
    why = "never seen, or its cache entry expired" + (
        "" if cache_labelled else "; messages learnt on arrival are not cached: --no-cache-labelled"
    ) + ("; training: train caches only messages moved from :train" if train_only else "")
    dead = batch.dead + [Dead(r.entry_id, REF_EXPIRED, f"no cached message with id {r.ref!r} "
                              f"({why})", batch.ref_data[r.entry_id]) for r in res.expired]
    dead += [Dead(f.entry_id, NOT_LEARNT_KEY, f"key {f.msg.key!r} is not learnt (never, "
                  "forgotten already, or dropped beyond learnt_keys_max): nothing to unlearn",
                  f.data) for f in once.not_learnt]
    dead.sort(key=lambda d: parse_id(d.entry_id))
    entries = []
    recorded = {key for key, _ in once.learn_keys} | {key for key, _, _ in once.relabel_keys}
    if cache:
        row_bytes, untaught, parts = batch.row_bytes or {}, batch.untaught, []
        for it, v, lab, dup, w, t, c, cw in zip(items, verdicts, learnt, duplicate, weights,
                                                teachers, ch, ch_weights, strict=True):
            # (a duplicate is not cached: its entry would say it is unlearnt, and a later
            # label for it would learn it after all; nor is an untaught message: a later
            # label would teach what a writer of :in chose)
            if not dup and (lab is None or cache_labelled) and it.entry_id not in untaught:
                row, msg = row_bytes.get(it.entry_id), it.msg
                parts.append((msg.id, (
                    lab, t, it.row.to_bytes() if row is None else row, v.label, v.log_proba, w,
                    times[msg.id], msg.key if lab is not None and msg.key in recorded else None,
                    None if challenger is None else cache_part(challenger, c, cw))))
        entries = list(zip([p[0] for p in parts], encode_entries([p[1] for p in parts]),
                           strict=True))
    ids = [it.entry_id for it in items] + [d.entry_id for d in batch.dead] + \
        [r.entry_id for r in batch.refs] + [f.entry_id for f in batch.forgets] + \
        [d[0] for d in batch.class_drops]
    if not ids:
        return None
    in_commit = set(ids)
    in_order = [eid for eid in batch.order if eid in in_commit]
    if len(in_order) == len(ids):  # (else as they are: the script checks any order)
        ids = in_order
    # (a duplicate was scored when its key was learnt: once per message)
    scored = [(v.model_log_proba, it.msg.label)
              for it, v, dup in zip(items, verdicts, duplicate, strict=True)
              if it.msg.label is not None and v.model_log_proba is not None and not dup]
    return CommitContent(
        ids=ids, outputs=outputs, dead=dead, cache_entries=entries, add=add, sub=sub,
        n_learnt=n_learnt, learnt_labels=[r[1] for r in add_rows], resolution=res,
        scored=scored, learn_keys=once.learn_keys, forget_keys=once.forget_keys,
        relabel_keys=once.relabel_keys,
        n_duplicates=sum(duplicate), forgotten_labels=once.forgotten_labels,
        n_autolearnt=len(auto),
        relearnt_was=once.relearnt_was, default_epoch=default[1], sources=sources,
        drop_classes=[d[1] for d in batch.class_drops],
        score_codes=[v.code for v in verdicts if v.code is not None],
        **challenger_delta(challenger, featurizer, items, learnt, ch, ch_weights, teachers,
                           res.challenger_adds, res.challenger_subs, once.challenger_subs,
                           default))


def _within_bound(batch: PredictedBatch, known: set[str], max_sources: int) -> PredictedBatch:
    """``batch`` with the labels of sources beyond the ``max_sources`` first (in stream
    order, after those ``known``) as dead letters ``too_many_sources``."""
    wanted = [(it.entry_id, it.msg.source) for it in batch.items if it.msg.label is not None]
    wanted += [(r.entry_id, r.source) for r in batch.refs]
    if all(src is None or src in known for _, src in wanted):
        return batch
    over: set[str] = set()
    for eid, src in sorted(wanted, key=lambda w: parse_id(w[0])):
        if src is None or src in known:
            continue
        if len(known) < max_sources:
            known.add(src)
        else:
            over.add(eid)
    if not over:
        return batch
    detail = (f"the model holds {max_sources} sources, the most --max-sources allows; "
              "forget one (streamnb forget --source) or raise the bound")
    dead = [Dead(it.entry_id, TOO_MANY_SOURCES, f"source {it.msg.source!r}: {detail}", it.data)
            for it in batch.items if it.entry_id in over]
    dead += [Dead(r.entry_id, TOO_MANY_SOURCES, f"source {r.source!r}: {detail}",
                  batch.ref_data[r.entry_id]) for r in batch.refs if r.entry_id in over]
    kept = batch.without(over)
    return replace(kept, dead=kept.dead + dead)


@dataclass(slots=True)
class _LearnOnce:
    """What learn-once keys make of a batch's labelled items and forgets: the keys learnt
    (absent before), relearnt (record read, new record) and forgotten (record read), which
    items are duplicates, the label recorded before of each item relearnt (by its index),
    the rows relearning and forgetting subtract (the message's own row, with the label and
    weight recorded before), the labels of the forgets, and the forgets whose key is not
    learnt."""

    learn_keys: list[tuple[str, bytes]] = field(default_factory=list)
    relabel_keys: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    forget_keys: list[tuple[str, bytes]] = field(default_factory=list)
    duplicate: list[bool] = field(default_factory=list)
    was: dict[int, Any] = field(default_factory=dict)
    subs: list[tuple[Row, Any, float, Teacher]] = field(default_factory=list)
    #: The challenger's of ``subs``: the item, the label and its weight recorded.
    challenger_subs: list[tuple[Any, Any, float, Teacher]] = field(default_factory=list)
    forgotten_labels: list[Any] = field(default_factory=list)
    not_learnt: list[Item] = field(default_factory=list)

    @property
    def relearnt_was(self) -> list[Any]:
        return list(self.was.values())


def _learn_once(items: Sequence[Item], learnt: Sequence[Any], weights: Sequence[float],
                teachers: Sequence[Teacher], forgets: Sequence[Item],
                key_state: dict[str, bytes | None],
                relabelled: Sequence[tuple[str, bytes, bytes]] = (),
                learn_once: bool = True, epochs: dict[str, int] | None = None,
                ch_weights: Sequence[float | None] | None = None) -> _LearnOnce:
    """Learn-once keys applied to the labelled items (with ``learn_once``) and the forgets
    in stream order, from ``key_state`` and the ``ref`` corrections ``relabelled`` (``(key,
    record read, new record)``, applied first):

    - an item whose key is not learnt is learnt and its key recorded (label and weight);
    - one whose key is learnt with its label is a duplicate;
    - one whose key is learnt with another label is relearnt: its row with the label and
      weight recorded is subtracted, its label learnt, the key's record rewritten;
    - a forget subtracts its row with what its key records and deletes the key; a forget
      whose key is not learnt (never, or forgotten before) unlearns nothing;
    - a key recorded under a teacher whose source was forgotten since is not learnt;
    - one learnt by autolearn with an item's label is moved to the item's source;
    - with a challenger, a record holds its weight (``ch_weights``) too.
    """
    epochs = epochs or {}
    out = _LearnOnce(duplicate=[False] * len(items))
    # key -> (record before the batch, None if absent; record now, None if absent)
    state: dict[str, tuple[bytes | None, bytes | None]] = {
        key: (before, new) for key, before, new in relabelled}
    by_id: dict[str, tuple[int, Item]] = {it.entry_id: (i, it) for i, (it, lab) in
                                          enumerate(zip(items, learnt, strict=True))
                                          if learn_once and lab is not None and it.msg.key}
    by_id.update((f.entry_id, (-1, f)) for f in forgets)
    events = [by_id[eid] for eid in stream_ranks(list(by_id))]  # (in stream order)
    fresh = None if relabelled or forgets or any(ch_weights or ()) else fresh_records(
        [it.msg.key for _, it in events], [learnt[i] for i, _ in events],
        [weights[i] for i, _ in events], [teachers[i] for i, _ in events], key_state)
    if fresh is not None:  # (every key new: each learnt and recorded)
        return replace(out, learn_keys=fresh)
    for i, it in events:
        key: str = it.msg.key  # type: ignore[assignment]
        before, now = state[key] if key in state else (key_state.get(key),) * 2
        if now is not None and is_stale(record_teacher(now), epochs):
            now = None  # taught by a source forgotten since: its contribution is gone
        if i < 0:  # a forget
            if now is None:
                out.not_learnt.append(it)
                continue
            label, weight = decode_record(now)
            out.subs.append((it.row, label, weight, record_teacher(now)))
            recorded_sub(out.challenger_subs, it, label, now)
            out.forgotten_labels.append(label)
            state[key] = (before, None)
            continue
        lab = learnt[i]
        if now is not None:
            old, old_weight = decode_record(now)
            old_teacher = record_teacher(now)
            if teachers[i][0] == AUTOLEARN or (  # (autolearn never relearns a learnt key)
                    old == lab and type(old) is type(lab) and not replaces(old_teacher, teachers[i])):
                out.duplicate[i] = True
                continue
            out.was[i] = old
            out.subs.append((it.row, old, old_weight, old_teacher))
            recorded_sub(out.challenger_subs, it, old, now)
        state[key] = (before, encode_record(lab, weights[i], teachers[i],
                                            None if ch_weights is None else ch_weights[i]))
    for key, (before, now) in state.items():
        if before is None and now is not None:
            out.learn_keys.append((key, now))
        elif before is not None and now is not None:
            out.relabel_keys.append((key, bytes(before), now))
        elif before is not None:
            out.forget_keys.append((key, bytes(before)))
    return out

