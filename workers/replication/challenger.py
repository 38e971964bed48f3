"""A challenger model: a second configuration learnt from the same entries, in the same
prequential order, as the model (docs/worker.md, "A challenger on the same stream").

SPEC (``streamnb worker --challenger SPEC``) is a comma-separated list of ``key=value``
pairs, each overriding one field of the model's stored config: a model parameter of its
kind (``alpha=0.5``, ``fit_prior=false``), a featurizer option (``osb=5``, ``bits=18``) or
``error_weight=1``. Values are JSON (``true``, ``0.5``, ``"x"``) or a bare word. The spec
is stored once in ``{M}:challenger`` (SET NX), so every worker of the model holds the same
challenger; a worker given another spec is refused.

Each worker predicts every item with the challenger too (its own rows when the featurizer
differs). The challenger learns what a model of its config served alone learns: the
batch's own labels with the challenger's own error weights, labels for messages of the same
batch, delayed labels and corrections (``ref``) and forgets and relearnt keys, each with
the weight it learnt the message with. For that a message's cache entry holds the
challenger's row (where its featurizer differs) and weight, and a learn-once key's record
its weight (workers/store/label_cache.py, workers/wire/learn_keys.py); a message cached or
learnt before the challenger was started has neither, and teaches it nothing. The
committing worker puts the challenger's statistics added and subtracted in the delta's
``"c"`` and ``"cs"`` fields (the default source's) and ``"csrc"`` (the other sources', as
``"src"``), and every replica applies them to its challenger in log order, as it does the
model's, keeping its parts by source as the model does (workers/replication/source_parts.py):
a ``forget --source``, a decay and a class removal change both alike, and a promoted
challenger's parts become the model's. It does not follow what autolearn learns (a
challenger served alone would choose its own messages). The snapshot holds it as
``challenger`` (its dumps, wrapped with its parts by source when it holds any).

>>> from streamnb_workers.store.model_config import ModelConfig
>>> cfg = ModelConfig("m", "multinomial", {"alpha": 0.1, "n_features": 16},
...                   {"bits": 4, "input": "sparse"}, error_weight=2.0)
>>> ch = challenger_config(cfg, "alpha=1, error_weight=1")
>>> ch.model_params["alpha"], ch.error_weight, ch.featurizer == cfg.featurizer
(1.0, 1.0, True)
>>> challenger_config(cfg, "bits=8").model_params["n_features"]
256
>>> challenger_config(cfg, "beta=2")
Traceback (most recent call last):
...
ValueError: challenger spec key 'beta' is neither a model parameter, a featurizer option nor error_weight
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from streamnb.encoding import dumps, loads
from streamnb.exceptions import ConfigConflict, MalformedMessage
from streamnb.stats.bundle import StatsBundle
from streamnb_workers.replication.log_entries import without_removed
from streamnb_workers.replication.source_parts import Contribution, SourceParts, decode_sources
from streamnb_workers.store.config_checks import check_error_weight
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelConfig
from streamnb_workers.wire.learn_keys import record_challenger_weight, record_teacher
from streamnb_workers.wire.learn_sources import DEFAULT_SOURCE, Teacher
from streamnb_workers.wire.replies import as_str

__all__ = ["Challenger", "Promotion", "batch_stats", "by_teacher", "cache_part", "challenger_config", "challenger_delta",
           "challenger_key", "challenger_output", "challenger_weights", "parse_spec",
           "promoted", "recorded_sub", "store_promoted", "stored_spec"]

log = logging.getLogger(__name__)

_FORMAT = "streamnb.challenger"
#: Featurizer options a challenger may change (what `Featurizer.from_config` takes).
FEATURIZER_KEYS = ("bits", "osb", "counts", "min_len", "max_len", "meta", "header_names")


def challenger_key(keys: ModelKeys) -> str:
    """String: the model's challenger spec (absent: none)."""
    return f"{keys.prefix}:challenger"


