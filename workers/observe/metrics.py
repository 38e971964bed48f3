"""Every Prometheus metric of the daemon, defined in one place.

Namespace ``streamnb``, base units (seconds, bytes), ``_total`` counters. Label sets stay
small: ``model``, ``worker``, ``class``/``predicted``, ``reason``, ``stage``, ``detector``.
A :class:`Metrics` owns one registry's worth of metric families, so tests can build one on a
fresh ``CollectorRegistry``; the daemon uses :func:`default_metrics` (the global registry).

>>> from prometheus_client import CollectorRegistry
>>> reg = CollectorRegistry()
>>> m = Metrics(reg)
>>> m.messages_read.labels(model="mail", worker="w1").inc(3)
>>> reg.get_sample_value("streamnb_messages_read_total", {"model": "mail", "worker": "w1"})
3.0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "streamnb"
MW = ("model", "worker")

#: Stages of the per-batch pipeline timed by ``stage_seconds``.
STAGES = ("read", "decode", "featurize", "predict", "explain", "learn", "send", "commit", "apply",
          "observe", "score")

#: Every reason a worker dead-letters a message with (docs/protocol.md, docs/worker.md):
#: their counters exist at 0 from the start.
DEAD_LETTER_REASONS = ("not_msgpack", "not_a_map", "no_data", "too_large", "no_payload",
                       "several_payloads", "bad_type", "non_finite", "bad_label", "bad_weight",
                       "wrong_dimension", "incompatible_payload", "bad_category", "not_learnt",
                       "poison", "ref_expired", "bad_source", "too_many_sources",
                       "declared_class", "label_not_allowed", "class_holds_weight")
#: The kinds of ``redis_errors`` (workers/worker/loop.py, ``error_kind``).
REDIS_ERROR_KINDS = ("connection", "timeout", "misconf", "readonly", "nogroup", "other")
#: What ``corrupt_records`` counts.
CORRUPT_KINDS = ("snapshot", "log")

# Buckets fitted to this workload: a batch stage takes tens of microseconds to tens of ms.
STAGE_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
AGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60, 300)
SHARE_BUCKETS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
CONFIDENCE_BUCKETS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)
DELAY_BUCKETS = (1, 10, 60, 300, 900, 3600, 4 * 3600, 86400, 7 * 86400)
# The milter's added latency: milliseconds when the workers keep up, up to its deadline.
MILTER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    """All metric families of a worker process, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = {"registry": registry, "namespace": NAMESPACE}
        # ---- throughput and health
        self.messages_read = Counter("messages_read", "Stream entries read from :in", MW, **r)
        self.messages_predicted = Counter(
            "messages_predicted", "Predictions published to :out", MW, **r)
        self.messages_learned = Counter(
            "messages_learned", "Labelled messages learnt (committed deltas)", (*MW, "class"), **r)
        self.messages_unlearned = Counter(
            "messages_unlearned", "Contributions moved by label corrections", (*MW, "class"), **r)
        self.messages_already_learnt = Counter(
            "messages_already_learnt", "Labelled messages predicted but not learnt: their "
            "learn-once key was learnt before", MW, **r)
        self.messages_relearnt = Counter(
            "messages_relearnt", "Labelled messages whose learn-once key was learnt under "
            "another label: the old contribution subtracted, the new label learnt", MW, **r)
        self.messages_autolearnt = Counter(
            "messages_autolearnt", "Unlabelled messages learnt from their own confident "
            "verdict, under the source autolearn (worker --autolearn)", MW, **r)
        self.messages_forgotten = Counter(
            "messages_forgotten", "Messages unlearnt by a forget, by the class they were "
            "learnt as", (*MW, "class"), **r)
        self.dead_letters = Counter(
            "dead_letters", "Messages sent to :dead, by reason", (*MW, "reason"), **r)
        self.unknown_keys = Counter(
            "unknown_keys", "Unknown keys ignored in input messages", MW, **r)
        self.messages_claimed = Counter(
            "messages_claimed", "Entries claimed from idle or dead consumers", MW, **r)
        self.commit_conflicts = Counter(
            "commit_conflicts", "Commits that found some ids no longer owned", MW, **r)
        self.commits = Counter("commits", "Atomic commits of a batch", MW, **r)
        self.order_wait_seconds = Histogram(
            "order_wait_seconds", "Time a batch waited for other workers' earlier labelled "
            "batches to commit before predicting (batches that had to wait)",
            MW, buckets=STAGE_BUCKETS, **r)
        self.order_wait_cpu = Counter(
            "order_wait_cpu_seconds", "CPU time of the worker's thread in those waits (its "
            "polls of :log and :inflight, and the other workers' deltas applied meanwhile)",
            MW, **r)
        self.order_wait_timeouts = Counter(
            "order_wait_timeouts", "Waits for earlier labelled batches that gave up at "
            "order_wait_ms (the batch was predicted without them)", MW, **r)
        self.ordered_section_seconds = Histogram(
            "ordered_section_seconds", "Time per labelled batch taken in stream order across "
            "workers: from the end of its order wait to its commit sent (pipelined) or "
            "committed", MW, buckets=STAGE_BUCKETS, **r)
        self.ordered_section_cpu = Counter(
            "ordered_section_cpu_seconds", "CPU time of the worker's thread inside the "
            "ordered section (streamnb_ordered_section_seconds less the time it was "
            "descheduled or blocked on Redis)", MW, **r)
        self.redis_errors = Counter(
            "redis_errors", "Redis errors by kind (connection, timeout, misconf, readonly, nogroup, "
            "other)", (*MW, "kind"), **r)
        self.reconnects = Counter("redis_reconnects", "Reconnection attempts after an error", MW, **r)
        self.worker_errors = Counter(
            "worker_errors", "Unexpected errors in the worker loop (not Redis being away); the "
            "batch stays pending and is redone", MW, **r)
        self.batch_size = Histogram(
            "batch_size_messages", "Messages per batch read", MW, buckets=BATCH_BUCKETS, **r)
        self.stage_seconds = Histogram(
            "stage_duration_seconds", "Time per batch in each pipeline stage",
            (*MW, "stage"), buckets=STAGE_BUCKETS, **r)
        self.message_age = Histogram(
            "message_age_seconds", "Age of a message when predicted (now - stream id time)",
            MW, buckets=AGE_BUCKETS, **r)
        self.deltas_applied = Counter(
            "log_deltas_applied", "Entries of :log merged into the local model", MW, **r)
        self.model_version = Gauge("model_version_timestamp_seconds", "Time part of the last "
                                   ":log id applied (the model version)", MW, **r)
        self.worker_up = Gauge("worker_up", "1 while the worker loop runs", MW, **r)
        self.redis_up = Gauge(
            "redis_up", "1 while the worker reaches Redis; 0 from a failed round trip until "
            "the next one succeeds", ("worker",), **r)
        self.model_reachable = Gauge(
            "model_reachable", "1 while the worker reaches the Redis node of this model (or "
            "shard); 0 while it waits to reach it again: on a cluster it serves its other "
            "models and shards meanwhile", MW, **r)
        w = ("worker",)  # ---- the replicas held (workers/replication/replica_cache.py)
        self.replicas_held = Gauge("replicas_held", "Model replicas held in memory", w, **r)
        self.replica_bytes = Gauge("replica_bytes", "Bytes of the replicas' arrays", w, **r)
        self.replica_loads = Counter("replica_loads", "Evicted replicas loaded again", w, **r)
        self.replica_evictions = Counter("replica_evictions", "Replicas evicted (LRU)", w, **r)
        self.replica_load_seconds = Histogram("replica_load_seconds", "Time to load a replica", w,
                                              buckets=STAGE_BUCKETS, **r)
        self.log_rewinds = Counter(
            "log_rewinds", "Times :log was found behind this worker's replica (Redis lost "
            "writes the replica had applied: a crash, or a failover to a replica that "
            "lagged); the replica reloaded and the lost messages are learnt again, once", MW, **r)
        self.redis_restores = Counter(
            "redis_restores", "Times this worker wrote a model's config, consumer group or "
            "snapshot back after Redis came back without them (restarted empty)", MW, **r)
        self.heartbeat = Gauge(
            "worker_heartbeat_timestamp_seconds", "Last heartbeat written", MW, **r)
        self.snapshots_written = Counter("snapshots_written", "Snapshots written", MW, **r)
        self.corrupt_records = Counter(
            "corrupt_records", "Unreadable snapshots and :log entries met (kind: snapshot, log); "
            "see docs/reliability.md", (*MW, "kind"), **r)
        # ---- stream gauges, sampled by the lease holder only (label: model, stream)
        self.stream_length = Gauge(
            "stream_length_entries", "XLEN of the model's streams", ("model", "stream"), **r)
        self.group_lag = Gauge(
            "group_lag_entries", "Entries of :in not yet delivered to the group", ("model",), **r)
        self.group_pending = Gauge(
            "group_pending_entries", "Entries delivered but not acknowledged", ("model",), **r)
        self.snapshot_age = Gauge(
            "snapshot_age_seconds", "Age of the stored snapshot", ("model",), **r)
        self.live_workers = Gauge(
            "live_workers", "Workers with a fresh heartbeat", ("model",), **r)
        # ---- quality: test-then-train (prediction made before learning the label)
        self.prequential = Counter(
            "prequential_predictions", "Labelled messages by true and predicted class",
            (*MW, "class", "predicted"), **r)
        self.prequential_correct = Counter(
            "prequential_correct", "Labelled messages predicted right, by true class (the "
            "confusion diagonal, which PromQL cannot select)", (*MW, "class"), **r)
        self.prequential_log_loss = Counter(
            "prequential_log_loss_sum", "Sum of -log P(true class) before learning", MW, **r)
        self.prequential_brier = Counter(
            "prequential_brier_sum", "Sum of Brier scores before learning", MW, **r)
        # ---- quality: delayed labels (prediction at arrival vs label later)
        self.delayed = Counter(
            "delayed_predictions", "Delayed labels by true and predicted-at-arrival class",
            (*MW, "class", "predicted"), **r)
        self.delayed_correct = Counter(
            "delayed_correct", "Delayed labels predicted right at arrival, by true class",
            (*MW, "class"), **r)
        self.delayed_log_loss = Counter(
            "delayed_log_loss_sum", "Sum of -log P(true class) at arrival", MW, **r)
        self.delayed_brier = Counter(
            "delayed_brier_sum", "Sum of Brier scores at arrival", MW, **r)
        self.label_delay = Histogram(
            "label_delay_seconds", "Time from a message to its delayed label", MW,
            buckets=DELAY_BUCKETS, **r)
        self.corrections = Counter(
            "label_corrections", "Labels that changed an already learnt message", MW, **r)
        # ---- model
        self.class_weight = Gauge(
            "model_class_weight", "Learnt (weighted) count per class", ("model", "class"), **r)
        self.features_seen = Gauge(
            "model_features_seen", "Distinct features with a nonzero count", ("model",), **r)
        self.oov_share = Histogram(
            "oov_share", "Share of a message's features never seen by the model", MW,
            buckets=SHARE_BUCKETS, **r)
        self.confidence = Histogram(
            "posterior_confidence", "Largest posterior probability of each prediction", MW,
            buckets=CONFIDENCE_BUCKETS, **r)
        self.unsure = Counter(
            "unsure_predictions",
            "Predictions labelled unsure (unsure band, or a class with too little weight)", MW, **r)
        self.bhattacharyya_distance = Gauge(
            "bhattacharyya_distance", "Bhattacharyya distance between two classes",
            ("model", "class", "other"), **r)
        self.bhattacharyya_bound = Gauge(
            "bhattacharyya_bound", "Bhattacharyya bound on the pairwise Bayes error",
            ("model", "class", "other"), **r)
        # ---- drift
        self.drift_events = Counter(
            "drift_events", "Drift alarms raised (after cool-down)", (*MW, "detector"), **r)
        self.error_rate_recent = Gauge(
            "error_rate_recent", "Recent prequential error rate (ADWIN window mean)", MW, **r)
        self.prior_shift = Gauge(
            "prior_shift_divergence", "Divergence between recent and long-run class shares",
            MW, **r)
        self.feature_drift = Gauge(
            "feature_drift_divergence", "Divergence of recent feature moments from the model's",
            MW, **r)
        self.oov_rate_recent = Gauge(
            "oov_rate_recent", "Recent mean out-of-vocabulary share", MW, **r)
        # ---- operating point (--target-fpr, --calibration)
        self.operating_threshold = Gauge(
            "operating_threshold", "Score threshold in use for --target-fpr (+Inf: none "
            "positive)", MW, **r)
        self.operating_supported = Gauge(
            "operating_point_supported", "1 when the window's negatives support --target-fpr, "
            "0 when too few", MW, **r)
        self.operating_negatives = Gauge(
            "operating_point_negatives", "Labelled negatives (ham) the operating point was "
            "fitted on", MW, **r)
        self.operating_prior = Gauge(
            "operating_prior", "The followed prior P(positive) the calibrated probability "
            "is moved to (--prior-half-life)", MW, **r)
        # ---- challenger (--challenger SPEC; McNemar's b: right="champion", c: "challenger")
        self.challenger_paired = Counter(
            "challenger_paired", "Labelled messages by which of the model (champion) and the "
            "challenger got them right: both, champion, challenger, neither", (*MW, "right"), **r)
        self.challenger_verdicts = Counter(
            "challenger_verdicts", "Labelled messages by side (champion, challenger), true "
            "class and verdict (summed over the workers: each serves its own)",
            ("model", "side", "class", "predicted"), **r)

    def start_series(self, model: str, worker: str) -> None:
        """Create at 0 every series of ``model`` served by ``worker`` whose labels are
        known before the first message: a dashboard or alert then reads 0, not "no data",
        until the first event. The recent estimates (error rate, prior shift, OOV rate) start
        as NaN: not estimated yet. Series by class: :meth:`start_class_series`."""
        mw = {"model": model, "worker": worker}
        for family in (self.messages_read, self.messages_predicted, self.unknown_keys,
                       self.messages_claimed, self.commit_conflicts, self.commits,
                       self.order_wait_seconds, self.order_wait_timeouts, self.reconnects,
                       self.worker_errors, self.batch_size, self.message_age, self.deltas_applied,
                       self.snapshots_written, self.redis_restores, self.prequential_log_loss,
                       self.prequential_brier, self.delayed_log_loss, self.delayed_brier,
                       self.label_delay, self.corrections, self.oov_share, self.confidence,
                       self.unsure, self.messages_already_learnt, self.messages_relearnt,
                       self.messages_autolearnt, self.ordered_section_seconds,
                       self.ordered_section_cpu, self.order_wait_cpu, self.log_rewinds):
            family.labels(**mw)
        for reason in DEAD_LETTER_REASONS:
            self.dead_letters.labels(**mw, reason=reason)
        for kind in REDIS_ERROR_KINDS:
            self.redis_errors.labels(**mw, kind=kind)
        for kind in CORRUPT_KINDS:
            self.corrupt_records.labels(**mw, kind=kind)
        for stage in STAGES:
            self.stage_seconds.labels(**mw, stage=stage)
        for gauge in (self.error_rate_recent, self.prior_shift, self.oov_rate_recent):
            child = gauge.labels(**mw)
            if child._value.get() == 0.0:  # (a restarted model keeps its estimate)
                child.set(float("nan"))

    def start_class_series(self, model: str, worker: str, classes: Sequence[str]) -> None:
        """Create at 0 the series by class (and by true and predicted class) of ``classes``."""
        mw = {"model": model, "worker": worker}
        for c in classes:
            for family in (self.messages_learned, self.messages_unlearned,
                           self.prequential_correct, self.delayed_correct):
                family.labels(**mw, **{"class": c})
            for p in classes:
                for family in (self.prequential, self.delayed):
                    family.labels(**mw, **{"class": c, "predicted": p})


