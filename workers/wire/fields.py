"""Each field of an input entry checked within the bounds of :class:`Limits`: a label, a
weight, a source, and each payload kind's value (``tokens``, ``hashes``, ``features``,
``x``); a field that fails is a :class:`~streamnb.exceptions.MalformedMessage` with its
reason code. :func:`~streamnb_workers.wire.codec.decode_input` calls them in turn.

>>> weight_field(2, Limits()), label_field("spam", Limits())
(2.0, 'spam')
>>> weight_field(-1, Limits())
Traceback (most recent call last):
...
streamnb.exceptions.MalformedMessage: bad_weight: weight must be a finite number > 0, got -1.0
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streamnb.exceptions import MalformedMessage
from streamnb.features.wire_tokens import WireTokens
from streamnb_workers.wire.learn_sources import DEFAULT_SOURCE, check_source
from streamnb_workers.wire.limits import Limits

__all__ = ["features_field", "hashes_field", "is_number", "label_field", "source_field",
           "tokens_field", "vector_field", "weight_field"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: A hashes payload's items: 64-bit little-endian (made once: not parsed from "<u8" a message).
_HASH_DTYPE = np.dtype("<u8")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def label_field(v: Any, limits: Limits) -> str | int | None:
    if v is None:
        return None
    if isinstance(v, str):
        if not v or len(v) > limits.max_label_len:
            raise MalformedMessage(
                "bad_label", f"label must be 1..{limits.max_label_len} characters, got {len(v)}"
            )
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise MalformedMessage("bad_label", f"integer label {v} does not fit in int64")
        return v
    raise MalformedMessage("bad_label", f"label must be str or int, got {type(v).__name__}")


def weight_field(v: Any, limits: Limits) -> float:
    if v is None:
        return 1.0
    if not is_number(v):
        raise MalformedMessage("bad_weight", f"weight must be a number > 0, got {type(v).__name__}")
    w = float(v)
    if not math.isfinite(w) or w <= 0.0:
        raise MalformedMessage("bad_weight", f"weight must be a finite number > 0, got {w}")
    if w > limits.max_weight:
        raise MalformedMessage("bad_weight", f"weight {w:g} is above the limit {limits.max_weight:g}")
    return w


def source_field(v: Any) -> str | None:
    """A producer's ``source``: None for the default one (so no source and
    ``"default"`` are the same), else the name checked."""
    try:
        name = check_source(v, producer=True)
    except ValueError as exc:
        raise MalformedMessage("bad_source", str(exc)) from None
    return None if name == DEFAULT_SOURCE else name


def tokens_field(v: Any, limits: Limits) -> list[str] | WireTokens:
    if type(v) is WireTokens:  # checked as it was hashed (streamnb.features.wire_tokens)
        return v
    if not isinstance(v, list):
        raise MalformedMessage("bad_type", "tokens must be a list of str")
    if len(v) > limits.max_tokens:
        raise MalformedMessage(
            "too_large", f"tokens has {len(v)} items, the limit is {limits.max_tokens}"
        )
    try:  # one C-level pass that refuses any item but a str (msgpack makes no subclasses)
        "".join(v)
    except TypeError:
        raise MalformedMessage("bad_type", "tokens must be a list of str") from None
    return v


def hashes_field(v: Any, limits: Limits) -> np.ndarray:
    if not isinstance(v, bytes) or len(v) % 8:
        raise MalformedMessage(
            "bad_type", "hashes must be bin: the tokens' 64-bit hashes, little-endian, 8 bytes each")
    if len(v) // 8 > limits.max_tokens:
        raise MalformedMessage(
            "too_large", f"hashes has {len(v) // 8} tokens, the limit is {limits.max_tokens}")
    return np.frombuffer(v, dtype=_HASH_DTYPE)


def features_field(v: Any, limits: Limits) -> dict[str, float]:
    if not isinstance(v, dict):
        raise MalformedMessage("bad_type", "features must be a map of str -> number")
    if len(v) > limits.max_features:
        raise MalformedMessage(
            "too_large", f"features has {len(v)} entries, the limit is {limits.max_features}"
        )
    out: dict[str, float] = {}
    for name, value in v.items():
        if not isinstance(name, str) or not is_number(value):
            raise MalformedMessage("bad_type", "features must be a map of str -> number")
        f = float(value)
        if not math.isfinite(f):
            raise MalformedMessage("non_finite", f"feature {name[:50]!r} is {f}")
        if abs(f) > limits.max_value:
            raise MalformedMessage("too_large", f"feature {name[:50]!r} is {f:g}, beyond the "
                                   f"limit {limits.max_value:g}")
        out[name] = f
    return out


def vector_field(v: Any, limits: Limits, expected_dim: int | None) -> np.ndarray:
    if not isinstance(v, list) or not all(is_number(t) for t in v):
        raise MalformedMessage("bad_type", "x must be a list of numbers")
    if len(v) > limits.max_features:
        raise MalformedMessage("too_large", f"x has {len(v)} values, the limit is {limits.max_features}")
    try:
        x = np.array(v, dtype=np.float64)
    except OverflowError:  # an int beyond float64
        raise MalformedMessage("non_finite", "x holds an integer too large for float64") from None
    if not np.isfinite(x).all():
        raise MalformedMessage("non_finite", "x contains NaN or infinity")
    if x.size and float(np.abs(x).max()) > limits.max_value:
        raise MalformedMessage("too_large", f"x holds {float(np.abs(x).max()):g}, beyond the "
                               f"limit {limits.max_value:g}")
    if x.size == 0:
        raise MalformedMessage("wrong_dimension", "x is empty")
    if expected_dim is not None and x.size != expected_dim:
        raise MalformedMessage(
            "wrong_dimension", f"x has {x.size} values, but this model expects {expected_dim}"
        )
    return x
