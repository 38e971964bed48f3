"""Drift detectors for a running classifier, one module per detector.

Every detector is a :class:`~streamnb.drift.base.DriftDetector`: ``update(...)`` returns True
when it raises an alarm (after the cool-down), ``state()`` gives a msgpack/JSON friendly view
of what it watches, and ``last_change`` says what moved at the last alarm.

- :class:`ADWIN` on the 0/1 error stream (adaptive window, false cut probability <= delta),
- :class:`PageHinkley` on the per-message log-loss,
- :class:`PriorShift` on the labels (multi-window two-sample G-test of class shares),
- :class:`GaussianDrift` on Gaussian features (J-divergence of recent vs reference moments),
- :class:`TokenDrift` on the out-of-vocabulary share of each message (ADWIN, increases only).
"""

from __future__ import annotations

from streamnb.drift.adwin import ADWIN
from streamnb.drift.base import DriftDetector
from streamnb.drift.gaussian import GaussianDrift, Moments, j_divergence
from streamnb.drift.page_hinkley import PageHinkley
from streamnb.drift.prior_shift import PriorShift, js_divergence
from streamnb.drift.token import TokenDrift

__all__ = ["ADWIN", "DriftDetector", "GaussianDrift", "Moments", "PageHinkley", "PriorShift",
           "TokenDrift", "j_divergence", "js_divergence"]