class MilterMetrics:
    """The metric families of ``streamnb milter`` (one process, labels ``model``, ``verdict``,
    ``action``, ``reason``)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = {"registry": registry, "namespace": NAMESPACE}
        self.mails = Counter(
            "milter_mails", "Mails the milter decided, by verdict (not-scored for those "
            "without one) and action (accept, quarantine, reject, tempfail)",
            ("model", "verdict", "action"), **r)
        self.not_scored = Counter(
            "milter_not_scored", "Mails without a verdict, by reason (timeout, "
            "redis-unavailable, untrained, error)", ("model", "reason"), **r)
        self.decision_seconds = Histogram(
            "milter_decision_seconds", "Time from the end of a mail's data to its outcome "
            "(the latency the milter adds to the SMTP transaction)", ("model",),
            buckets=MILTER_BUCKETS, **r)

    def observe(self, model: str, outcome: Any, seconds: float) -> None:
        """Count one outcome (a :class:`streamnb_workers.milter.policy.Outcome`)."""
        verdict = outcome.verdict if outcome.failure is None else "not-scored"
        self.mails.labels(model=model, verdict=verdict, action=outcome.action).inc()
        if outcome.failure is not None:
            self.not_scored.labels(model=model, reason=outcome.failure).inc()
        self.decision_seconds.labels(model=model).observe(seconds)


class ProtocolMetrics:
    """The metric families of ``streamnb spamd`` and ``streamnb rspamd`` (labels
    ``protocol``, ``command``, ``status``: ``ok``, ``not-scored`` or the error answered)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = {"registry": registry, "namespace": NAMESPACE}
        self.requests = Counter(
            "protocol_requests", "Requests answered by the spamd and Rspamd protocol servers, "
            "by command and status", ("protocol", "command", "status"), **r)
        self.seconds = Histogram(
            "protocol_request_seconds", "Time from a request's arrival to its answer",
            ("protocol", "command"), buckets=MILTER_BUCKETS, **r)
        self.users_full = Counter(
            "user_models_full", "Learning for a user that went to the user's domain model or "
            "the global model: the per-user models registered had reached --max-users", **r)

    def observe(self, protocol: str, command: str, status: str, seconds: float) -> None:
        self.requests.labels(protocol=protocol, command=command, status=status).inc()
        self.seconds.labels(protocol=protocol, command=command).observe(seconds)


