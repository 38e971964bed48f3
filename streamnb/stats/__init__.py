"""Mergeable sufficient statistics (see :mod:`streamnb.stats.base`)."""

from __future__ import annotations

import contextlib

from streamnb.stats.base import STAT_TYPES, ClassIndex, Statistic
from streamnb.stats.bundle import StatsBundle
from streamnb.stats.class_counts import ClassCounts

# TEMPORARY during parallel development: modules written by other helpers may not exist yet.
with contextlib.suppress(ImportError):
    from streamnb.stats.feature_counts import FeatureCounts  # noqa: F401
with contextlib.suppress(ImportError):
    from streamnb.stats.category_counts import CategoryCounts  # noqa: F401
with contextlib.suppress(ImportError):
    from streamnb.stats.moments import GaussianMoments  # noqa: F401

__all__ = ["STAT_TYPES", "ClassCounts", "ClassIndex", "Statistic", "StatsBundle",
           "FeatureCounts", "CategoryCounts", "GaussianMoments"]
