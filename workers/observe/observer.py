"""Quality, model and drift observations of one model in one worker.

The worker loop calls the four hooks below; this module turns them into the metrics of
:mod:`streamnb_workers.observe.metrics`, runs the drift detectors of :mod:`streamnb.drift` and appends drift
events through the ``events`` callable the worker passes (it XADDs to
``streamnb:{NAME}:events``). Per batch the work is vectorised numpy; the detectors cost
O(1) amortised per message (ADWIN O(log W) per check).

Definitions (docs/observability.md has the PromQL):

- log-loss of a scored message: ``-log P(true class)``, capped at ``LOG_LOSS_CAP``
  (-log 1e-15); a true class the model does not know yet is charged the cap;
- Brier score: ``sum_k (p_k - [k == true])**2`` over the model's classes (plus 1 for an
  unknown true class), in [0, 2] (Brier's original multi-class form; twice the binary
  ``(p - y)**2`` one);
- an error: the predicted class (the arg-max of the posteriors passed in) is not the true one.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from streamnb.drift import ADWIN, GaussianDrift, Moments, PageHinkley, PriorShift, TokenDrift
from streamnb.drift.base import DriftDetector
from streamnb_workers.observe.metrics import Metrics, observe_many

#: Per-sample log-loss is capped at -log(1e-15) (scikit-learn's eps), so one confidently
#: wrong prediction cannot dominate a sum; also the loss charged for an unknown true class.
LOG_LOSS_CAP = 34.538776394910684

#: Seconds during which the observer emits no second event for the same detector.
DRIFT_EVENT_COOLDOWN_S = 60.0

log = logging.getLogger(__name__)

#: Page-Hinkley on the log-loss: each message's loss is clipped at -log(0.01) so that a few
#: confidently wrong predictions (Naive Bayes is overconfident) cannot alarm on their own;
#: no fading (alpha = 1): with fading, 5% confident errors alarmed ~3 times per 100,000.
LOSS_CLIP = -math.log(0.01)
LOSS_DELTA = 0.05
LOSS_THRESHOLD = 100.0
#: Gaussian feature drift from the model's moments: a class is tested once it has at least
#: this many new samples, and changes with a J-divergence below the minimum are ignored.
FEATURE_WINDOW = 50
FEATURE_MIN_DIVERGENCE = 0.1
#: Class pairs for which Bhattacharyya figures are exported (the first classes learnt).
MAX_BHATTACHARYYA_CLASSES = 8


def _plain(value: Any) -> Any:
    """numpy scalars/arrays and nested containers -> msgpack-friendly Python values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def score(classes: Sequence[Any], log_proba: np.ndarray,
          true_labels: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per message: true class row (-1 if unknown), predicted row, log-loss, Brier score.

    >>> lp = np.log(np.array([[0.8, 0.2], [0.4, 0.6]]))
    >>> t, p, loss, brier = score(["ham", "spam"], lp, ["ham", "ham"])
    >>> t.tolist(), p.tolist(), np.round(loss, 4).tolist(), np.round(brier, 4).tolist()
    ([0, 0], [0, 1], [0.2231, 0.9163], [0.08, 0.72])
    """
    lp = np.asarray(log_proba, dtype=np.float64)
    if lp.shape != (len(true_labels), len(classes)):
        raise ValueError(f"log_proba has shape {lp.shape}, but {len(true_labels)} labels and "
                         f"{len(classes)} classes need ({len(true_labels)}, {len(classes)})")
    index = {c: i for i, c in enumerate(classes)}
    rows = list(map(index.get, true_labels))
    if None in rows:                              # by name, else unknown (-1)
        index_str = {str(c): i for i, c in enumerate(classes)}
        rows = [index_str.get(str(y), -1) if k is None else k
                for k, y in zip(rows, true_labels, strict=True)]
    true = np.array(rows, dtype=np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        proba = np.nan_to_num(np.exp(lp), nan=0.0, posinf=0.0)
    bad = proba.sum(axis=1) <= 0
    if bad.any():                                 # no usable posterior: uniform
        proba[bad] = 1.0 / max(len(classes), 1)
    pred = np.argmax(np.where(np.isnan(lp), -np.inf, lp), axis=1) if len(classes) else true * 0
    known = true >= 0
    loss = np.full(true.shape, LOG_LOSS_CAP)
    if known.any():
        rows = np.flatnonzero(known)
        picked = -lp[rows, true[rows]]
        loss[rows] = np.minimum(np.nan_to_num(picked, nan=LOG_LOSS_CAP, posinf=LOG_LOSS_CAP),
                                LOG_LOSS_CAP)
    onehot = np.zeros_like(proba)
    onehot[np.flatnonzero(known), true[known]] = 1.0
    brier = np.sum((proba - onehot) ** 2, axis=1) + (~known).astype(np.float64)
    return true, pred, loss, brier


def _pair_counts(names: list[str], true: np.ndarray,
                 pred: np.ndarray) -> dict[tuple[str, str], int]:
    """``Counter(zip(true names, predicted names))`` of class rows ``true`` and ``pred`` (all
    known), in numpy: the same counts, keys in the order of their first occurrence.

    >>> _pair_counts(["ham", "spam"], np.array([1, 0, 0, 1]), np.array([1, 0, 1, 1]))
    {('spam', 'spam'): 2, ('ham', 'ham'): 1, ('ham', 'spam'): 1}
    """
    k = len(names)
    codes = true * k + pred
    counts = np.bincount(codes, minlength=k * k)
    present = np.flatnonzero(counts)
    first = np.full(k * k, codes.shape[0], dtype=np.int64)
    np.minimum.at(first, codes, np.arange(codes.shape[0]))
    order = present[np.argsort(first[present], kind="stable")]
    return {(names[c // k], names[c % k]): n
            for c, n in zip(order.tolist(), counts[order].tolist(), strict=True)}


class ModelObserver:
    """Scores predictions against labels and watches for drift, for one (model, worker).

    >>> from prometheus_client import CollectorRegistry
    >>> reg = CollectorRegistry()
    >>> obs = ModelObserver(Metrics(reg), "mail", "w1")
    >>> lp = np.log(np.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]]))
    >>> obs.score_labelled(["ham", "spam"], lp, ["ham", "spam", "spam"])
    >>> labels = {"model": "mail", "worker": "w1", "class": "spam", "predicted": "ham"}
    >>> reg.get_sample_value("streamnb_prequential_predictions_total", labels)
    1.0
    """

    def __init__(self, metrics: Metrics, model: str, worker: str, events: Any = None, *,
                 event_cooldown_s: float = DRIFT_EVENT_COOLDOWN_S,
                 clock: Callable[[], float] = time.monotonic, label: str | None = None) -> None:
        """``events``: callable ``events(kind: str, fields: dict)`` that appends a drift event to
        ``streamnb:{NAME}:events`` (given by the worker; None in unit tests); ``label``:
        the ``model`` label of its metrics (default ``model``; "*": pooled over models)."""
        self.metrics = metrics
        self.model = model
        self.worker = worker
        self.label = model if label is None else label
        #: Classes whose series by class exist (Metrics.start_class_series).
        self._class_series: set[str] = set()
        self.events = events
        self.event_cooldown_s = event_cooldown_s
        self.clock = clock
        self.error_detector = ADWIN(direction="increase")
        self.loss_detector = PageHinkley(delta=LOSS_DELTA, threshold=LOSS_THRESHOLD,
                                         clip=LOSS_CLIP, mode="up", alpha=1.0)
        self.prior_detector = PriorShift()
        self.feature_detector = GaussianDrift(window=FEATURE_WINDOW,
                                              min_divergence=FEATURE_MIN_DIVERGENCE)
        self.token_detector = TokenDrift()
        self._last_event: dict[str, float] = {}
        self._feature_reference: dict[Any, Moments] = {}
        mw = {"model": self.label, "worker": worker}
        self._mw = mw
        m = metrics
        self._confidence = m.confidence.labels(**mw)
        self._oov = m.oov_share.labels(**mw)
        self._unsure = m.unsure.labels(**mw)
        self._label_delay = m.label_delay.labels(**mw)
        for detector in (self.error_detector, self.loss_detector, self.prior_detector,
                         self.feature_detector, self.token_detector):
            # series exist from 0, so increase() sees the first alarm
            m.drift_events.labels(**mw, detector=detector.name)
    # ------------------------------------------------------------------ events
    def _raise(self, detector: DriftDetector, extra: dict[str, Any] | None = None, *,
               n_seen: int | None = None, change: dict[str, Any] | None = None) -> None:
        """A detector alarmed: count it and append an event, at most once per cool-down.
        ``n_seen`` and ``change``: the alarm's, when the detector has moved on since
        (bulk updates); by default the detector's current ones."""
        now = self.clock()
        last = self._last_event.get(detector.name)
        if last is not None and now - last < self.event_cooldown_s:
            return
        self._last_event[detector.name] = now
        self.metrics.drift_events.labels(**self._mw, detector=detector.name).inc()
        fields = {"detector": detector.name, "model": self.model,
                  "n_seen": detector.n_seen if n_seen is None else n_seen,
                  "change": _plain(detector.last_change if change is None else change),
                  **(extra or {})}
        log.warning("model %s: drift detected by %s: %s", self.model, detector.name,
                    fields["change"])
        if self.events is not None:
            try:
                self.events("drift", fields)
            except Exception:  # noqa: BLE001 - an event is best effort; metrics already count it
                log.exception("model %s: could not append a drift event", self.model)

    # ------------------------------------------------------------------- hooks
    def observe_predictions(
        self, classes: Sequence[Any], log_proba: np.ndarray, oov_share: np.ndarray,
        ages: np.ndarray, unsure: np.ndarray,
    ) -> None:
        """Every prediction of a batch: log posteriors (n, n_classes) in ``classes`` order, the
        share of each message's features unseen by the model, message ages in seconds, and a
        boolean mask of predictions in the unsure band. (The worker records the ages itself.)"""
        lp = np.asarray(log_proba, dtype=np.float64)
        if lp.size:
            with np.errstate(invalid="ignore"):
                conf = np.exp(np.nanmax(np.where(np.isnan(lp), -np.inf, lp), axis=1))
            observe_many(self._confidence, conf)
        oov = np.asarray(oov_share, dtype=np.float64).ravel()
        observe_many(self._oov, oov)
        n_unsure = int(np.count_nonzero(np.asarray(unsure, dtype=bool)))
        if n_unsure:
            self._unsure.inc(n_unsure)
        self._update_all([(self.token_detector, oov.tolist())])
        self.metrics.oov_rate_recent.labels(**self._mw).set(self.token_detector.rate)

    def _update_all(self, streams: list[tuple[Any, list[Any]]]) -> None:
        """Feed each detector its values of this batch in bulk (``update_many``: the same
        states and alarms as one update per message), then raise the alarms in message
        order (detectors in the order given for one message), as per-message updates would."""
        alarms = []
        for order, (detector, values) in enumerate(streams):
            start = detector.n_seen
            alarms += [(i, order, detector, start + i + 1, change)
                       for i, change in detector.update_many(values)]
        for _i, _order, detector, n_seen, change in sorted(alarms, key=lambda a: a[:2]):
            self._raise(detector, n_seen=n_seen, change=change)

    def _score(self, family: str, classes: Sequence[Any], log_proba: np.ndarray,
               true_labels: Sequence[Any]) -> None:
        m = self.metrics
        confusion, correct, loss_sum, brier_sum = (
            (m.prequential, m.prequential_correct, m.prequential_log_loss, m.prequential_brier)
            if family == "prequential"
            else (m.delayed, m.delayed_correct, m.delayed_log_loss, m.delayed_brier))
        true, pred, loss, brier = score(classes, log_proba, true_labels)
        names = [str(c) for c in classes]
        if names and true.min() >= 0:            # every true class known
            true_names = list(map(names.__getitem__, true.tolist()))
            pairs = _pair_counts(names, true, pred)
        else:
            true_names = [names[t] if t >= 0 else str(y)
                          for t, y in zip(true.tolist(), true_labels, strict=True)]
            predicted = (list(map(names.__getitem__, pred.tolist())) if names
                         else [""] * len(true_names))
            pairs = Counter(zip(true_names, predicted, strict=True))
        for (t, p), n in pairs.items():
            confusion.labels(**self._mw, **{"class": t, "predicted": p}).inc(n)
            right = correct.labels(**self._mw, **{"class": t})    # created at 0 if never right
            if t == p:
                right.inc(n)
        loss_sum.labels(**self._mw).inc(float(loss.sum()))
        brier_sum.labels(**self._mw).inc(float(brier.sum()))
        errors = (true != pred).astype(np.float64)
        self._update_all([(self.error_detector, errors.tolist()),
                          (self.loss_detector, loss.tolist()),
                          (self.prior_detector, true_names)])
        m.error_rate_recent.labels(**self._mw).set(self.error_detector.mean)
        m.prior_shift.labels(**self._mw).set(self.prior_detector.divergence)

    def score_labelled(
        self, classes: Sequence[Any], log_proba: np.ndarray, true_labels: Sequence[Any],
    ) -> None:
        """Test-then-train: the predictions made before learning these labelled messages."""
        if len(true_labels):
            self._score("prequential", classes, log_proba, true_labels)

    def score_delayed(
        self, classes: Sequence[Any], log_proba: np.ndarray, true_labels: Sequence[Any],
        delays: np.ndarray,
    ) -> None:
        """Delayed labels: the prediction made at arrival vs the label that came later.

        They feed the same drift detectors as test-then-train scores (a label is a label)."""
        if len(true_labels):
            self._score("delayed", classes, log_proba, true_labels)
            observe_many(self._label_delay, np.asarray(delays, dtype=np.float64))

    def observe_model(self, model: Any) -> None:
        """After the local model changed (called at most every few seconds): class weights,
        features seen, Bhattacharyya distances for Gaussian models, feature drift."""
        stats = model.stats
        parts = getattr(stats, "parts", {})
        classes = parts.get("classes")
        if classes is not None:
            for label, weight in classes.as_dict().items():
                self.metrics.class_weight.labels(model=self.label, **{"class": str(label)}).set(
                    weight)
            names = {str(label) for label in classes.as_dict()}
            if not names <= self._class_series:  # a new class: its series from 0
                self._class_series |= names
                self.metrics.start_class_series(self.label, self.worker, sorted(self._class_series))
        features = parts.get("features")
        if features is not None and hasattr(features, "n_seen"):
            self.metrics.features_seen.labels(model=self.label).set(features.n_seen)
        moments = parts.get("moments")
        if moments is not None and getattr(moments, "n", None) is not None and len(moments.n):
            self._bhattacharyya(moments, classes)
            self._feature_drift(moments)

    # ------------------------------------------------------------ Gaussian parts
    def _bhattacharyya(self, moments: Any, classes: Any) -> None:
        # deferred: streamnb.bounds (~0.6 s) only for Gaussian models
        from streamnb.bounds import bhattacharyya_bound, bhattacharyya_distance

        covs = moments.covariances()
        labels = moments.labels[:MAX_BHATTACHARYYA_CLASSES]
        weights = classes.as_dict() if classes is not None else {}
        for i, a in enumerate(labels):
            for j in range(i + 1, len(labels)):
                b = labels[j]
                if moments.n[i] < 2 or moments.n[j] < 2:
                    continue
                ca, cb = covs[i], covs[j]
                if moments.diagonal:
                    ca, cb = np.diag(ca), np.diag(cb)
                scale = max(float(np.trace(ca) + np.trace(cb)) / (2 * ca.shape[0]), 1e-300)
                ridge = 1e-9 * scale * np.eye(ca.shape[0])
                wa, wb = float(weights.get(a, 1.0)), float(weights.get(b, 1.0))
                try:
                    dist = bhattacharyya_distance(moments.mean[i], ca + ridge, moments.mean[j],
                                                  cb + ridge)
                    bound = bhattacharyya_bound(moments.mean[i], ca + ridge, moments.mean[j],
                                                cb + ridge, priors=(wa / (wa + wb), wb / (wa + wb)))
                except (ValueError, np.linalg.LinAlgError, ZeroDivisionError):
                    continue
                lab = {"model": self.label, "class": str(a), "other": str(b)}
                self.metrics.bhattacharyya_distance.labels(**lab).set(dist)
                self.metrics.bhattacharyya_bound.labels(**lab).set(bound)

    def _feature_drift(self, moments: Any) -> None:
        """Test each class's moments learnt since the last test against those before them."""
        m2 = moments.m2 if moments.diagonal else np.diagonal(moments.m2, axis1=1, axis2=2)
        for row, label in enumerate(moments.labels):
            current = Moments(float(moments.n[row]), np.array(moments.mean[row], dtype=np.float64),
                              np.array(m2[row], dtype=np.float64))
            reference = self._feature_reference.get(label)
            if reference is None or current.n < reference.n or (
                    reference.mean.shape != current.mean.shape):
                # first sight, forgetting or unlearning: restart from the current moments
                self._feature_reference[label] = current
                continue
            recent = current.minus(reference)
            if recent.n < self.feature_detector.window:
                continue
            if self.feature_detector.test(label, recent, reference):
                self._raise(self.feature_detector)
            self._feature_reference[label] = current
        self.metrics.feature_drift.labels(**self._mw).set(
            max(self.feature_detector.divergence.values(), default=0.0))

    def state(self) -> dict[str, Any]:
        """Every detector's state (for status output and debugging)."""
        return {d.name: _plain(d.state()) for d in (
            self.error_detector, self.loss_detector, self.prior_detector, self.feature_detector,
            self.token_detector)}