def observe_many(child: Histogram, values: Sequence[float] | np.ndarray) -> None:
    """``child.observe(v)`` for every value, vectorised (one bucket count per bucket).

    ``child`` is a labelled histogram child. Uses prometheus-client's per-bucket counters
    directly when they are there (they hold non-cumulative counts, as ``observe`` does), else
    falls back to a loop. NaN values are skipped.

    >>> reg = CollectorRegistry()
    >>> h = Histogram("h", "demo", buckets=(1.0, 2.0), registry=reg)
    >>> observe_many(h, [0.5, 1.5, 1.5, 9.0])
    >>> reg.get_sample_value("h_bucket", {"le": "2.0"}), reg.get_sample_value("h_sum")
    (3.0, 12.5)
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    if v.size == 0:
        return
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for x in v.tolist():
            child.observe(x)
        return
    # bucket i holds values with bounds[i-1] < v <= bounds[i] (bounds end with +Inf)
    idx = np.searchsorted(np.asarray(bounds, dtype=np.float64), v, side="left")
    counts = np.bincount(idx, minlength=len(bounds))
    for i in np.flatnonzero(counts).tolist():
        buckets[i].inc(float(counts[i]))
    total.inc(float(v.sum()))


_default: Metrics | None = None


def default_metrics() -> Metrics:
    """The process-wide metrics on prometheus-client's global registry (created once)."""
    global _default
    if _default is None:
        _default = Metrics(REGISTRY)
    return _default