def parse_spec(spec: str) -> dict[str, Any]:
    """``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}`` (ValueError on a malformed pair).

    >>> parse_spec("alpha=0.5,osb=5,fit_prior=false,counts=binary")
    {'alpha': 0.5, 'osb': 5, 'fit_prior': False, 'counts': 'binary'}
    """
    out: dict[str, Any] = {}
    for part in spec.split(","):
        key, eq, text = part.strip().partition("=")
        key, text = key.strip(), text.strip()
        if not eq or not key or not text or key in out:
            raise ValueError(f"challenger spec must be key=value pairs, each key once, got {spec!r}")
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


def challenger_config(config: ModelConfig, spec: str) -> ModelConfig:
    """``config`` with the fields ``spec`` names changed (ValueError: an unknown key, or
    a spec that changes nothing)."""
    params, feats = dict(config.model_params), dict(config.featurizer)
    error_weight = config.error_weight
    for key, value in parse_spec(spec).items():
        if key == "error_weight":
            error_weight = check_error_weight(value)
        elif key in params:
            params[key] = float(value) if isinstance(params[key], float) and \
                isinstance(value, int) and not isinstance(value, bool) else value
        elif key in FEATURIZER_KEYS:
            feats[key] = value
        else:
            raise ValueError(f"challenger spec key {key!r} is neither a model parameter, "
                             "a featurizer option nor error_weight")
    if "n_features" in params and feats.get("bits") != config.featurizer.get("bits"):
        params["n_features"] = 2 ** int(feats["bits"])  # (hashed input: a column a bucket)
    ch = replace(config, model_params=params, featurizer=feats, error_weight=error_weight)
    ch.make_model()  # (a bad parameter value raises here, at start)
    return ch


def stored_spec(client: Any, keys: ModelKeys, spec: str | None) -> str | None:
    """The model's challenger spec: ``spec`` stored if none is (SET NX), the stored one
    when ``spec`` is None; ConfigConflict when both are given and differ."""
    key = challenger_key(keys)
    if spec is not None:
        client.set(key, spec, nx=True)
    stored = client.get(key)
    stored = None if stored is None else as_str(stored)
    if spec is not None and stored != spec:
        raise ConfigConflict(f"model {keys.name!r} has the challenger {stored!r}, given {spec!r}; "
                             "promote it or delete the key first")
    return stored


class Challenger:
    """The challenger of one replica: its config, decision rule, featurizer (None: the
    model's rows serve) and model."""

    def __init__(self, config: ModelConfig, spec: str, max_bytes: int | None = None) -> None:
        self.spec = spec
        try:
            self.config = challenger_config(config, spec)
        except (ValueError, TypeError) as exc:
            raise ConfigConflict(f"model {config.name!r}: the challenger {spec!r} does not fit "
                                 f"it: {exc}") from None
        self.rule = self.config.make_decision_rule()
        self.featurizer = None if self.config.featurizer == config.featurizer else \
            self.config.make_featurizer(max_bytes)
        self.model = self.config.make_model()
        #: What each source taught it, as the model's (workers/replication/source_parts.py).
        self.sources = SourceParts()

    def reset(self, data: bytes | None = None, epochs: dict[str, int] | None = None) -> None:
        """A fresh model, or the one a snapshot holds (``data``: :meth:`to_bytes`), with
        its parts by source; ``epochs``: the model's sources' epochs, which the
        challenger's follow (taken where the snapshot holds none of its own)."""
        # deferred: the model classes (streamnb.models, ~0.8 s), loaded with the replica's
        from streamnb.models import loads as load_model

        self.sources = SourceParts()
        self.sources.epochs = dict(epochs or {})
        obj = loads(data) if data is not None else None
        if isinstance(obj, dict) and obj.get("format") == _FORMAT:
            self.model = load_model(obj["model"])
            self.sources.load(obj["sources"])
        else:
            self.model = self.config.make_model() if data is None else load_model(data)

    def to_bytes(self) -> bytes:
        """The model's dumps, wrapped with its parts by source where it holds any."""
        # deferred: the model classes, loaded with the replica's
        from streamnb.models import dumps as dump_model

        if not self.sources.parts and not self.sources.epochs:
            return dump_model(self.model)
        return dumps({"format": _FORMAT, "model": dump_model(self.model),
                      "sources": self.sources.encode()})

    def check(self, entry: dict[str, Any]) -> list[Contribution] | None:
        """The challenger's contributions of a delta log entry (None: none): ``c`` and
        ``cs`` of the default source's epoch ``e``, ``csrc`` of the others (as
        workers/replication/source_parts.py), decoded and checked mergeable."""
        add, sub = (None if entry.get(f) is None else StatsBundle.from_bytes(entry[f])
                    for f in ("c", "cs"))
        if add is None and sub is None and not entry.get("csrc"):
            return None
        out = decode_sources({"e": entry.get("e", 0), "src": entry.get("csrc")}, add, sub) \
            or [(DEFAULT_SOURCE, 0, add, sub)]
        for _, _, a, s in out:
            for bundle in (a, s):
                if bundle is not None:
                    self.model.stats.check_mergeable(bundle)
        return out

    def apply(self, contributions: list[Contribution]) -> None:
        """Apply what :meth:`check` gave: merged and subtracted as the model's are."""
        if self.sources.parts or self.sources.epochs or len(contributions) > 1 or \
                contributions[0][:2] != (DEFAULT_SOURCE, 0):
            self.model = self.sources.apply(self.config, self.model, contributions)
            return
        _, _, add, sub = contributions[0]
        if add is not None:
            self.model.merge_stats(add)
        if sub is not None:
            self.model.subtract_stats(without_removed(self.model, sub))

    def forget(self, source: str, taught: Any = None, since: bool = False) -> None:
        """Take out all ``source`` taught (log entry ``forget``; ``since``: only
        ``taught``, as :meth:`SourceParts.forget`)."""
        self.model = self.sources.forget(self.config, self.model, source, taught, since)

    def decay(self, g: float) -> None:
        """Multiply every learnt weight by ``g`` (log entry ``decay``)."""
        self.model = self.sources.decay(self.config, self.model, g)

    def drop(self, label: Any) -> None:
        """Remove class ``label`` (log entry ``drop``)."""
        self.sources.drop(self.model, label)


