"""One batch of one model, from its read to its commit, in three steps: take it in
(announce it, decode, featurize, prepare what no other worker's batch changes); land the
previous batch's commit (pipelined) and account for it with that batch's values; then
catch up with the log (after other workers' earlier labelled batches), predict, build and
send the commit, show the observer the predictions.

The steps' values and the work on them are workers/worker/batch.py; the commit's send, reply
and retries are workers/worker/committing.py, what a landed commit is counted and scored
as workers/worker/accounting.py. See docs/worker.md, "One batch".
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from streamnb.exceptions import MalformedMessage
from streamnb_workers.observe.metrics import observe_many
from streamnb_workers.observe.token_names import message_names, message_tokens
from streamnb_workers.replication.challenger import store_promoted
from streamnb_workers.replication.ordering import wait_for_earlier
from streamnb_workers.wire.explanations import add_batch_term, explain_matrix
from streamnb_workers.wire.stream_ids import entry_times, first_id
from streamnb_workers.worker import committing
from streamnb_workers.worker.accounting import account
from streamnb_workers.worker.batch import (
    Decoded,
    Featurized,
    Item,
    Predictions,
    Verdict,
    cache_rows,
    decode_entries,
    drop_bad_categories,
    drop_foreign_labels,
    drop_undeclared_labels,
    featurize,
    own_stats,
    predict,
    prediction_plan,
)
from streamnb_workers.worker.commit_content import PredictedBatch
from streamnb_workers.worker.intake import move_training
from streamnb_workers.worker.learn_weights import known_classes
from streamnb_workers.worker.runtime import ModelRuntime

__all__ = ["Prepared", "Received", "land_previous", "predict_and_commit", "process_batch",
           "take_in"]

log = logging.getLogger("streamnb.worker")


@dataclass(frozen=True, slots=True)
class Prepared:
    """What is made of a batch before the wait for other workers' batches (off the path
    from one worker's commit to the next's): the items' entry ids it was made for, their
    rows stacked, the model's prequential plan (or None), the statistics of the items'
    own labels (without delayed labels in the batch), the cache rows, and the seconds
    its prediction part and its commit part took."""

    entry_ids: list[str]
    X: Any
    plan: Any
    own: tuple[list[str], Any] | None
    row_bytes: dict[str, bytes] | None
    prediction_s: float
    commit_s: float


@dataclass(frozen=True, slots=True)
class Received:
    """A batch taken in: its first entry id, its number of entries, its ``:inflight``
    announcement (None: not announced, or withdrawn as it learns nothing), its entries
    decoded and featurized, what was prepared of it (None without items) and the time it
    was taken in (``time.time()``)."""

    start: str
    n_entries: int
    announced: str | None
    decoded: Decoded
    batch: Featurized
    prepared: Prepared | None
    now: float


def process_batch(rt: ModelRuntime, entries: list, deliveries: dict[str, int] | None = None,
                  announced: str | None = None, may_send_ahead: bool = False) -> int:
    """One batch of ``rt``'s entries, in three steps: taken in (:func:`take_in`), then
    the commit on the wire (the previous batch's) landed and accounted for with that
    batch's values (:func:`land_previous`), then this batch predicted, learnt and
    committed (:func:`predict_and_commit`); returns how many entries there were.

    ``deliveries``: entry id -> times delivered (claimed and pending entries).
    ``announced``: the batch's ``:inflight`` field if it was announced when read.
    ``may_send_ahead``: a full batch's commit may be sent without waiting for its reply
    (:func:`committing.send_ahead`; with ``WorkerOptions.send_ahead``).
    """
    rt.use_replica()  # loaded again if it was evicted (workers/replication/replica_cache.py)
    received = take_in(rt, entries, deliveries, announced)
    sent = False
    try:
        settled, own_applied = land_previous(rt)
        sent = predict_and_commit(rt, received, settled, own_applied, may_send_ahead)
    finally:
        if not sent:  # else the settle of the commit on the wire withdraws it
            rt.withdraw(received.announced)
        if rt.replicas is not None:  # its tables, built by the prediction, counted
            rt.replicas.measure(rt.name)
    return len(entries)


def take_in(rt: ModelRuntime, entries: list, deliveries: dict[str, int] | None,
            announced: str | None) -> Received:
    """Announce (when it was not announced at its read), decode, featurize and prepare a
    batch: what no other worker's batch changes, made before the model is read."""
    o = rt.options
    start = first_id(entries)
    if announced is None and o.order_wait_ms > 0 and entries:
        # entries redelivered (pending or claimed): new ones were announced with their
        # read, in the same step (workers/worker/intake.py read_announced)
        announced = rt.inflight.announce(start, len(entries))
    try:
        now = time.time()
        decoded = decode(rt, entries, deliveries)
        with rt.stage("featurize"):
            if not decoded.labelled:
                rt.withdraw(announced)  # it learns nothing: nobody needs to wait for it
                announced = None
            batch = featurize(rt.featurizer, decoded, names_to_keep(rt, decoded))
            batch = drop_bad_categories(rt.predictor,
                                        drop_undeclared_labels(rt.config.classes, batch))
        prepared = prepare(rt, batch) if batch.items else None
    except BaseException:
        rt.withdraw(announced)
        raise
    return Received(start, len(entries), announced, decoded, batch, prepared, now)


def land_previous(rt: ModelRuntime) -> tuple[bool, bool]:
    """The commit on the wire, if any, lands before anything reads the model, and is
    counted and scored with its own batch's values: (whether one landed, whether it
    applied its own delta)."""
    settled, committed = committing.settle(rt)
    account(rt, committed)
    return settled, committed is not None and committed.own_applied


def predict_and_commit(rt: ModelRuntime, received: Received, settled: bool,
                       own_applied: bool, may_send_ahead: bool = False) -> bool:
    """Catch up with the log, predict the batch taken in, build its commit and commit it
    (or send it ahead), then count token names and show the observer its predictions;
    True if the commit was sent ahead (its announcement is withdrawn when it lands)."""
    o, decoded, prepared, announced = rt.options, received.decoded, received.prepared, \
        received.announced
    batch = received.batch
    # a batch that learns waits for earlier labelled batches too: its delayed labels and
    # forgets resolve against what they leave (cache entries, learn-once records)
    ordered_from = catch_up(rt, received.start, bool(batch.items) or decoded.labelled,
                            settled, own_applied)
    if rt.replica.config is not rt.config:  # a challenger promoted: its config, its rows
        adopt_promoted(rt)
        batch, prepared = drop_bad_categories(rt.predictor, drop_undeclared_labels(
            rt.config.classes, featurize(rt.featurizer, decoded))), None
    with rt.stage("predict") as predicting:
        predicting.add(prepared.prediction_s if prepared else 0.0)
        # after the log tail: it may have brought the model's first classes
        batch = drop_foreign_labels(known_classes(rt.predictor), decoded, batch)
        # predict before learning (test-then-train; prequential within the batch)
        predictions = predict_items(rt, batch, prepared)
    tokens = None
    explaining = rt.stage("explain", summed=True)
    with explaining:
        if predictions is not None and rt.config.explain:
            predictions, tokens = explain_items(rt, batch.items, prepared, predictions)

    predicted = PredictedBatch.of(
        decoded, batch, predictions, rt.replica.version,
        own=own_learnt(rt, batch.items, prepared, predictions),
        row_bytes=prepared.row_bytes if prepared else None, announced=announced,
        learn_once=o.learnt_keys_max > 0)
    if rt.replica.challenger is not None and batch.items:
        with rt.stage("predict"):
            predicted = replace(predicted, challenger=challenge(rt, batch.items))
    built = committing.build(rt, predicted, prepared.commit_s if prepared else 0.0)
    sent = False
    if built is not None:
        if may_send_ahead and o.send_ahead and received.n_entries >= o.batch:
            with rt.stage("send"):
                committing.send_ahead(rt, predicted, built)
            sent = True
        else:
            account(rt, committing.commit(rt, predicted, built))
    if announced is not None and batch.items:
        # a labelled batch, taken in stream order: from the end of its wait to its
        # commit on the wire, what one worker holds every other worker up by
        wall, cpu = ordered_from
        rt.series(rt.metrics.ordered_section_seconds).observe(time.perf_counter() - wall)
        rt.series(rt.metrics.ordered_section_cpu).inc(time.thread_time() - cpu)
    if rt.token_names is not None and batch.items:
        with explaining:
            count_token_names(rt, batch.items, tokens)
    if rt.config.explain or rt.token_names is not None:
        explaining.observe()
    if predictions is not None and predictions.observed:
        with rt.stage("observe"):
            observe_predictions(rt, predictions, received.now)
            if predicted.challenger is not None:
                observe_challenger(rt, predicted)
    if rt.replica.config is not rt.config:  # promoted by this batch's commit
        adopt_promoted(rt)
    return sent


def challenge(rt: ModelRuntime, items: list[Item]) -> list[tuple[Item, Verdict] | None]:
    """The challenger's item and verdict for each item (None: its featurizer refused
    the message), predicted as the model's are: prequential, with its own error weight
    (workers/replication/challenger.py)."""
    ch = rt.replica.challenger
    if ch.featurizer is None:
        mine: list[Item | None] = list(items)
    else:
        rows = ch.featurizer.featurize_batch([it.msg.as_payload() for it in items])
        mine = [None if isinstance(r, MalformedMessage) else replace(it, row=r)
                for it, r in zip(items, rows, strict=True)]
    kept = [it for it in mine if it is not None]
    p = predict(ch.model, ch.rule, ch.featurizer or rt.featurizer, kept,
                rt.options.prequential, None, ch.config.error_weight, None)
    verdicts = iter(p.verdicts)
    return [None if it is None else (it, next(verdicts)) for it in mine]


def observe_challenger(rt: ModelRuntime, p: PredictedBatch) -> None:
    """Count the labelled items' verdicts of the model and its challenger, paired."""
    m = rt.metrics
    for it, v, c in zip(p.items, p.verdicts, p.challenger, strict=True):
        label = it.msg.label
        if label is None or c is None or v.label is None or c[1].label is None:
            continue
        right = (v.label == label, c[1].label == label)
        rt.series(m.challenger_paired, right={(True, True): "both", (True, False): "champion",
                                              (False, True): "challenger",
                                              (False, False): "neither"}[right]).inc()
        for side, verdict in (("champion", v), ("challenger", c[1])):
            m.challenger_verdicts.labels(model=rt.series.model, side=side,
                                         predicted=str(verdict.label),
                                         **{"class": str(label)}).inc()


def adopt_promoted(rt: ModelRuntime) -> None:
    """Serve the config of the challenger the replica promoted (workers/replication/challenger.py)."""
    rt.config = config = rt.replica.config
    rt.featurizer, rt.rule = config.make_featurizer(rt.options.max_bytes), \
        config.make_decision_rule()
    store_promoted(rt.client, rt.keys, config)


def decode(rt: ModelRuntime, entries: list, deliveries: dict[str, int] | None) -> Decoded:
    """The batch's entries decoded (counted: read, batch size, unknown keys)."""
    m, series, o = rt.metrics, rt.series, rt.options
    series(m.messages_read).inc(len(entries))
    series(m.batch_size).observe(len(entries))
    with rt.stage("decode"):
        dense_dim = rt.featurizer.dim if rt.featurizer.input == "dense" else None
        if rt.config.training == "train" and rt.train_token is None:
            rt.train_token = move_training(rt.client, rt.keys, 0, "train")  # (moves none)
        decoded = decode_entries(entries, deliveries, o.max_deliveries, o.limits, dense_dim,
                                 rt.train_token)
        if decoded.unknown_keys:
            series(m.unknown_keys).inc(decoded.unknown_keys)
    return decoded


def prepare(rt: ModelRuntime, batch: Featurized) -> Prepared:
    """What the prediction and the commit need that no other worker's batch changes: the
    rows stacked and the prequential plan; the cache rows and, without delayed labels, the
    batch's own statistics. :func:`predict_items` and :func:`committing.build` use it
    only where it still applies."""
    o, model, items = rt.options, rt.predictor, batch.items
    t0 = time.perf_counter()
    X = rt.featurizer.stack([it.row for it in items])
    plan = prediction_plan(model, X, items) if o.prequential and model.cheap_prequential else None
    t1 = time.perf_counter()
    row_bytes = cache_rows(items, o.cache_labelled) if o.cache_ttl_s > 0 else None
    own = own_stats(model, items, X, plan) if not batch.refs else None
    return Prepared([it.entry_id for it in items], X, plan, own, row_bytes, t1 - t0,
                    time.perf_counter() - t1)


def catch_up(rt: ModelRuntime, start: str, ordered: bool, settled: bool,
             own_applied: bool = False) -> tuple[float, float]:
    """Bring the model up to date before predicting: other workers' earlier labelled
    batches first (ordered predictions; ``ordered``: the batch predicts or learns), then
    the log (batches committed while this one was read and featurized). A worker alone that applied its own delta at the commit
    just settled (``own_applied``: nothing came between) has nothing to catch up with.
    Returns when the wait ended (``time.perf_counter()``, ``time.thread_time()``): the
    start of the batch's ordered section."""
    o = rt.options
    current = ordered and o.order_wait_ms > 0 and await_earlier(rt, start)
    waited = time.perf_counter(), time.thread_time()
    current = current or (own_applied and rt.alone())
    if not current and (settled or (ordered and (o.order_wait_ms > 0 or o.prequential))):
        rt.tail()
    return waited


def await_earlier(rt: ModelRuntime, start: str) -> bool:
    """Wait (at most ``order_wait_ms``) for other workers' labelled batches that start
    before ``start`` to be committed, applying the log as it grows. True if the wait ended
    by applying the log (then the model is current)."""
    cpu0 = time.thread_time()
    res = wait_for_earlier(rt.inflight, start, rt.options.order_wait_ms / 1000.0,
                           lambda batches, block_ms: rt.tail(batches, block_ms))
    if res.waited_for:
        rt.series(rt.metrics.order_wait_seconds).observe(res.seconds)
        rt.series(rt.metrics.order_wait_cpu).inc(time.thread_time() - cpu0)
        if res.timed_out:
            rt.series(rt.metrics.order_wait_timeouts).inc()
            log.info("model %s: waited %.0f ms for %d earlier labelled batch(es) of other "
                     "workers; predicting batch %s without them", rt.name, res.seconds * 1000,
                     res.waited_for, start)
    return res.caught_up


def predict_items(rt: ModelRuntime, batch: Featurized, prepared: Prepared | None,
                  ) -> Predictions | None:
    """The batch's predictions and decisions (None without items)."""
    if not batch.items:
        return None
    prep = (prepared.entry_ids, prepared.X, prepared.plan) if prepared is not None else None
    return predict(rt.predictor, rt.rule, rt.featurizer, batch.items,
                   rt.options.prequential, prep, rt.config.error_weight, rt.replica.scores)


def own_learnt(rt: ModelRuntime, items: list[Item], prepared: Prepared | None,
               predictions: Predictions | None) -> tuple[list[str], Any] | None:
    """The statistics of the items' own labels as their commit learns them: those made
    before the wait where every item keeps its message's weight, else made again of the
    rows and columns prepared with the weights of the verdicts (error weights); None
    where none were made."""
    if prepared is None or prepared.own is None or weights_as_given(items, predictions):
        return prepared.own if prepared is not None else None
    if predictions is None or prepared.entry_ids != [it.entry_id for it in items]:
        return None
    return own_stats(rt.predictor, items, prepared.X, prepared.plan,
                     [v.weight for v in predictions.verdicts])


def weights_as_given(items: list[Item], predictions: Predictions | None) -> bool:
    """Whether every item is learnt with its message's own weight (no error weight), so
    the statistics made before the wait still hold."""
    return predictions is None or all(v.weight == it.msg.weight for v, it in
                                      zip(predictions.verdicts, items, strict=True))


def explain_items(rt: ModelRuntime, items: list[Item], prepared: Prepared | None,
                  predictions: Predictions) -> tuple[Predictions, list[list[str] | None] | None]:
    """With ``--explain K``: each item's explanation in its verdict, and the items'
    tokens (made to name the features; None if the explanations failed, which is logged:
    an explanation must never stop a batch)."""
    try:
        tokens = [message_tokens(rt.featurizer, it.msg) for it in items]
        if prepared is not None and prepared.entry_ids == [it.entry_id for it in items]:
            X = prepared.X
        else:
            X = rt.featurizer.stack([it.row for it in items])
        explained = explain_matrix(rt.predictor, rt.rule, rt.featurizer, X,
                                   rt.config.explain, tokens)
    except Exception:  # noqa: BLE001 - see the docstring
        log.exception("model %s: explaining batch %s failed; its outputs go without",
                      rt.name, items[0].entry_id)
        return predictions, None
    classes = predictions.classes
    verdicts = [v if e is None else
                replace(v, explanation=add_batch_term(e, v.model_log_proba, classes))
                for v, e in zip(predictions.verdicts, explained, strict=True)]
    return replace(predictions, verdicts=verdicts), tokens


def names_to_keep(rt: ModelRuntime, decoded: Decoded) -> list[int]:
    """The items whose tokens :func:`count_token_names` will count (``--token-names``):
    their rows keep the tokens the featurizer makes (positions among the items, as
    :meth:`TokenNames.sample <streamnb_workers.observe.token_names.TokenNames.sample>`
    gives them if no item is dropped; one that is is tokenized again)."""
    names = rt.token_names
    return [] if names is None else names.upcoming(len(decoded.messages))


def count_token_names(rt: ModelRuntime, items: list[Item],
                      tokens: list[list[str] | None] | None) -> None:
    """Count the token names of the sampled items (``--token-names``), with their
    ``tokens`` where :func:`explain_items` made them, else those their rows kept
    (:func:`names_to_keep`); run once the commit is on its way. A failure is logged,
    never raised."""
    names = rt.token_names
    if names is None:
        return
    try:
        for i in names.sample(len(items)):
            if tokens is not None:
                if tokens[i]:
                    names.add(tokens[i])
            elif (kept := items[i].row.tokens) is not None:
                if kept:
                    names.add(list(dict.fromkeys(kept)), distinct=True)
            elif toks := message_names(rt.featurizer, items[i].msg):
                names.add(toks, distinct=True)
    except Exception:  # noqa: BLE001 - counting names must never stop a batch
        log.exception("model %s: counting token names failed", rt.name)


def observe_predictions(rt: ModelRuntime, p: Predictions, now: float) -> None:
    """Message ages and the observer's view of one batch's predictions: run once the
    commit is on its way (off the path from one worker's commit to the next's), with the
    model the batch was predicted with (the log is applied only after)."""
    ages = np.maximum(0.0, now - entry_times([it.entry_id for it in p.observed]))
    observe_many(rt.series(rt.metrics.message_age), ages)
    oov = p.oov_share if p.oov_share is not None else \
        rt.predictor.unseen_share(rt.featurizer.stack([it.row for it in p.observed]))
    rt.observe(rt.observer.observe_predictions, p.classes, p.log_proba, oov, ages, p.unsure)
    if rt.replica.scores is not None:
        point = rt.replica.scores.point
        rt.series(rt.metrics.operating_negatives).set(point.n_negative)
        if point.threshold is not None:
            rt.series(rt.metrics.operating_threshold).set(point.threshold)
            rt.series(rt.metrics.operating_supported).set(1.0 if point.supported else 0.0)
        if rt.replica.scores.prior is not None:
            rt.series(rt.metrics.operating_prior).set(rt.replica.scores.prior)
