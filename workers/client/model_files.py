"""Model files: ``streamnb export`` and ``import``, read by offline ``streamnb predict
--snapshot`` and ``explain --snapshot``.

An exported file is the model envelope of :func:`streamnb.models.dumps` (``type``, ``v``,
``kind``, ``params``, ``stats``) with a few more keys that :func:`streamnb.models.load`
ignores: ``name``, ``featurizer`` (its full config), ``decision`` (decision-rule options),
``half_life``, ``error_weight``, ``log_id`` (the model version exported) and
``exported_at``. So
``streamnb.models.load(FILE)`` gives the Python model, and ``predict --snapshot FILE``
can featurize raw mail exactly as the workers do. The ``data`` field of a
``streamnb:{NAME}:snapshot`` hash, saved to a file, is also accepted (without featurizer
config: the default featurizer is used when its width fits the model).

Import *adds* the file's statistics to the model, as one delta in ``:log`` that every worker
merges; into a model with no statistics that reproduces the exported model. Importing the
same file twice counts it twice.

A model stored with K shards (workers/replication/shards.py) is exported as the sum of its shards
(what its workers predict with); a file is imported into its first shard, which changes
that sum as importing into an unsharded model changes the model. ``--replace`` is refused
on a sharded model: the K shards' statistics cannot be swapped in one transaction.

>>> import numpy as np
>>> from streamnb.models import make_model
>>> m = make_model("multinomial").fit(np.array([[2, 0], [0, 3]]), ["spam", "ham"])
>>> envelope = model_envelope(m, name="mail", featurizer={"bits": 1}, log_id="5-0")
>>> from streamnb.models import loads
>>> loads(dump_envelope(envelope)).predict(np.array([[4, 0]])).tolist()
['spam']
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from redis.exceptions import WatchError

from streamnb.atomic_file import write_atomic
from streamnb.encoding import dumps as pack
from streamnb.encoding import loads as unpack
from streamnb.exceptions import FormatError, SettingsError
from streamnb.features import Featurizer
from streamnb.models import dumps, loads
from streamnb_workers.replication.replica import encode_delta
from streamnb_workers.replication.shards import load_model, shard_names, shard_spec
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config, read_config
from streamnb_workers.wire.replies import as_str

__all__ = [
    "dump_envelope",
    "export_model",
    "featurizer_for",
    "import_model",
    "model_envelope",
    "read_envelope",
]


# ------------------------------------------------------------------------ envelope
def model_envelope(model: Any, **extra: Any) -> dict[str, Any]:
    """The model's file envelope as a map, with ``extra`` keys added."""
    obj = unpack(dumps(model))
    obj.update({k: v for k, v in extra.items() if v is not None})
    return obj


def dump_envelope(envelope: dict[str, Any]) -> bytes:
    return pack(envelope)


