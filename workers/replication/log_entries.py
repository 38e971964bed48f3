"""The entries of a model's ``:log`` (field ``data``, msgpack), made and checked.

- ``{"t": "delta", "add": bytes | None, "sub": bytes | None, "n": int, "w": worker, "b": batch}``:
  merge the encoded StatsBundle ``add``, then subtract ``sub`` (label corrections move a
  message's contribution: +row for the new class in ``add``, -row for the old in ``sub``).
  With sources (workers/replication/source_parts.py), ``e`` (the default source's epoch)
  and ``src`` (``[[source, epoch, add, sub], ...]``) say whose contributions they are.
  With an operating point held from labelled scores (``--target-fpr``, ``--calibration``),
  ``"h": [int, ...]``: the score codes of the batch's labelled predictions, in their order
  (``streamnb.operating_point.ScoreWindow.code``), added to the replica's window; such an
  entry is written even when the batch learnt nothing (every key learnt before).
  With a challenger (workers/replication/challenger.py), ``"c"`` and ``"cs"``: the
  challenger's bundles added and subtracted of the default source (epoch ``e``), and
  ``"csrc"`` the others' as ``src``.
- ``{"t": "decay", "g": float}``: multiply every learnt weight by ``g`` (forgetting).
- ``{"t": "forget", "s": source}``: take out everything ``source`` taught
  (``streamnb forget --source``). With ``"since": ms`` and ``"a": bytes``: take out what it
  taught since that time, the encoded StatsBundle ``a`` (the sum of its contributions in
  the log since then, workers/client/forget_since.py), and start its next epoch, what it
  taught before kept in it (``streamnb forget --source NAME --since TIME``).
- ``{"t": "promote", "s": SPEC}``: the challenger SPEC becomes the model (its config too).
- ``{"t": "drop", "c": label}``: remove class ``c`` and everything learnt under it
  (``GenerativeClassifier.remove_class``; a class the model does not hold: nothing), from
  every source's part too. A delta's ``sub`` rows of a class the model does not hold
  (after its ``add``) went with a removed class, and are not subtracted (docs/worker.md,
  "Removing a class").

>>> decode_log_entry(encode_class_drop("Spam"))
{'t': 'drop', 'c': 'Spam'}
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from streamnb.encoding import dumps, loads
from streamnb.exceptions import FormatError
from streamnb.operating_point import DEFAULT_WINDOW, N_BINS, ScoreWindow
from streamnb.stats.bundle import StatsBundle
from streamnb_workers.store.model_config import ModelConfig
from streamnb_workers.wire.learn_sources import Teacher, check_source

__all__ = ["SourceForget", "decode_log_entry", "encode_class_drop", "encode_decay", "encode_delta",
           "encode_forget_source", "forgotten_since", "score_codes_of", "score_window_for", "without_removed"]


def encode_delta(add: StatsBundle | None, sub: StatsBundle | None, n_learnt: int,
                 worker: str, batch: str, epoch: int = 0,
                 sources: Sequence[tuple[Teacher, Any, Any]] = (), *,
                 score_codes: list[int] | None = None,
                 challenger: StatsBundle | None = None,
                 challenger_sub: StatsBundle | None = None,
                 challenger_sources: Sequence[tuple[Teacher, Any, Any]] = ()) -> bytes:
    """A delta log entry (see the module docstring): ``add``/``sub`` of the default
    source's ``epoch``, ``sources`` the ``((source, epoch), add, sub)`` of the others,
    ``score_codes`` those of the batch's labelled predictions, ``challenger`` and
    ``challenger_sub`` the challenger's bundles of the batch, added and subtracted, of the
    default source, ``challenger_sources`` the others' as ``sources``."""
    entry = {"t": "delta", "add": add.to_bytes() if add is not None else None,
             "sub": sub.to_bytes() if sub is not None else None,
             "n": int(n_learnt), "w": worker, "b": batch}
    if epoch:
        entry["e"] = int(epoch)
    if sources:
        entry["src"] = [[name, int(e), a.to_bytes() if a is not None else None,
                         s.to_bytes() if s is not None else None]
                        for (name, e), a, s in sources]
    if score_codes:
        entry["h"] = [int(c) for c in score_codes]
    if challenger is not None:
        entry["c"] = challenger.to_bytes()
    if challenger_sub is not None:
        entry["cs"] = challenger_sub.to_bytes()
    if challenger_sources:
        entry["csrc"] = [[name, int(e), a.to_bytes() if a is not None else None,
                          s.to_bytes() if s is not None else None]
                         for (name, e), a, s in challenger_sources]
    return dumps(entry)


