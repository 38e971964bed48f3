"""Delayed labels and corrections, through the feature cache in Redis.

Every message with a payload is cached for ``cache_ttl_s`` (workers/store/label_cache.py: its
row, the prediction made at arrival, the label learnt for it, its weight and time). A later
message ``{"ref": id, "label": L}`` then:

- learns the cached row with L if it was not learnt yet (a *delayed label*; the prediction
  at arrival and L are reported for accuracy),
- does nothing if it was learnt with L already (a repeated label is a no-op),
- moves its contribution from the old label to L if it was learnt with another label
  (a *correction*: the delta's ``sub`` part removes the row from the old class, ``add``
  puts it in the new one),
- goes to ``:dead`` with reason ``ref_expired`` if the cache has no such id.

The learnt label changes in the commit script by a compare-and-set of the message's cache
entry, so concurrent labels for the same message are applied exactly once each, in commit
order.

>>> enc = encode_label("spam"); decode_label(enc), decode_label(NOT_LEARNT)
('spam', None)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamnb.features import Row
from streamnb_workers.store.commit import CacheCas
from streamnb_workers.store.label_cache import (
    NOT_LEARNT,
    CachedMessage,
    decode_label,
    encode_label,
    label_change,
)
from streamnb_workers.wire.learn_keys import (
    decode_record,
    encode_record,
    record_challenger_weight,
    record_teacher,
)
from streamnb_workers.wire.learn_sources import AUTOLEARN, Teacher, is_stale, teacher_of

__all__ = ["NOT_LEARNT", "REF_EXPIRED", "LabelRef", "Resolution", "decode_label",
           "delayed_matrix", "encode_label", "replaces", "resolve_refs"]

#: Dead-letter reason of a label whose message is not (or no longer) cached.
REF_EXPIRED = "ref_expired"


@dataclass(slots=True)
class LabelRef:
    """A label-only message: ``label`` for the earlier message ``ref``."""

    entry_id: str
    ref: str
    label: Any
    ts: float
    #: The source it teaches under (None: the default one).
    source: str | None = None


@dataclass
class Resolution:
    """What a batch's label-only messages do (see :func:`resolve_refs`)."""

    adds: list[tuple[Row, Any, float, Teacher]] = field(default_factory=list)
    subs: list[tuple[Row, Any, float, Teacher]] = field(default_factory=list)
    cas: list[CacheCas] = field(default_factory=list)
    expired: list[LabelRef] = field(default_factory=list)
    #: in-batch message id -> the label it is finally learnt with, and by whom
    in_batch: dict[str, Any] = field(default_factory=dict)
    in_batch_source: dict[str, str | None] = field(default_factory=dict)
    #: (prediction at arrival, label, delay in seconds) of first labels
    delayed: list[tuple[dict[Any, float], Any, float]] = field(default_factory=list)
    n_learnt: int = 0
    corrections: int = 0
    unlearned: list[Any] = field(default_factory=list)
    #: ``(learn-once key, record read, new record)`` of the corrected messages whose key
    #: is recorded: the commit checks the record read is still there, then rewrites it.
    key_relabels: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    #: With a challenger: its ``(row, label, weight, teacher)`` of ``adds`` and ``subs``,
    #: for the cached messages that hold its row and weight (workers/replication/challenger.py).
    challenger_adds: list[tuple[Row, Any, float, Teacher]] = field(default_factory=list)
    challenger_subs: list[tuple[Row, Any, float, Teacher]] = field(default_factory=list)


