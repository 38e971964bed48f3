"""The checks of a model's settings that its stored config and a worker's spec share
(workers/store/model_config.py)."""

from __future__ import annotations

import json
from typing import Any

from streamnb.exceptions import ConfigConflict
from streamnb_workers.store.training import TRAINING_MODES

__all__ = ["MAX_ERROR_WEIGHT", "check_classes", "check_error_weight", "check_training", "stored_classes"]


#: The largest error weight: with the wire's largest weight (1e6) a message is learnt with
#: at most 1e9, which keeps every statistic finite (docs/reliability.md, "Bounds").
MAX_ERROR_WEIGHT = 1000.0


def check_error_weight(value: Any) -> float:
    """``value`` as an error weight: a number from 1 to :data:`MAX_ERROR_WEIGHT`.

    >>> check_error_weight(0.5)
    Traceback (most recent call last):
    ...
    ValueError: error_weight must be a number from 1 to 1000, got 0.5
    """
    try:
        w = float(value)
    except (TypeError, ValueError):
        w = float("nan")
    if isinstance(value, bool) or not 1.0 <= w <= MAX_ERROR_WEIGHT:
        raise ValueError(f"error_weight must be a number from 1 to {MAX_ERROR_WEIGHT:g}, got {value!r}")
    return w


def check_classes(classes: Any) -> list[str]:
    """Declared classes: distinct non-empty str labels of at most 256 characters (the
    wire's label limit), at least one; ValueError otherwise."""
    ok = (isinstance(classes, (list, tuple)) and classes
          and all(isinstance(c, str) and 0 < len(c) <= 256 for c in classes)
          and len(set(classes)) == len(classes))
    if not ok:
        raise ValueError(f"classes must be distinct, non-empty labels of at most 256 "
                         f"characters, got {classes!r}")
    return list(classes)


def stored_classes(name: str, text: str) -> list[str] | None:
    """The classes of model ``name`` as its config stores them (JSON; None: any label)."""
    classes = json.loads(text)
    if classes is None:
        return None
    try:
        return check_classes(classes)
    except ValueError as exc:
        raise ConfigConflict(f"model {name!r} has unreadable stored classes: {exc}") from None


def check_training(text: Any) -> str:
    """``text`` as a training mode (workers/store/training.py), else ValueError.

    >>> check_training("train")
    'train'
    """
    if text not in TRAINING_MODES:
        raise ValueError(f"training must be one of {', '.join(TRAINING_MODES)}, got {text!r}")
    return text