def encode_forget_source(source: str, since_ms: int | None = None,
                         taught: StatsBundle | None = None,
                         challenger: StatsBundle | None = None) -> bytes:
    """A log entry that takes out everything ``source`` taught (since ``since_ms``: what
    it taught the model since then, ``taught``, and the challenger, ``challenger``)."""
    if since_ms is None:
        return dumps({"t": "forget", "s": check_source(source)})
    entry = {"t": "forget", "s": check_source(source), "since": int(since_ms)}
    if taught is not None:
        entry["a"] = taught.to_bytes()
    if challenger is not None:
        entry["ca"] = challenger.to_bytes()
    return dumps(entry)


@dataclass(frozen=True, slots=True)
class SourceForget:
    """An entry ``{"forget_source": NAME}`` of ``:in`` (``streamnb forget --source`` as a
    user that may not write the log), carried with the class removals to the commit,
    which appends its log entry in stream order and counts NAME's epoch up."""

    source: str

    def commit_entry(self) -> tuple[bytes, bytes]:
        """(the log entry, a record prefix no learn-once record has: none is released)."""
        return encode_forget_source(self.source), b"\xc1"


def forgotten_since(entry: dict[str, Any]) -> tuple[bool, StatsBundle | None,
                                                    StatsBundle | None]:
    """Whether a ``forget`` entry takes out only what its source taught since a time, and
    then what it takes out of the model and of the challenger (None: nothing), checked."""
    if entry.get("since") is None:
        return False, None, None
    since = entry["since"]
    if not isinstance(since, int) or isinstance(since, bool) or since < 0 or \
            any(not isinstance(entry.get(f), (bytes, type(None))) for f in ("a", "ca")):
        raise FormatError("a forget since a time needs 'since' (ms), and bundles 'a', 'ca'")
    return True, *(None if entry.get(f) is None else StatsBundle.from_bytes(entry[f])
                   for f in ("a", "ca"))


def encode_decay(g: float) -> bytes:
    """A decay log entry: multiply every learnt weight by ``g``."""
    return dumps({"t": "decay", "g": float(g)})


def encode_class_drop(label: Any) -> bytes:
    """A class removal log entry: remove class ``label``."""
    return dumps({"t": "drop", "c": label})


def decode_log_entry(data: bytes) -> dict[str, Any]:
    obj = loads(data)
    if not isinstance(obj, dict) or \
            obj.get("t") not in ("delta", "decay", "forget", "drop", "promote"):
        raise FormatError("log entry is not a delta, decay, forget, drop or promote map")
    return obj


def score_window_for(config: ModelConfig) -> ScoreWindow | None:
    """The window of labelled scores a replica of ``config`` keeps (None: its decision
    rule needs none, or the model has several shards)."""
    d = config.decision
    if config.shards != 1 or (d.get("target_fpr") is None and d.get("calibration") is None):
        return None
    return ScoreWindow(size=int(d.get("score_window") or DEFAULT_WINDOW),
                       score=d.get("score", "log_odds"), target_fpr=d.get("target_fpr"),
                       calibration=d.get("calibration"),
                       prior_half_life=d.get("prior_half_life"))


def score_codes_of(entry: dict[str, Any]) -> list[int]:
    """A delta's score codes, checked (FormatError before any change)."""
    codes = entry.get("h") or []
    if not isinstance(codes, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 2 * N_BINS for c in codes):
        raise FormatError("score codes must be a list of ints in range")
    return codes


def without_removed(held: Iterable[Any] | Any, sub: StatsBundle) -> StatsBundle:
    """``sub`` without the rows of classes not ``held`` (a model: those it holds; removed
    since the rows were learnt, they went with their class)."""
    if hasattr(held, "stats"):
        held = held.stats["classes"].labels
    held = set(held)
    for label in [lab for lab in sub["classes"].labels if lab not in held]:
        sub.remove_class(label)
    return sub
