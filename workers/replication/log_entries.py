"""The entries of a model's ``:log`` (their fields: workers/replication/replica.py's module
docstring): encoded by the committing worker, decoded and checked by every replica.

>>> decode_log_entry(encode_decay(0.5))
{'t': 'decay', 'g': 0.5}
>>> score_codes({"h": [1, 2]}), score_codes({})
([1, 2], [])
"""

from __future__ import annotations

from typing import Any

from streamnb.encoding import dumps, loads
from streamnb.exceptions import FormatError
from streamnb.operating_point import N_BINS
from streamnb.stats.bundle import StatsBundle

__all__ = ["decode_log_entry", "encode_class_drop", "encode_decay", "encode_delta",
           "score_codes", "without_removed"]


def encode_delta(add: StatsBundle | None, sub: StatsBundle | None, n_learnt: int,
                 worker: str, batch: str, score_codes: list[int] | None = None,
                 challenger: StatsBundle | None = None) -> bytes:
    """A delta log entry (fields: workers/replication/replica.py's module docstring)."""
    entry = {"t": "delta", "add": add.to_bytes() if add is not None else None,
             "sub": sub.to_bytes() if sub is not None else None,
             "n": int(n_learnt), "w": worker, "b": batch}
    if score_codes:
        entry["h"] = [int(c) for c in score_codes]
    if challenger is not None:
        entry["c"] = challenger.to_bytes()
    return dumps(entry)


def score_codes(entry: dict[str, Any]) -> list[int]:
    """A delta's score codes, checked (FormatError before any change)."""
    codes = entry.get("h") or []
    if not isinstance(codes, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 2 * N_BINS for c in codes):
        raise FormatError("score codes must be a list of ints in range")
    return codes


def encode_decay(g: float) -> bytes:
    """A decay log entry: multiply every learnt weight by ``g``."""
    return dumps({"t": "decay", "g": float(g)})


def encode_class_drop(label: Any) -> bytes:
    """A class removal log entry: remove class ``label``."""
    return dumps({"t": "drop", "c": label})


def decode_log_entry(data: bytes) -> dict[str, Any]:
    obj = loads(data)
    if not isinstance(obj, dict) or obj.get("t") not in ("delta", "decay", "drop", "promote"):
        raise FormatError("log entry is not a delta, decay, drop or promote map")
    return obj


def without_removed(model: Any, sub: StatsBundle) -> StatsBundle:
    """``sub`` without the rows of classes ``model`` does not hold (removed since the
    rows were learnt: they went with their class)."""
    held = model.stats["classes"].labels
    for label in [lab for lab in sub["classes"].labels if lab not in held]:
        sub.remove_class(label)
    return sub
