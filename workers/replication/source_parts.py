"""What each source taught a replica, and the model as their sum (docs/worker.md,
"Sources").

A replica's model is the sum of one statistics part per source (workers/wire/learn_sources.py),
as a sharded model is the sum of its shards (workers/replication/shards.py). While only
the default source has taught the model, that sum is the model itself and no part is
kept (nothing is held twice, and a model learnt without sources is the one it always
was). The first contribution of another source splits it: the model's statistics so far
become the default source's part, and from then on every contribution goes to its
source's part and to the sum, in log order.

A delta log entry carries the default source's ``add``/``sub`` (of its epoch ``e``,
absent: 0) and ``src``, a list of ``[source, epoch, add, sub]``; a contribution whose
epoch is older than its source's current one was taken out with that source and is
applied nowhere. A ``{"t": "forget", "s": NAME}`` entry drops NAME's part, starts its
next epoch and takes the sum anew from the parts left, in source-name order: the model
is then bit for bit the sum of what the other sources taught (for the count kinds with
whole weights, equal to the model that only they taught; Gaussian merges round).

>>> import fakeredis, numpy as np
>>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
>>> cfg = ensure_config(fakeredis.FakeRedis(), ModelSpec("d", kind="multinomial",
...                                                    featurizer_config={"bits": 2}))
>>> parts, model = SourceParts(), cfg.make_model()
>>> a = model.batch_stats(np.array([[1.0, 0, 2, 0]]), ["ham"])
>>> b = model.batch_stats(np.array([[0, 3.0, 0, 1]]), ["spam"])
>>> model = parts.apply(cfg, model, [("default", 0, a, None), ("imap", 0, b, None)])
>>> sorted(parts.weights(model).items())
[('default', {'ham': 1.0}), ('imap', {'spam': 1.0})]
>>> model = parts.forget(cfg, model, "imap")
>>> model.stats["features"].toarray().tolist(), parts.epochs
([[1.0, 0.0, 2.0, 0.0]], {'imap': 1})
>>> parts.apply(cfg, model, [("imap", 0, b, None)]) is model  # of the forgotten epoch
True
>>> model.stats["features"].toarray().tolist()
[[1.0, 0.0, 2.0, 0.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamnb.encoding import dumps, loads
from streamnb.exceptions import FormatError
from streamnb.stats.bundle import StatsBundle
from streamnb_workers.replication.log_entries import without_removed
from streamnb_workers.wire.learn_sources import DEFAULT_SOURCE, check_source

__all__ = ["Contribution", "SourceParts", "decode_sources"]

#: ``(source, epoch, add, sub)``: what one source's rows of a delta add and take off.
Contribution = tuple[str, int, Any, Any]


def decode_sources(entry: dict[str, Any], add: Any, sub: Any) -> list[Contribution] | None:
    """The contributions of a delta log entry whose ``add``/``sub`` were decoded (None:
    the default source's first epoch alone, the plain case)."""
    epoch, src = entry.get("e", 0), entry.get("src")
    if not epoch and not src:
        return None
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise FormatError(f"default source epoch must be an int >= 0, got {epoch!r}")
    out: list[Contribution] = [(DEFAULT_SOURCE, epoch, add, sub)]
    if not isinstance(src, (list, type(None))):
        raise FormatError("src must be a list of [source, epoch, add, sub]")
    for item in src or ():
        if not isinstance(item, list) or len(item) != 4:
            raise FormatError("src must be a list of [source, epoch, add, sub]")
        name, e, a, s = item
        try:
            check_source(name)
        except ValueError as exc:
            raise FormatError(str(exc)) from None
        if not isinstance(e, int) or isinstance(e, bool) or e < 0:
            raise FormatError(f"source epoch must be an int >= 0, got {e!r}")
        out.append((name, e, StatsBundle.from_bytes(a) if a is not None else None,
                    StatsBundle.from_bytes(s) if s is not None else None))
    return out


class SourceParts:
    """The parts of a model by source and each source's epoch (module docstring)."""

    def __init__(self) -> None:
        #: source -> its statistics; empty while the default source alone taught.
        self.parts: dict[str, StatsBundle] = {}
        #: source -> its epoch (absent: 0): how many times it was forgotten.
        self.epochs: dict[str, int] = {}

    def live(self, contributions: Sequence[Contribution]) -> list[Contribution]:
        """The contributions of a source's current epoch that change something."""
        return [c for c in contributions if c[1] == self.epochs.get(c[0], 0) and
                (c[2] is not None or c[3] is not None)]

    def apply(self, config: Any, model: Any, contributions: Sequence[Contribution]) -> Any:
        """Apply a delta's contributions to the parts and to ``model`` (the sum); return
        the model. Raises FormatError/ValueError before any change if one does not fit."""
        live = self.live(contributions)
        # (a sub row of a class neither held nor added went with a removed class)
        held = set(model.stats["classes"].labels)
        for _, _, add, _ in live:
            if add is not None:
                held.update(add["classes"].labels)
        live = [(name, e, add, sub if sub is None else without_removed(held, sub))
                for name, e, add, sub in live]
        for _, _, add, sub in live:
            for delta in (add, sub):
                if delta is not None:
                    model.stats.check_mergeable(delta)
        if not live:
            return model
        if not self.parts and any(c[0] != DEFAULT_SOURCE for c in live):
            self.parts[DEFAULT_SOURCE] = model.stats.copy()
        if self.parts:
            for name, _, add, sub in live:
                part = self.parts.get(name)
                if part is None:
                    part = self.parts[name] = config.make_model().stats
                if add is not None:
                    part.merge(add)
                if sub is not None:
                    part.subtract(sub)
        for _, _, add, sub in live:
            if add is not None:
                model.merge_stats(add)
            if sub is not None:
                model.subtract_stats(sub)
        return model

    def since_part(self, model: Any, source: str, taught: Any) -> Any:
        """``taught`` as :meth:`forget` takes it out of ``source``'s part (its classes
        removed since left out); ValueError if that part does not hold it."""
        part = self.parts.get(source) if self.parts else \
            model.stats if source == DEFAULT_SOURCE else None
        if taught is None or part is None:
            return taught
        taught = without_removed(part["classes"].labels, taught)
        part.check_subtractable(taught)
        return taught

    def forget(self, config: Any, model: Any, source: str, taught: Any = None,
               since: bool = False) -> Any:
        """Take out all ``source`` taught, start its next epoch; return the model.
        ``since``: take out only ``taught`` (what it taught since a time, checked by
        :meth:`since_part`; None: nothing), the rest staying its part, in the new epoch."""
        self.epochs[source] = self.epochs.get(source, 0) + 1
        if not self.parts:  # the default source alone taught
            if source != DEFAULT_SOURCE:
                return model
            if not since:
                return config.make_model()
            if taught is not None:
                model.subtract_stats(taught)
            return model
        if since:
            if taught is None or source not in self.parts:
                return model
            self.parts[source].subtract(taught)
        elif self.parts.pop(source, None) is None:
            return model
        return self.total(config)

    def drop(self, model: Any, label: Any) -> bool:
        """Remove class ``label`` from ``model`` and from every part; whether the model
        held it (log entry ``drop``: workers/replication/log_entries.py)."""
        for part in self.parts.values():
            if label in part["classes"].labels:
                part.remove_class(label)
        return bool(model.remove_class(label))

    def promoted(self, parts: dict[str, StatsBundle]) -> None:
        """The challenger became the model (log entry ``promote``): its ``parts`` by
        source are the model's; the epochs, which the challenger's follow, stay."""
        self.parts = parts

    def decay(self, config: Any, model: Any, g: float) -> Any:
        """Multiply every learnt weight by ``g``; return the model."""
        if not self.parts:
            return model.decay(g)
        for part in self.parts.values():
            part.scale(g)
        return self.total(config)

    def total(self, config: Any) -> Any:
        """The sum of the parts, taken anew in source-name order."""
        model = config.make_model()
        for name in sorted(self.parts):
            model.merge_stats(self.parts[name].copy())
        return model

    def weights(self, model: Any) -> dict[str, dict[Any, float]]:
        """source -> {class: weight learnt} (the default source's is the model's when it
        alone taught)."""
        parts = self.parts or {DEFAULT_SOURCE: model.stats}
        out = {}
        for name, part in parts.items():
            classes = part["classes"]
            out[name] = {lab: float(w) for lab, w in zip(classes.labels, classes.counts, strict=True)}
        return out

    # ------------------------------------------------------------------ snapshots
    def encode(self) -> bytes:
        """What a snapshot holds of them (b"" for nothing: no parts, no epochs)."""
        if not self.parts and not self.epochs:
            return b""
        return dumps({"parts": {k: v.to_bytes() for k, v in self.parts.items()},
                      "epochs": dict(self.epochs)})

    def load(self, data: bytes | None) -> None:
        """Restore them from :meth:`encode`'s bytes (None or b"": none)."""
        self.parts, self.epochs = {}, {}
        if not data:
            return
        obj = loads(data)
        if not isinstance(obj, dict) or not isinstance(obj.get("parts"), dict) or \
                not isinstance(obj.get("epochs"), dict):
            raise FormatError("snapshot sources are not a map of parts and epochs")
        self.parts = {str(k): StatsBundle.from_bytes(v) for k, v in obj["parts"].items()}
        self.epochs = {str(k): int(v) for k, v in obj["epochs"].items()}
