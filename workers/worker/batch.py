"""One batch as pure functions, Redis nowhere: entries -> decoded messages -> featurized
items -> predictions and decisions; then what the commit writes (outputs, dead letters,
cache entries, the delta): workers/worker/commit_content.py.

Each step takes the values the one before gave and returns new ones; the worker
(workers/worker/process.py) runs them in order, with the reads and writes of Redis in between.

>>> import msgpack
>>> from streamnb_workers.store.model_config import ModelSpec, resolve_spec
>>> cfg = resolve_spec(ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 8}))
>>> model, featurizer = cfg.make_model(), cfg.make_featurizer()
>>> entries = [(b"1-0", {b"data": msgpack.packb({"text": "cheap meds", "label": "spam"})}),
...            (b"2-0", {b"data": msgpack.packb({"text": "team meeting", "label": "ham"})}),
...            (b"3-0", {b"data": b"\\xc1"})]
>>> decoded = decode_entries(entries, None, max_deliveries=5)
>>> [d.reason for d in decoded.dead], decoded.labelled
(['not_msgpack'], True)
>>> batch = featurize(featurizer, decoded)
>>> predictions = predict(model, cfg.make_decision_rule(), featurizer, batch.items)
>>> # test-then-train: "spam" known before the second, too little of it to act on
>>> [v.label for v in predictions.verdicts], predictions.verdicts[1].weight
([None, 'unsure'], 1.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamnb.exceptions import MalformedMessage
from streamnb.features import Payload, Row, rows_to_bytes
from streamnb_workers.replication.challenger import Promotion
from streamnb_workers.replication.log_entries import SourceForget
from streamnb_workers.store.training import holds_token
from streamnb_workers.wire.codec import (
    DATA_FIELD,
    DEFAULT_LIMITS,
    InputMessage,
    Limits,
    decode_input,
)
from streamnb_workers.wire.replies import as_str, entry_field
from streamnb_workers.wire.stream_ids import entry_time
from streamnb_workers.worker.labels import LabelRef
from streamnb_workers.worker.learn_weights import (
    class_weight_rows,
    judge_at_operating_point,
    known_class_groups,
    learn_weights,
    learnt_log_prior,
)

__all__ = ["Dead", "Decoded", "Featurized", "Item", "Predictions", "Verdict", "cache_rows",
           "decode_entries", "drop_bad_categories", "drop_foreign_labels",
           "drop_undeclared_labels", "featurize", "own_stats", "predict",
           "prediction_plan"]


# The values made per message (Dead, Item, Verdict) are not frozen only because a frozen
# dataclass takes five times as long to make; nothing changes them once made.
@dataclass(slots=True)
class Dead:
    """An entry for ``:dead``: why, and its original bytes."""

    entry_id: str
    reason: str
    detail: str
    data: bytes


@dataclass(slots=True)
class Item:
    """A decoded, featurized message with a payload."""

    entry_id: str
    msg: InputMessage
    row: Row
    data: bytes


@dataclass(frozen=True, slots=True)
class Decoded:
    """A batch's entries decoded: every entry id in the order read, the messages ``(entry
    id, message, bytes)``, the entries for ``:dead``, the count of unknown keys the
    messages held, and the ``untaught`` entries (:func:`decode_entries`)."""

    order: list[str]
    messages: list[tuple[str, InputMessage, bytes]]
    dead: list[Dead]
    unknown_keys: int
    untaught: frozenset[str] = frozenset()

    @property
    def labelled(self) -> bool:
        """Whether any message holds a label or a forget (else it changes no statistics)."""
        return any(msg.label is not None or msg.forget or msg.forget_class is not None
                   or msg.forget_source is not None for _, msg, _ in self.messages)


@dataclass(frozen=True, slots=True)
class Featurized:
    """A batch's messages with a payload as items, its label-only messages as refs (with
    their bytes), its dead letters so far, its forgets (items that unlearn their key:
    featurized, never predicted) and its class removals ``(entry id, class, bytes)``."""

    items: list[Item]
    refs: list[LabelRef]
    ref_data: dict[str, bytes]
    dead: list[Dead]
    forgets: list[Item] = field(default_factory=list)
    class_drops: list[tuple[str, Any, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class Verdict:
    """One item's decision: the label (None before the model knows a class), the decision
    log posteriors by class, the model's own log posteriors (before the decision rule,
    scored against the item's label once it commits; None if it could not predict), the
    score to rank by (two classes only, else None), the weight the item's own label is
    learnt with (its message's weight, times the error weight if the label was wrong), and
    its explanation if asked for."""

    label: Any
    log_proba: dict[Any, float]
    model_log_proba: np.ndarray | None
    score: float | None = None
    weight: float = 1.0
    #: The output's ``explain`` map (workers/wire/explanations.py), with ``--explain K``.
    explanation: dict[str, Any] | None = None
    #: With a score window: the score threshold in use, the calibrated P(positive) and
    #: the followed prior it was moved to (``--prior-half-life``).
    threshold: float | None = None
    proba: float | None = None
    code: int | None = None  # (its score's code in the window, when it is added to it)
    prior: float | None = None


@dataclass(frozen=True, slots=True)
class Predictions:
    """The verdicts of a batch's items (in their order), the classes in the column order
    of their ``model_log_proba``, and what the observer is shown: the items predicted
    (those with a known class), their decision log posteriors, unsure flags and shares of
    features new to the model where the prediction found them (else None)."""

    verdicts: list[Verdict]
    classes: list[Any]
    observed: list[Item]
    log_proba: np.ndarray
    unsure: np.ndarray
    oov_share: np.ndarray | None = None


# ---------------------------------------------------------------------- decode, featurize
def decode_entries(entries: Sequence[tuple[Any, Any]], deliveries: dict[str, int] | None,
                   max_deliveries: int, limits: Limits = DEFAULT_LIMITS,
                   dense_dim: int | None = None, train_token: str | None = None) -> Decoded:
    """Decode a batch's stream entries ``(id, fields)``; an entry delivered more than
    ``max_deliveries`` times (``deliveries``: id -> times, default once) is poison.
    ``train_token`` (``training: train``): a label, delayed label or forget is taken only
    from an entry moved from ``:train``, with the token (workers/store/training.py), else
    is ``label_not_allowed``; a payload without it is ``untaught`` (never cached)."""
    order: list[str] = []
    untaught: set[str] = set()
    dead: list[Dead] = []
    messages: list[tuple[str, InputMessage, bytes]] = []
    unknown = 0
    for entry_id, fields in entries:
        eid = as_str(entry_id)
        order.append(eid)
        data = entry_field(fields, DATA_FIELD)
        n_deliv = deliveries.get(eid, 1) if deliveries else 1
        if n_deliv > max_deliveries:
            dead.append(Dead(eid, "poison", f"delivered {n_deliv} times, the limit is "
                             f"{max_deliveries}", data or b""))
            continue
        if data is None:
            dead.append(Dead(eid, "no_data", "the entry has no 'data' field", b""))
            continue
        try:
            msg = decode_input(data, eid, limits, expected_dim=dense_dim)
        except MalformedMessage as exc:
            dead.append(Dead(eid, exc.reason, exc.detail, data))
            continue
        if train_token is not None and not holds_token(fields, train_token):
            if msg.is_labelled or msg.forget or msg.payload_kind is None:
                dead.append(Dead(eid, "label_not_allowed", "this model learns labels and "
                                 "forgets only from its training stream :train", data))
                continue
            untaught.add(eid)
        unknown += msg.unknown_keys
        messages.append((eid, msg, data))
    return Decoded(order, messages, dead, unknown, frozenset(untaught))


def featurize(featurizer: Any, decoded: Decoded, keep_tokens: Sequence[int] = ()) -> Featurized:
    """Featurize the messages with a payload; label-only messages become refs. A message
    the featurizer refuses is a dead letter. The rows of the items at ``keep_tokens`` (their
    positions if none is refused) keep their tokens (``Row.tokens``, for the token names)."""
    refs: list[LabelRef] = []
    ref_data: dict[str, bytes] = {}
    payload = []
    drops = []
    for eid, msg, data in decoded.messages:
        if msg.forget_class is not None or msg.promote is not None or msg.forget_source:
            drops.append((eid, SourceForget(msg.forget_source) if msg.forget_source else
                          msg.forget_class if msg.promote is None else Promotion(msg.promote), data))
        elif msg.payload_kind is None:
            refs.append(LabelRef(eid, msg.ref, msg.label, msg.ts or entry_time(eid), msg.source))
            ref_data[eid] = data
        else:
            payload.append((eid, msg, data))
    dead = list(decoded.dead)
    items: list[Item] = []
    forgets: list[Item] = []
    at = [j for j, (_, msg, _) in enumerate(payload) if not msg.forget]  # each item's position
    rows = featurizer.featurize_batch([Payload(msg.payload_kind, msg.payload) for _, msg, _ in payload],
                                      {at[k] for k in keep_tokens if k < len(at)})
    for (eid, msg, data), row in zip(payload, rows, strict=True):
        if isinstance(row, MalformedMessage):
            dead.append(Dead(eid, row.reason, row.detail, data))
        else:
            (forgets if msg.forget else items).append(Item(eid, msg, row, data))
    return Featurized(items, refs, ref_data, dead, forgets, drops)


def drop_foreign_labels(known: Sequence[Any], decoded: Decoded, batch: Featurized,
                        ) -> Featurized:
    """Dead-letter (``bad_label``) every label of another type than the model's classes
    ``known``, or, before the first class, than the batch's first label: one model, one
    label type."""
    first = next((msg.label for _, msg, _ in decoded.messages if msg.label is not None), None)
    if first is None:
        return batch
    want = type(known[0]) if known else type(first)
    candidates = [(it.entry_id, it.msg.label, it.data) for it in batch.items]
    candidates += [(r.entry_id, r.label, batch.ref_data[r.entry_id]) for r in batch.refs]
    foreign = {eid: (label, data) for eid, label, data in candidates
               if label is not None and type(label) is not want}
    if not foreign:
        return batch
    dead = batch.dead + [Dead(eid, "bad_label", f"label {label!r} is {type(label).__name__}, "
                              f"but this model's labels are {want.__name__}", data)
                         for eid, (label, data) in foreign.items()]
    return Featurized([it for it in batch.items if it.entry_id not in foreign],
                      [r for r in batch.refs if r.entry_id not in foreign], batch.ref_data, dead,
                      batch.forgets, batch.class_drops)


def drop_undeclared_labels(classes: Sequence[str] | None, batch: Featurized) -> Featurized:
    """Dead-letter (``bad_label``) every item and delayed label whose label is not one of
    the model's declared ``classes`` (None: any label is a class): a typo must not become
    a class of its own; and (``declared_class``) every removal of a declared class.

    >>> from streamnb_workers.wire.codec import InputMessage
    >>> item = Item("1-0", InputMessage("1-0", "m", "text", "x", label="Spam"), None, b"")
    >>> out = drop_undeclared_labels(["spam", "ham"], Featurized([item], [], {}, []))
    >>> out.items, [(d.reason, d.detail) for d in out.dead]
    ([], [('bad_label', "label 'Spam' is not one of this model's classes: spam, ham")])
    """
    if classes is None:
        return batch
    declared = set(classes)

    def undeclared(label: Any) -> bool:
        return label is not None and (not isinstance(label, str) or label not in declared)

    shown = ", ".join(classes)

    def why(label: Any) -> str:
        return f"label {label!r} is not one of this model's classes: {shown}"

    dead = batch.dead + [Dead(it.entry_id, "bad_label", why(it.msg.label), it.data)
                         for it in batch.items if undeclared(it.msg.label)]
    dead += [Dead(r.entry_id, "bad_label", why(r.label), batch.ref_data[r.entry_id])
             for r in batch.refs if undeclared(r.label)]
    dead += [Dead(eid, "declared_class", f"{label!r} is a declared class of this model "
                  f"({shown}): it is not removed", data)
             for eid, label, data in batch.class_drops if label in declared]
    if len(dead) == len(batch.dead):
        return batch
    return Featurized([it for it in batch.items if not undeclared(it.msg.label)],
                      [r for r in batch.refs if not undeclared(r.label)], batch.ref_data, dead,
                      batch.forgets, [d for d in batch.class_drops if d[1] not in declared])


def drop_bad_categories(model: Any, batch: Featurized) -> Featurized:
    """Dead-letter (``bad_category``) every item whose ``x`` is not a category the model
    takes (a negative, fractional or too large value; a model that is not categorical
    takes any): a value beyond the limit would make the model allocate a column for
    every category up to it."""
    check = getattr(model, "check_categories", None)
    if check is None or not (batch.items or batch.forgets):
        return batch
    dead = list(batch.dead)

    def takes(it: Item) -> bool:
        if it.row.x is None:  # (a sparse row: the model refuses it when it learns)
            return True
        try:
            check(it.row.x[None, :])
        except ValueError as exc:
            dead.append(Dead(it.entry_id, "bad_category", str(exc), it.data))
            return False
        return True

    items = [it for it in batch.items if takes(it)]
    forgets = [it for it in batch.forgets if takes(it)]
    if len(dead) == len(batch.dead):
        return batch
    return Featurized(items, batch.refs, batch.ref_data, dead, forgets, batch.class_drops)


# ---------------------------------------------------------------------- before the wait
def _weights(items: Sequence[Item]) -> np.ndarray:
    return np.array([it.msg.weight for it in items], dtype=np.float64)


def prediction_plan(model: Any, X: Any, items: Sequence[Item]) -> Any:
    """The part of the prequential prediction that depends on the batch alone (the
    model's ``prequential_plan``: for MultinomialNB the validated rows and, without its C
    loop, the sort of the nonzeros and the in-batch prefix sums); None where it cannot be
    made yet (e.g. a label of another type: dropped later, then predicted anew)."""
    try:
        return model.prequential_plan(X, [it.msg.label for it in items], _weights(items))
    except ValueError:
        return None


def own_stats(model: Any, items: Sequence[Item], X: Any, plan: Any = None,
              weights: Sequence[float] | None = None) -> tuple[list[str], Any] | None:
    """The entry ids of the items with a label of their own and their statistics (from
    ``X``, the items' rows stacked, with the columns ``plan`` found in it, and ``weights``,
    else their messages'); None when they cannot be made yet (e.g. a label of another type)."""
    labelled = [i for i, it in enumerate(items) if it.msg.label is not None]
    every, stats = len(labelled) == len(items), None
    kw = {"columns": plan.columns} if every and getattr(plan, "columns", None) else {}
    w = [it.msg.weight for it in items] if weights is None else weights
    if labelled:
        try:
            stats = model.batch_stats(X if every else X[labelled], [items[i].msg.label for i in labelled],
                                      np.array([w[i] for i in labelled], dtype=np.float64), **kw)
        except ValueError:
            return None
    return [items[i].entry_id for i in labelled], stats


def cache_rows(items: Sequence[Item], cache_labelled: bool) -> dict[str, bytes]:
    """The rows of the items the commit caches (all, or only those without a label of
    their own), as the cache stores them: entry id -> bytes."""
    cached = [it for it in items if cache_labelled or it.msg.label is None]
    return {it.entry_id: data
            for it, data in zip(cached, rows_to_bytes([it.row for it in cached]), strict=True)}


# ---------------------------------------------------------------------- predict and decide
def predict(model: Any, rule: Any, featurizer: Any, items: Sequence[Item],
            prequential: bool = True, prepared: tuple[list[str], Any, Any] | None = None,
            error_weight: float = 1.0, window: Any = None) -> Predictions:
    """Predict and decide every item. Prequential (the default, where the model does it
    cheaply): item i is predicted by the model plus the labelled items before it in the
    batch, as one-at-a-time processing would; the model itself is not touched. Else the
    whole batch with the model as it is. ``prepared``: (the entry ids it was made for,
    the items' rows stacked, :func:`prediction_plan` or None), used if the items are
    still those.

    ``error_weight``: an item whose verdict gets its own label wrong is learnt with this
    many times its weight (:attr:`Verdict.weight`), and the items after it in the batch
    are predicted with that weight, as one at a time: the predictions are made again
    from the first item whose weight changed, until no weight changes (each pass fixes
    at least one more item, so at most one pass per wrong verdict, plus one). ``window``:
    the replica's ``ScoreWindow`` (None: off), which judges the two-class verdicts."""
    prequential = prequential and model.cheap_prequential
    if prepared is not None and prepared[0] == [it.entry_id for it in items]:
        X, plan = prepared[1], prepared[2]
    else:  # items were dropped since (labels of another type): stacked again
        X, plan = featurizer.stack([it.row for it in items]), None
    base = weights = _weights(items)
    n_values = np.asarray(X.sum(axis=1), dtype=np.float64).ravel() if len(items) else \
        np.zeros(0)
    while True:
        p = _predict_once(model, rule, X, items, weights, plan if weights is base or plan is None
                          else plan.for_weights(), prequential, n_values)
        if window is not None:
            judge_at_operating_point(window, rule, p.verdicts, items, p.classes)
        learnt = learn_weights(p.verdicts, items, rule, error_weight)
        changed = np.flatnonzero(learnt != weights)
        if not prequential or not changed.size:
            break
        # the predictions up to the first changed item stand (they depend only on the
        # items before it), so the next pass changes only items after it
        weights = learnt
    for v, w in zip(p.verdicts, learnt.tolist(), strict=True):
        v.weight = w
    return p


def _predict_once(model: Any, rule: Any, X: Any, items: Sequence[Item], weights: np.ndarray,
                  plan: Any, prequential: bool, n_values: np.ndarray) -> Predictions:
    """One pass of :func:`predict` with the items' labels learnt with ``weights``."""
    labels = [it.msg.label for it in items]
    n = len(labels)
    oov = None
    if prequential:
        pred = model.predict_log_proba_prequential(X, labels, weights, plan=plan)
        classes, lp, n_known = list(pred.classes), pred.log_proba, pred.n_known
        log_prior, oov = pred.log_prior, pred.unseen_share
    else:  # the whole batch with the model as it was before the batch
        if model.__sklearn_is_fitted__():
            classes = list(model.classes_)
            lp = model.predict_log_proba(X)
        else:
            classes, lp = [], np.zeros((n, 0))
        n_known = np.full(n, len(classes), dtype=np.int64)
        log_prior = np.broadcast_to(learnt_log_prior(model, len(classes)), lp.shape)
    classes = [c.item() if hasattr(c, "item") else c for c in classes]
    # (always: a class with no weight takes no part in the decision nor in the score)
    class_weight = class_weight_rows(model, classes, labels, weights, prequential)
    # Decide rows that knew the same classes together; with a class-prior override the
    # learnt priors differ row by row (prequential), so each row is decided alone.
    dec_lp = np.full(lp.shape, -np.inf)
    unsure = np.zeros(n, dtype=bool)
    verdicts: list[Verdict | None] = [None] * n
    model_rows = list(lp)  # (each row's view, made in one call)
    for rows in known_class_groups(n_known, prequential and rule.class_prior is not None):
        k = int(n_known[rows[0]])
        prior_k = log_prior[rows[0], :k]
        dec = rule.decide(lp[rows, :k], classes[:k],
                          prior_k if np.isfinite(prior_k).any() else None,
                          class_weight[rows, :k])
        dec_lp[rows, :k] = dec.log_proba
        unsure[rows] = dec.unsure
        scores = rule.score_of(dec.log_proba, classes[:k], n_values[rows],
                               class_weight[rows, :k])
        scored = ([None] * len(rows) if scores is None
                  else [None if s != s else s for s in scores.tolist()])  # (nan: no score)
        known = classes[:k]
        for i, label, decided, score in zip(rows, dec.labels, dec.log_proba.tolist(), scored,
                                            strict=True):  # (Python floats)
            verdicts[i] = Verdict(label, dict(zip(known, decided, strict=True)),
                                  model_rows[i], score)
    done = np.flatnonzero(n_known > 0)
    if done.size < n:  # the items predicted before the model knew any class
        verdicts = [v if v is not None else Verdict(None, {}, None) for v in verdicts]
    return Predictions(verdicts, classes, [items[i] for i in done.tolist()], dec_lp[done],
                       unsure[done], None if oov is None else oov[done])

