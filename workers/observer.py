"""Quality, model and drift observations of one model in one worker.

The worker loop calls these hooks; this module turns them into metrics (workers/metrics.py),
drift detection and drift events. (Skeleton: the observability engineer fills it in; the
signatures are the contract with workers/worker.py.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from workers.metrics import Metrics


class ModelObserver:
    """Scores predictions against labels and watches for drift, for one (model, worker)."""

    def __init__(self, metrics: Metrics, model: str, worker: str, events: Any = None) -> None:
        """``events``: callable ``events(kind: str, fields: dict)`` that appends a drift event to
        ``streamnb:{NAME}:events`` (given by the worker; None in unit tests)."""
        self.metrics = metrics
        self.model = model
        self.worker = worker
        self.events = events

    def observe_predictions(
        self, classes: Sequence[Any], log_proba: np.ndarray, oov_share: np.ndarray,
        ages: np.ndarray, unsure: np.ndarray,
    ) -> None:
        """Every prediction of a batch: log posteriors (n, n_classes) in ``classes`` order, the
        share of each message's features unseen by the model, message ages in seconds, and a
        boolean mask of predictions in the unsure band."""

    def score_labelled(
        self, classes: Sequence[Any], log_proba: np.ndarray, true_labels: Sequence[Any],
    ) -> None:
        """Test-then-train: the predictions made before learning these labelled messages."""

    def score_delayed(
        self, classes: Sequence[Any], log_proba: np.ndarray, true_labels: Sequence[Any],
        delays: np.ndarray,
    ) -> None:
        """Delayed labels: the prediction made at arrival vs the label that came later."""

    def observe_model(self, model: Any) -> None:
        """After the local model changed (called at most every few seconds): class weights,
        features seen, Bhattacharyya distances for Gaussian models, feature drift."""