def resolve_refs(refs: Sequence[LabelRef],
                 batch_labels: dict[str, Any], batch_preds: dict[str, tuple[dict, float]],
                 cached: dict[str, CachedMessage | None],
                 key_state: dict[str, bytes | None] | None = None,
                 epochs: dict[str, int] | None = None) -> Resolution:
    """Net effect of a batch's label-only messages, applied in order.

    ``batch_labels``: id -> own label (or None) of the payload messages of this same batch
    (a label may refer to one of them); ``batch_preds``: id -> (log_proba map, ts) of those;
    ``cached``: the cache entries read for the other refs. Several labels for one message
    in one batch collapse to one net change from the label it had to the last one given.
    ``key_state``: learn-once key -> its record (workers/wire/learn_keys.py); a cached
    message learnt under a key that is recorded has the label and weight of the record
    (a labelled message with the same key may have relearnt it since it was cached), and
    its correction rewrites the record, compared-and-set. ``epochs``: the current epoch
    of each source (workers/wire/learn_sources.py): what a source forgotten since taught
    counts as not learnt. A label is learnt under its own source; a correction takes the
    old label's contribution off the source that taught it.
    """
    key_state = key_state or {}
    epochs = epochs or {}
    res = Resolution()
    first: dict[str, tuple[Any, float, Teacher]] = {}  # ref -> learnt before this batch
    final: dict[str, tuple[Any, Teacher]] = {}
    for r in refs:
        if r.ref in batch_labels:
            before = res.in_batch.get(r.ref, batch_labels[r.ref])
            if before is None:
                lp, ts = batch_preds[r.ref]
                res.delayed.append((lp, r.label, max(0.0, r.ts - ts)))
            res.in_batch[r.ref] = r.label
            res.in_batch_source[r.ref] = r.source
            continue
        c = cached.get(r.ref)
        if c is None:
            res.expired.append(r)
            continue
        if r.ref not in first:
            first[r.ref] = _learnt_before(c, key_state, epochs)
        current = final[r.ref][0] if r.ref in final else first[r.ref][0]
        if current is None:
            res.delayed.append((c.log_proba, r.label, max(0.0, r.ts - c.ts)))
        final[r.ref] = (r.label, teacher_of(r.source, epochs))
    for ref, (new, teacher) in final.items():
        old, weight, old_teacher = first[ref]
        if new == old and type(new) is type(old) and not replaces(old_teacher, teacher):
            continue
        c = cached[ref]
        assert c is not None
        record = key_state.get(c.learn_key) if c.learn_key is not None else None
        ch = _challenger_part(c, record)
        if old is None:
            res.n_learnt += 1
        else:
            res.subs.append((c.row, old, weight, old_teacher))
            if ch is not None:
                res.challenger_subs.append((ch[0], old, ch[1], old_teacher))
            if new != old or type(new) is not type(old):
                res.corrections += 1
                res.unlearned.append(old)
        if record is not None:
            res.key_relabels.append((c.learn_key, bytes(record), encode_record(
                new, weight, teacher, None if ch is None else ch[1])))
        res.adds.append((c.row, new, weight, teacher))
        if ch is not None:
            res.challenger_adds.append((ch[0], new, ch[1], teacher))
        res.cas.append(label_change(c, new, teacher))
    return res


def _challenger_part(c: CachedMessage, record: bytes | None) -> tuple[Row, float] | None:
    """The challenger's row and weight of a cached message (None: it was cached without
    them). Its key's record, if any, says the weight (as for the model's)."""
    if c.challenger is None:
        return None
    weight = c.challenger[1] if record is None else record_challenger_weight(record)
    if weight is None:
        return None
    return (c.row if c.challenger[0] is None else c.challenger[0]), weight


def replaces(old: Teacher, new: Teacher) -> bool:
    """True if a label from ``new`` replaces the same label learnt from ``old``: a
    user's label wins over what autolearn learnt (its contribution is moved, not added
    to)."""
    return old[0] == AUTOLEARN and new[0] != AUTOLEARN


def _learnt_before(c: CachedMessage, key_state: dict[str, bytes | None],
                   epochs: dict[str, int]) -> tuple[Any, float, Teacher]:
    """The label, weight and teacher a cached message is learnt with (label None: not
    learnt, or learnt from a source forgotten since). The record of its learn-once key,
    if any, wins over its cache entry (a labelled message with the same key may have
    relearnt it since it was cached)."""
    record = key_state.get(c.learn_key) if c.learn_key is not None else None
    if record is None:
        label, weight, teacher = c.learnt, c.weight, c.teacher
    else:
        (label, weight), teacher = decode_record(record), record_teacher(record)
    if label is not None and is_stale(teacher, epochs):
        label = None
    return label, weight, teacher


def delayed_matrix(delayed: Sequence[tuple[dict[Any, float], Any, float]]
                   ) -> tuple[list[Any], np.ndarray, list[Any], np.ndarray]:
    """(classes, log_proba (n, k) with -inf for classes a prediction lacked, true labels,
    delays) of the delayed labels whose message had a prediction at arrival."""
    rows = [(lp, lab, d) for lp, lab, d in delayed if lp]
    classes: list[Any] = []
    for lp, _, _ in rows:
        for k in lp:
            if k not in classes:
                classes.append(k)
    mat = np.full((len(rows), len(classes)), -math.inf)
    for i, (lp, _, _) in enumerate(rows):
        for j, k in enumerate(classes):
            if k in lp:
                mat[i, j] = lp[k]
    return classes, mat, [lab for _, lab, _ in rows], np.array([d for _, _, d in rows], dtype=float)
