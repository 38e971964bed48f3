"""A challenger model: a second configuration learnt from the same entries, in the same
prequential order, as the model (docs/worker.md, "A challenger on the same stream").

SPEC (``streamnb worker --challenger SPEC``) is a comma-separated list of ``key=value``
pairs, each overriding one field of the model's stored config: a model parameter of its
kind (``alpha=0.5``, ``fit_prior=false``), a featurizer option (``osb=5``, ``bits=18``) or
``error_weight=1``. Values are JSON (``true``, ``0.5``, ``"x"``) or a bare word. The spec
is stored once in ``{M}:challenger`` (SET NX), so every worker of the model holds the same
challenger; a worker given another spec is refused.

Each worker predicts every item with the challenger too (its own rows when the featurizer
differs); the committing worker puts the challenger's statistics of the batch's own labels,
with the challenger's own error weights, in the delta's ``"c"`` field, and every replica
merges them into its challenger in log order, as it does the model's. Its decays and class
removals are the model's. The snapshot holds it as ``challenger`` (its dumps).

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
from dataclasses import dataclass, replace
from typing import Any

from streamnb.encoding import dumps
from streamnb.exceptions import ConfigConflict
from streamnb.stats.bundle import StatsBundle
from streamnb_workers.store.config_checks import check_error_weight
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelConfig
from streamnb_workers.wire.replies import as_str

__all__ = ["Challenger", "Promotion", "challenger_config", "challenger_key", "parse_spec",
           "promoted", "store_promoted", "stored_spec"]

log = logging.getLogger(__name__)

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

    def reset(self, data: bytes | None = None) -> None:
        """A fresh model, or the one a snapshot holds (``data``: its dumps)."""
        # deferred: the model classes (streamnb.models, ~0.8 s), loaded with the replica's
        from streamnb.models import loads as load_model

        self.model = self.config.make_model() if data is None else load_model(data)

    def to_bytes(self) -> bytes:
        # deferred: the model classes, loaded with the replica's
        from streamnb.models import dumps as dump_model

        return dump_model(self.model)

    def check(self, entry: dict[str, Any]) -> StatsBundle | None:
        """The challenger's delta of a log entry (None: none), checked mergeable."""
        data = entry.get("c")
        if data is None:
            return None
        add = StatsBundle.from_bytes(data)
        self.model.stats.check_mergeable(add)
        return add


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