def read_envelope(path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
    """(model, envelope map) of a model file; FormatError names the file when it is not one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SettingsError(f"model file {str(path)!r} cannot be read: {exc.strerror}") from None
    try:
        return loads(data), unpack(data)
    except FormatError as exc:
        raise FormatError(f"{path}: not a streamnb model file ({exc})") from None


# ------------------------------------------------------------------------ export/import
def export_model(client: Any, name: str, path: str | os.PathLike[str]) -> str:
    """Write model ``name`` (snapshot + log, config) to ``path``; return a summary."""
    cfg = read_config(client, name)
    if cfg is None:
        raise SettingsError(f"model {name!r} has no config in Redis (no worker has served it)")
    model, version = load_model(client, name)
    envelope = model_envelope(
        model, name=name, featurizer=cfg.featurizer, decision=cfg.decision,
        half_life=cfg.half_life, error_weight=cfg.error_weight, log_id=version,
        exported_at=time.time())
    write_atomic(path, dump_envelope(envelope))
    total = model.stats["classes"].total
    return f"{cfg.kind} model {name!r} at version {version} ({total:g} learnt)"


def import_model(client: Any, name: str, path: str | os.PathLike[str], mode: str = "new") -> str:
    """Import the statistics of a model file into model ``name`` (deltas in ``:log``).

    ``mode``: ``"new"`` refuses a model that holds statistics already (SettingsError);
    ``"add"`` adds the file's to them; ``"replace"`` subtracts the model's own statistics
    and adds the file's, in one transaction that fails if anything was logged meanwhile
    (then it is retried), and drops the model's learn-once keys (what they recorded is
    gone with the statistics). The model's config is created from the file if it has
    none; if it has one, kind, parameters and featurizer must match (else ConfigConflict
    says what differs).
    """
    if mode not in ("new", "add", "replace"):
        raise ValueError(f"mode must be new, add or replace, got {mode!r}")

    model, env = read_envelope(path)
    featurizer = env.get("featurizer")
    spec = ModelSpec(name, kind=model.kind, model_params=model.get_params(),
                     featurizer_config=featurizer,
                     decision=env.get("decision") if featurizer is not None else None,
                     half_life=env.get("half_life"),
                     # a file exported before the error weight existed: every message alike
                     error_weight=env.get("error_weight", 1.0) if featurizer is not None else None)
    try:
        cfg = ensure_config(client, spec)
    except ValueError as exc:
        if type(exc).__name__ == "ConfigConflict":
            raise
        raise SettingsError(f"{path}: cannot create model {name!r} from this file: {exc}") from None
    if cfg.shards > 1 and mode == "replace":
        raise SettingsError(f"model {name!r} has {cfg.shards} shards: --replace cannot swap "
                            "their statistics at once (import into a new model, or --add)")
    total = model.stats["classes"].total
    data = encode_delta(model.stats, None, int(round(total)), "import", f"import:{Path(path).name}")
    keys = ModelKeys(name)
    if cfg.shards > 1:  # into the first shard: the sum changes as the model would
        first = shard_names(name, cfg.shards)[0]
        ensure_config(client, shard_spec(cfg, first))
        keys = ModelKeys(first)
    if mode == "add":
        entry = as_str(client.xadd(keys.log, {"data": data}))
        return f"{cfg.kind} statistics ({total:g} learnt) added as log entry {entry}"
    while True:
        with client.pipeline(transaction=True) as pipe:
            pipe.watch(keys.log)  # a delta logged after this makes the EXEC fail
            held = _held_stats(client, name)
            if held is not None and mode == "new":
                raise SettingsError(
                    f"model {name!r} holds statistics already ({held['classes'].total:g} learnt): "
                    "give --add to add the file's to them or --replace to swap them")
            pipe.multi()
            if held is not None:
                pipe.xadd(keys.log, {"data": encode_delta(None, held, 0, "import",
                                                          f"replace:{Path(path).name}")})
            pipe.xadd(keys.log, {"data": data})
            if mode == "replace":
                pipe.delete(keys.learnt_keys, keys.key_order)
            try:
                entry = as_str(pipe.execute()[1 if held is not None else 0])
            except WatchError:
                continue
        verb = "replaced the model's statistics" if held is not None else "imported"
        return f"{cfg.kind} statistics ({total:g} learnt) {verb} as log entry {entry}"


def _held_stats(client: Any, name: str) -> Any:
    """The statistics model ``name`` holds now (None: none, or all at zero)."""
    model, _ = load_model(client, name)
    try:
        stats = model.stats
    except AttributeError:
        return None
    if not stats["classes"].labels or stats["classes"].total == 0:
        return None
    return stats


def featurizer_for(model: Any, envelope: dict[str, Any], path: Any) -> Any:
    """The featurizer of a model file: its config's, else the default one when its width
    fits the model (FormatError naming ``path`` when it does not)."""
    cfg = envelope.get("featurizer")
    if cfg is not None:
        return Featurizer.from_config(cfg)
    f = Featurizer()
    n = model.get_params().get("n_features")
    if n is not None and n != f.n_columns:
        raise FormatError(
            f"{path} has no featurizer config and its model has {n} features; "
            "write the file with 'streamnb export' to predict from it")
    return f
