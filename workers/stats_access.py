"""The places where the daemon reads a model's statistics directly, each one small
function: the classes learnt, the learnt class log priors, the share of a message's
features the model has never seen, and the check of a log delta before it is merged
(tests/test_stats_access.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from streamnb.exceptions import FormatError
from streamnb.features import Row
from streamnb.stats.bundle import StatsBundle

__all__ = ["check_delta", "learnt_classes", "learnt_log_prior", "unseen_share"]


def learnt_log_prior(model: Any, n_classes: int) -> np.ndarray:
    """The model's learnt class log priors: log of each class's learnt weight over their
    total, in the order of ``model.classes_``; NaN for each of the ``n_classes`` before
    anything is learnt."""
    counts = np.asarray(model.stats["classes"].counts, dtype=np.float64)
    if not counts.sum() > 0:
        return np.full(n_classes, np.nan)
    with np.errstate(divide="ignore"):
        return np.log(counts) - math.log(counts.sum())


def unseen_share(model: Any, rows: Sequence[Row]) -> np.ndarray:
    """The share of each row's features that the model has never seen (0 for a row
    without features, and for dense input)."""
    out = np.zeros(len(rows))
    fc = model.stats.parts.get("features") if hasattr(model.stats, "parts") else None
    if fc is None or not hasattr(fc, "column_counts"):
        return out
    parts = [row.indices if row.indices is not None else np.empty(0, np.int32) for row in rows]
    sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    if not sizes.any():
        return out
    idx = np.concatenate(parts)  # one lookup for the whole batch
    unseen = ~fc.column_counts(idx).any(axis=0) if len(fc.labels) else np.ones(idx.size, bool)
    row = np.repeat(np.arange(len(rows)), sizes)
    n_unseen = np.bincount(row, weights=unseen, minlength=len(rows))
    has = sizes > 0
    out[has] = 1.0 - (sizes[has] - n_unseen[has]) / sizes[has]
    return out


def check_delta(stats: StatsBundle, delta: Any) -> None:
    """Raise FormatError unless ``delta`` can be merged into ``stats`` as a whole: the same
    part names and types, the same widths, finite numbers (checked before any change)."""
    if not isinstance(delta, StatsBundle):
        raise FormatError(f"a delta must be a statistics bundle, got {type(delta).__name__}")
    if set(delta.parts) != set(stats.parts):
        raise FormatError(f"delta has parts {sorted(delta.parts)}, the model has {sorted(stats.parts)}")
    for name, part in delta.parts.items():
        mine = stats.parts[name]
        if type(part) is not type(mine):
            raise FormatError(f"delta part {name!r} is a {type(part).__name__}, "
                              f"the model's is a {type(mine).__name__}")
        for attr in ("n_features", "diagonal"):
            fixed = getattr(mine, attr, None)  # None (or width 0): not fixed before a fit
            if fixed is not None and fixed is not False and fixed == 0:
                continue
            if fixed is not None and getattr(part, attr, None) != fixed:
                raise FormatError(f"delta part {name!r} has {attr}={getattr(part, attr, None)!r}, "
                                  f"the model has {getattr(mine, attr, None)!r}")
        values = vars(part).values() if hasattr(part, "__dict__") else ()
        arrays = [a for v in values for a in (v if isinstance(v, list) else [v])
                  if isinstance(a, np.ndarray)]
        if any(a.dtype.kind == "f" and not np.isfinite(a).all() for a in arrays):
            raise FormatError(f"delta part {name!r} holds NaN or infinity")


def learnt_classes(model: Any) -> list[Any]:
    """The classes the model has learnt, in its order (none before the first label)."""
    return model.stats["classes"].labels
