"""What a worker writes for each message: a prediction for ``{M}:out`` and a dead letter
for ``{M}:dead`` (docs/protocol.md), and their decoding for readers (``streamnb predict``,
``tail``, the milter, tests). The input side is :mod:`streamnb_workers.wire.codec`.

>>> out = decode_output(encode_output("m1", "1-0", "spam", {"spam": -0.1, "ham": -2.4},
...                                   7, "w1", true_label="spam", learned=True))
>>> out["label"], out["learned"]
('spam', True)
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

from streamnb._cmodules import optional_c_module
from streamnb.encoding import dumps
from streamnb.exceptions import MalformedMessage
from streamnb_workers.wire.codec import InputMessage, refuse_ext

__all__ = ["decode_dead", "decode_output", "encode_dead", "encode_output", "output_for",
           "verdict_output"]

#: ``streamnb._kernels.pack_map`` (msgpack of a map without making the dict), or None: the
#: dict is made and packed by msgpack.
_PACK_MAP = getattr(optional_c_module("streamnb._kernels"), "pack_map", None)
#: An output's keys in the order written; the first :data:`_REQUIRED` always, the others
#: where they have a value.
_OUTPUT_KEYS = ("id", "entry", "label", "log_proba", "model_version", "worker", "true_label",
                "learned", "reason", "was", "meta", "score", "explain", "threshold", "proba",
                "prior", "challenger")
_REQUIRED = 6


def encode_output(
    id: str,  # the wire key (shadows the builtin on purpose)
    entry: str,
    label: str | int,
    log_proba: dict[str | int, float],
    model_version: int | str,
    worker: str,
    *,
    true_label: str | int | None = None,
    learned: bool | None = None,
    meta: dict | None = None,
    score: float | None = None,
    reason: str | None = None,
    explain: dict | None = None,
    was: str | int | None = None,
    threshold: float | None = None,
    proba: float | None = None,
    challenger: dict | None = None,
    prior: float | None = None,
) -> bytes:
    """Encode one prediction for ``{M}:out``; ``threshold``, ``proba`` and ``prior`` (with
    an operating point held: the score threshold in use, the calibrated P(positive), and
    the followed prior P(positive) that probability was moved to) where given and not NaN; ``score`` (two classes: what to rank and
    threshold by) is written where given and finite; ``explain``: the map of
    :mod:`streamnb_workers.wire.explanations`, with ``--explain K``; ``was``: the label
    a relearnt message's key was learnt with before (``reason`` ``relearnt``).

    >>> out = decode_output(encode_output("m1", "1-0", "spam", {"spam": -0.1, "ham": -2.4},
    ...                                   7, "w1", true_label="spam", learned=True))
    >>> (out["label"], out["learned"], sorted(out["log_proba"]))
    ('spam', True, ['ham', 'spam'])
    """
    if _PACK_MAP is not None:
        return _packed(id, entry, label, log_proba, model_version, worker, true_label,
                       bool(learned) if true_label is not None or learned is not None else None,
                       reason, was, meta, score, explain, threshold, proba, prior, challenger)
    obj: dict[str, Any] = {
        "id": id,
        "entry": entry,
        "label": label,
        "log_proba": {k: float(v) for k, v in log_proba.items()},
        "model_version": model_version,
        "worker": worker,
    }
    if true_label is not None:
        obj["true_label"] = true_label
        obj["learned"] = bool(learned)
    elif learned is not None:
        obj["learned"] = bool(learned)
    if reason is not None:
        obj["reason"] = reason
    if was is not None:
        obj["was"] = was
    if meta is not None:
        obj["meta"] = meta
    if score is not None and math.isfinite(score):
        obj["score"] = float(score)
    if explain is not None:
        obj["explain"] = explain
    if threshold is not None and threshold == threshold:
        obj["threshold"] = float(threshold)
    if proba is not None and proba == proba:
        obj["proba"] = float(proba)
    if prior is not None and prior == prior:
        obj["prior"] = float(prior)
    if challenger is not None:  # (workers/replication/challenger.py)
        obj["challenger"] = challenger
    return dumps(obj)


def _label_fields(true_label: Any, learned: bool | None, reason: str | None,
                  was: Any) -> tuple[bool | None, str | None, Any]:
    """An output's ``learned``, ``reason`` and ``was`` for a message whose true label is
    ``true_label``: ``learned`` and ``reason`` only for a labelled message or an
    ``autolearnt`` one, ``was`` only for a labelled message."""
    if true_label is not None:
        return learned, reason, was
    if reason == "autolearnt":
        return learned, reason, None
    return None, None, None


def output_for(
    msg: InputMessage,
    label: str | int,
    log_proba: dict[str | int, float],
    model_version: int | str,
    worker: str,
    learned: bool | None = None,
    score: float | None = None,
    reason: str | None = None,
    explain: dict | None = None,
    was: str | int | None = None,
    threshold: float | None = None,
    proba: float | None = None,
    challenger: dict | None = None,
    prior: float | None = None,
) -> bytes:
    """:func:`encode_output` for a decoded input (id, entry, true label and meta from
    ``msg``); ``reason``: why a labelled message was not learnt (``already_learnt``), or
    how it was (``relearnt``, its key learnt before with the label ``was``); for an
    unlabelled message, ``autolearnt`` (learnt with its verdict: ``learned`` true)."""
    learned, reason, was = _label_fields(msg.label, learned, reason, was)
    return encode_output(msg.id, msg.entry_id, label, log_proba, model_version, worker,
                         true_label=msg.label, learned=learned, meta=msg.meta, score=score,
                         reason=reason, explain=explain, was=was, threshold=threshold,
                         proba=proba, challenger=challenger, prior=prior)


def verdict_output(msg: InputMessage, v: Any, model_version: int | str, worker: str,
                   learned: bool | None = None, reason: str | None = None,
                   was: str | int | None = None, challenger: dict | None = None) -> bytes:
    """:func:`output_for` of a worker's verdict ``v`` (workers/worker/batch.py ``Verdict``:
    its label, log posteriors, score, threshold, probability, prior and explanation),
    packed by ``streamnb._kernels.pack_map`` where it is built (no keyword call chain on
    the worker's path: the same bytes)."""
    if _PACK_MAP is None:
        return output_for(msg, v.label, v.log_proba, model_version, worker, learned=learned,
                          score=v.score, reason=reason, explain=v.explanation, was=was,
                          threshold=v.threshold, proba=v.proba, challenger=challenger,
                          prior=v.prior)
    true_label = msg.label
    learned, reason, was = _label_fields(true_label, learned, reason, was)
    return _packed(msg.id, msg.entry_id, v.label, v.log_proba, model_version, worker, true_label,
                   bool(learned) if true_label is not None or learned is not None else None,
                   reason, was, msg.meta, v.score, v.explanation, v.threshold, v.proba, v.prior,
                   challenger)


def _packed(id: str, entry: str, label: Any, log_proba: dict, model_version: Any, worker: str,
            true_label: Any, learned: bool | None, reason: str | None, was: Any, meta: Any,
            score: float | None, explain: Any, threshold: float | None, proba: float | None,
            prior: float | None, challenger: Any) -> bytes:
    """:func:`encode_output`'s map by ``streamnb._kernels.pack_map``: the same bytes."""
    for x in log_proba.values():
        if type(x) is not float:
            log_proba = {k: float(x) for k, x in log_proba.items()}
            break
    return _PACK_MAP(_OUTPUT_KEYS, (  # type: ignore[misc]
        id, entry, label, log_proba, model_version, worker, true_label, learned, reason, was, meta,
        float(score) if score is not None and math.isfinite(score) else None, explain,
        float(threshold) if threshold is not None and threshold == threshold else None,
        float(proba) if proba is not None and proba == proba else None,
        float(prior) if prior is not None and prior == prior else None, challenger), _REQUIRED)


def encode_dead(entry_id: str, reason: str, detail: str, payload: bytes) -> bytes:
    """Encode a dead letter for ``{M}:dead``: the entry id, reason code, detail, original bytes.

    >>> decode_output(encode_dead("1-0", "not_msgpack", "bad", b"\\xc1"))["payload"]
    b'\\xc1'
    """
    if isinstance(payload, str):
        payload = payload.encode("utf-8", "surrogatepass")
    return dumps({"entry": entry_id, "reason": reason, "detail": detail, "payload": bytes(payload)})


def decode_output(data: bytes) -> dict[str, Any]:
    """Decode a prediction or dead letter written by this module (for readers: CLI, tests)."""
    try:
        obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False, ext_hook=refuse_ext)
    except Exception as exc:
        raise MalformedMessage("not_msgpack", f"output entry is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise MalformedMessage("not_a_map", f"expected a msgpack map, got {type(obj).__name__}")
    return obj


#: A dead letter decodes as a prediction does: one msgpack map.
decode_dead = decode_output
