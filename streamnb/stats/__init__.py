"""Mergeable sufficient statistics (see :mod:`streamnb.stats.base`)."""

from __future__ import annotations

from streamnb.stats.base import STAT_TYPES, ClassIndex, Statistic
from streamnb.stats.bundle import StatsBundle
from streamnb.stats.category_counts import CategoryCounts
from streamnb.stats.class_counts import ClassCounts
from streamnb.stats.feature_counts import FeatureCounts
from streamnb.stats.moments import GaussianMoments

__all__ = [
    "STAT_TYPES",
    "CategoryCounts",
    "ClassCounts",
    "ClassIndex",
    "FeatureCounts",
    "GaussianMoments",
    "Statistic",
    "StatsBundle",
]