# ---------------------------------------------------------------------- what it learns
def challenger_weights(items: Sequence[Any], learnt: Sequence[Any], ch: Sequence[Any],
                       auto: Collection[int]) -> list[float | None]:
    """The weight the challenger learns each item with, as the model's rule gives its
    own: its verdict's (error weight) for the item's own label, else the message's; None
    where it has no row or the item is autolearnt (the model's verdict, not its own)."""
    return [None if c is None or i in auto else
            c[1].weight if lab is not None and lab == it.msg.label else it.msg.weight
            for i, (it, lab, c) in enumerate(zip(items, learnt, ch, strict=True))]


def cache_part(challenger: Challenger | None, c: Any, weight: float | None,
               ) -> tuple[bytes | None, float] | None:
    """What a message's cache entry holds for the challenger: its row's bytes (None: the
    model's row serves) and weight; None without a challenger or a weight."""
    if challenger is None or c is None or weight is None:
        return None
    return (None if challenger.featurizer is None else c[0].row.to_bytes()), weight


def recorded_sub(subs: list[tuple[Any, Any, float, Teacher]], item: Any, label: Any,
                 record: bytes) -> None:
    """Add the challenger's part of taking out ``record`` (learnt ``label``) with
    ``item``'s row to ``subs``, if the record holds its weight."""
    weight = record_challenger_weight(record)
    if weight is not None:
        subs.append((item, label, weight, record_teacher(record)))


