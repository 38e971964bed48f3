"""The local model of one worker: the stored snapshot plus every ``:log`` entry after it.

Every worker applies ``:log`` entries in log order, its own deltas included (a worker
does not merge its delta at commit time; it tails the log right after committing), so
all workers have bit-identical statistics at the same version. The version is the id of
the last log entry applied ("0-0" before any).

Log entries (field ``data``, msgpack):

- ``{"t": "delta", "add": bytes | None, "sub": bytes | None, "n": int, "w": worker, "b": batch}``:
  merge the encoded StatsBundle ``add``, then subtract ``sub`` (label corrections move a
  message's contribution: +row for the new class in ``add``, -row for the old in ``sub``).
- ``{"t": "decay", "g": float}``: multiply every learnt weight by ``g`` (forgetting).

The snapshot (hash ``:snapshot``): ``log_id`` (the last log entry it includes), ``data``
(``streamnb.models.dumps`` of the model), ``ts``, and ``trimmed`` (the MINID the log was
trimmed to after writing it). A replica whose version is below ``trimmed`` may have missed
entries, so it reloads the snapshot; a late joiner does exactly that.

>>> import fakeredis
>>> from workers.keys import ModelKeys
>>> from workers.model_config import ModelSpec, ensure_config
>>> r = fakeredis.FakeRedis()
>>> cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 4}))
>>> rep = Replica(r, ModelKeys("doc"), cfg).load()
>>> rep.version
'0-0'
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgpack

from streamnb.encoding import dumps, loads
from streamnb.exceptions import FormatError
from streamnb.stats.bundle import StatsBundle
from workers.keys import ModelKeys
from workers.model_config import ModelConfig

log = logging.getLogger(__name__)

#: Log entries fetched per XRANGE while catching up.
TAIL_CHUNK = 500


def parse_id(entry_id: Any) -> tuple[int, int]:
    """``"1700000000000-3"`` -> ``(1700000000000, 3)``; compares stream ids correctly."""
    s = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    ms, _, seq = s.partition("-")
    return int(ms), int(seq or 0)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def encode_delta(add: StatsBundle | None, sub: StatsBundle | None, n_learnt: int,
                 worker: str, batch: str) -> bytes:
    """A delta log entry (see the module docstring)."""
    return dumps({"t": "delta", "add": add.to_bytes() if add is not None else None,
                  "sub": sub.to_bytes() if sub is not None else None,
                  "n": int(n_learnt), "w": worker, "b": batch})


def encode_decay(g: float) -> bytes:
    """A decay log entry: multiply every learnt weight by ``g``."""
    return dumps({"t": "decay", "g": float(g)})


def decode_log_entry(data: bytes) -> dict[str, Any]:
    obj = loads(data)
    if not isinstance(obj, dict) or obj.get("t") not in ("delta", "decay"):
        raise FormatError("log entry is not a delta or decay map")
    return obj


class Replica:
    """A model kept equal to snapshot + log (see the module docstring)."""

    def __init__(self, client: Any, keys: ModelKeys, config: ModelConfig) -> None:
        self.client = client
        self.keys = keys
        self.config = config
        self.model: Any = config.make_model()
        self.version = "0-0"
        #: Log entries applied since this object was created (deltas and decays).
        self.applied = 0
        #: Messages learnt according to the applied deltas (since the snapshot loaded).
        self.learnt = 0
        self.snapshot_version = "0-0"
        self.reloads = 0

    # ------------------------------------------------------------------ loading
    def load(self) -> Replica:
        """Load the snapshot (if any), then apply the log after it."""
        self._load_snapshot()
        self.catch_up()
        return self

    def _load_snapshot(self) -> None:
        h = self.client.hgetall(self.keys.snapshot)
        if not h:
            self.model = self.config.make_model()
            self.version = "0-0"
            return
        h = {_s(k): v for k, v in h.items()}
        from streamnb.models import loads as load_model

        model = load_model(h["data"])
        if model.kind != self.config.kind:
            raise FormatError(
                f"snapshot of {self.keys.name!r} holds a {model.kind} model, config says {self.config.kind}")
        self.model = model
        self.version = _s(h["log_id"])
        self.snapshot_version = self.version
        self.reloads += 1
        log.info("model %s: loaded snapshot at log id %s", self.keys.name, self.version)

    # ------------------------------------------------------------------ tailing
    def catch_up(self, limit: int | None = None) -> int:
        """Apply every log entry after ``version``; return how many were applied."""
        done = 0
        while limit is None or done < limit:
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(self.keys.snapshot, "trimmed")
            pipe.xrange(self.keys.log, min=f"({self.version}", max="+", count=TAIL_CHUNK)
            trimmed, entries = pipe.execute()
            if trimmed is not None and parse_id(self.version) < parse_id(trimmed):
                log.warning("model %s: log trimmed past version %s; reloading the snapshot",
                            self.keys.name, self.version)
                self._load_snapshot()
                continue
            for entry_id, fields in entries:
                self.apply(_s(entry_id), fields)
                done += 1
            if len(entries) < TAIL_CHUNK:
                break
        return done

    def apply(self, entry_id: str, fields: dict) -> None:
        """Apply one log entry (called in log order only)."""
        data = fields.get(b"data", fields.get("data"))
        try:
            entry = decode_log_entry(data)
            if entry["t"] == "decay":
                self.model.decay(float(entry["g"]))
            else:
                if entry.get("add") is not None:
                    self.model.merge_stats(StatsBundle.from_bytes(entry["add"]))
                if entry.get("sub") is not None:
                    self.model.subtract_stats(StatsBundle.from_bytes(entry["sub"]))
                self.learnt += int(entry.get("n", 0))
        except (FormatError, ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
            # Every replica skips the same entry, so they stay equal; say so loudly.
            log.error("model %s: skipping unreadable log entry %s: %s", self.keys.name, entry_id, exc)
        self.version = entry_id
        self.applied += 1

    @property
    def version_time(self) -> float:
        """Unix time of the version's log entry (0 before any)."""
        return parse_id(self.version)[0] / 1000.0


def load_model(client: Any, name: str) -> tuple[Any, str]:
    """The current model of ``name`` (snapshot + log) and its version, for status/export.

    Raises LookupError if the model has no stored config.
    """
    from workers.model_config import read_config

    cfg = read_config(client, name)
    if cfg is None:
        raise LookupError(f"model {name!r} has no config in Redis (no worker has served it)")
    rep = Replica(client, ModelKeys(name), cfg).load()
    return rep.model, rep.version


def snapshot_age(client: Any, keys: ModelKeys) -> float | None:
    """Seconds since the stored snapshot was written (None if there is none)."""
    ts = client.hget(keys.snapshot, "ts")
    return None if ts is None else max(0.0, time.time() - float(_s(ts)))