def challenger_delta(challenger: Challenger | None, featurizer: Any, items: Sequence[Any],
                     learnt: Sequence[Any], ch: Sequence[Any], weights: Sequence[float | None],
                     teachers: Sequence[Teacher], ref_adds: Sequence[tuple],
                     ref_subs: Sequence[tuple], key_subs: Sequence[tuple],
                     default: Teacher) -> dict[str, Any]:
    """The challenger's statistics a batch adds and subtracts, in the model's order: its
    items learnt (``learnt``, with ``weights`` and ``teachers``), then the ``ref``
    labels' rows (``ref_adds``); subtracted, the ``ref`` corrections' (``ref_subs``), then
    those of relearnt and forgotten keys (``key_subs``: the item whose row, its label,
    weight and teacher); those of the ``default`` teacher as ``challenger_add`` and
    ``challenger_sub``, the others' as ``challenger_sources`` ``(teacher, add, sub)``, by
    source name. Nothing without a challenger."""
    if challenger is None:
        return {}
    rows = {it.entry_id: c[0].row for it, c in zip(items, ch, strict=True) if c is not None}
    forgets = [sub[0] for sub in key_subs if sub[0].entry_id not in rows]
    if forgets and challenger.featurizer is not None:
        made = challenger.featurizer.featurize_batch([it.msg.as_payload() for it in forgets])
        rows.update((it.entry_id, r) for it, r in zip(forgets, made, strict=True)
                    if not isinstance(r, MalformedMessage))
    elif forgets:
        rows.update((it.entry_id, it.row) for it in forgets)
    adds = [(c[0].row, lab, w, t) for lab, c, w, t in zip(learnt, ch, weights, teachers, strict=True)
            if lab is not None and w is not None] + list(ref_adds)
    subs = list(ref_subs) + [(rows[it.entry_id], lab, w, t) for it, lab, w, t in key_subs
                             if it.entry_id in rows]
    fz, model = challenger.featurizer or featurizer, challenger.model
    by_adds, by_subs = by_teacher(adds), by_teacher(subs)
    return {"challenger_add": batch_stats(model, fz, by_adds.get(default, [])),
            "challenger_sub": batch_stats(model, fz, by_subs.get(default, [])),
            "challenger_sources": [(t, batch_stats(model, fz, by_adds.get(t, [])),
                                    batch_stats(model, fz, by_subs.get(t, [])))
                                   for t in sorted((set(by_adds) | set(by_subs)) - {default})]}


def by_teacher(rows: Sequence[tuple]) -> dict[Teacher, list[tuple]]:
    """Rows ``(row, label, weight, teacher)`` grouped by their teacher."""
    out: dict[Teacher, list[tuple]] = {}
    for row in rows:
        out.setdefault(row[3], []).append(row)
    return out


def batch_stats(model: Any, featurizer: Any, rows: Sequence[tuple[Any, Any, float]]) -> Any:
    """The statistics of ``(row, label, weight)`` rows (None for none)."""
    if not rows:
        return None
    return model.batch_stats(featurizer.stack([r[0] for r in rows]), [r[1] for r in rows],
                             np.array([r[2] for r in rows], dtype=np.float64))


def challenger_output(v: Any) -> dict[str, Any] | None:
    """An output's ``challenger`` map: the challenger's label, score and log posteriors
    (None: no verdict)."""
    if v.label is None:
        return None
    out: dict[str, Any] = {"label": v.label,
                           "log_proba": {k: float(x) for k, x in v.log_proba.items()}}
    if v.score is not None and v.score == v.score and abs(v.score) != float("inf"):
        out["score"] = float(v.score)
    return out


@dataclass(frozen=True, slots=True)
class Promotion:
    """An entry ``{"promote": SPEC}`` of ``:in`` (``streamnb promote``), carried with the
    class removals to the commit, which appends its log entry ``{"t": "promote", "s":
    SPEC}`` in stream order. Every replica applying it makes its challenger the model
    (:func:`promoted`)."""

    spec: str

    def commit_entry(self) -> tuple[bytes, bytes]:
        """(the log entry, a record prefix no learn-once record has: none is released)."""
        return dumps({"t": "promote", "s": self.spec}), b"\xc1"


def promoted(challenger: Challenger | None, spec: Any, name: str, entry_id: str) -> bool:
    """Whether a promote log entry of ``spec`` makes ``challenger`` the model: it must be
    the challenger held (every replica holds the same one, so all decide alike)."""
    if challenger is not None and challenger.spec == spec:
        log.info("model %s: challenger %r promoted (log entry %s)", name, spec, entry_id)
        return True
    log.error("model %s: promote of %r ignored (log entry %s): the challenger held is %r",
              name, spec, entry_id, None if challenger is None else challenger.spec)
    return False


def store_promoted(client: Any, keys: ModelKeys, config: ModelConfig) -> None:
    """The promoted config as the model's stored one, and no challenger any more (every
    worker that applies the promotion writes the same: the log entry is the record)."""
    client.hset(keys.config, mapping=config.to_hash())
    client.delete(challenger_key(keys))
