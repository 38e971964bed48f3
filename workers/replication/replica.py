"""The local model of one worker: the stored snapshot plus every ``:log`` entry after it.

Every worker applies ``:log`` entries in log order, its own deltas included (a worker
does not merge its delta at commit time; it tails the log right after committing), so
all workers have bit-identical statistics at the same version. The version is the id of
the last log entry applied ("0-0" before any).

Log entries: workers/replication/log_entries.py (deltas, decays, a source forgotten, a
class removed, a challenger promoted).

The snapshot (hash ``:snapshot``): ``log_id`` (the last log entry it includes), ``data``
(``streamnb.models.dumps`` of the model), ``sources`` (its parts by source, if any),
``scores`` (the score window's bytes, with an operating point held), ``challenger`` (its
model's dumps, with a challenger), ``ts``, and ``trimmed`` (the MINID the log was
trimmed to after writing it). A replica whose version is below ``trimmed`` may have missed
entries, so it reloads the snapshot; a late joiner does exactly that. A replica whose last
applied entry is gone although nothing trimmed it (Redis restarted without its last writes,
e.g. a crash under ``appendfsync everysec``) is ahead of the log: it reloads too, or it
would count the redelivered messages twice.

>>> import fakeredis
>>> from streamnb_workers.store.keys import ModelKeys
>>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
>>> r = fakeredis.FakeRedis()
>>> cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 4}))
>>> rep = Replica(r, ModelKeys("doc"), cfg).load()
>>> rep.version
'0-0'
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgpack

from streamnb.exceptions import FormatError
from streamnb.operating_point import ScoreWindow
from streamnb.stats.bundle import StatsBundle
from streamnb_workers.replication.challenger import promoted
from streamnb_workers.replication.log_entries import (
    decode_log_entry,
    encode_class_drop,
    encode_decay,
    encode_delta,
    encode_forget_source,
    forgotten_since,
    score_codes_of,
    score_window_for,
    without_removed,
)
from streamnb_workers.replication.snapshot_codec import decode_snapshot
from streamnb_workers.replication.source_parts import SourceParts, decode_sources
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelConfig
from streamnb_workers.wire.learn_sources import DEFAULT_SOURCE, check_source
from streamnb_workers.wire.replies import as_str, entry_field
from streamnb_workers.wire.stream_ids import entry_time, parse_id

# (the log entries' encoders, kept importable from here)
__all__ = ["TAIL_CHUNK", "Replica", "decode_log_entry", "encode_class_drop", "encode_decay",
           "encode_delta", "encode_forget_source", "log_complete", "snapshot_age"]

log = logging.getLogger(__name__)

#: Log entries fetched per XRANGE while catching up.
TAIL_CHUNK = 500


def log_complete(client: Any, keys: ModelKeys) -> bool:
    """True if no entry was ever removed from ``:log`` (so replaying it from the start gives
    the whole model): Redis 7's ``entries-added`` equals the current length."""
    try:
        info = client.xinfo_stream(keys.log)
    except Exception:  # noqa: BLE001 - no such key: we cannot tell what was there
        return False
    added = info.get("entries-added", info.get(b"entries-added"))
    length = info.get("length", info.get(b"length"))
    return added is not None and length is not None and int(added) == int(length)


class Replica:
    """A model kept equal to snapshot + log (see the module docstring)."""

    def __init__(self, client: Any, keys: ModelKeys, config: ModelConfig) -> None:
        self.client = client
        self.keys = keys
        self.config = config
        self.model: Any = config.make_model()
        #: What each source taught (workers/replication/source_parts.py).
        self.sources = SourceParts()
        #: The window of labelled scores the operating point is fitted on (None: off).
        self.scores = score_window_for(config)
        self.version = "0-0"
        #: Log entries applied since this object was created (deltas and decays).
        self.applied = 0
        #: Messages learnt according to the applied deltas (since the snapshot loaded).
        self.learnt = 0
        self.snapshot_version = "0-0"
        self.reloads = 0
        #: Times the log was found to have gone back behind this replica (Redis lost
        #: writes it had applied: a crash, or a failover to a replica that lagged).
        self.rewinds = 0
        #: Seconds the last :meth:`catch_up` with ``block_ms`` waited for the log to grow.
        self.waited_s = 0.0
        #: Unreadable snapshots met, and unreadable log entries skipped (see the module doc).
        self.snapshot_errors = 0
        self.corrupt_entries = 0
        #: Called as ``on_corrupt(what, detail)`` (what: "snapshot" or "log") for metrics.
        self.on_corrupt: Callable[[str, str], None] | None = None
        #: Called after each change of the model: ``on_change(add, sub)`` after a delta
        #: (the bundles merged and taken off), ``on_change()`` after anything else (a
        #: decay, a snapshot loaded, an entry skipped); workers/replication/shards.py sums shards so.
        self.on_change: Callable[..., None] | None = None
        #: The ``trimmed`` mark of a snapshot ignored as corrupt (it must not cause reloads).
        self._ignored_trim: Any = None
        #: The statistics were dropped to save memory (workers/replication/replica_cache.py):
        #: :attr:`model` is None, nothing is applied, :meth:`load` brings it back.
        self.evicted = False
        #: The challenger learnt from the same entries (workers/replication/challenger.py).
        self.challenger: Any = None

    # ------------------------------------------------------------------ loading
    def load(self) -> Replica:
        """Load the snapshot (if any), then apply the log after it. The log's first read
        from its start goes with the snapshot's, in one round trip: a model without a
        snapshot (a small one: most per-user models) loads in one."""
        self.evicted, self.learnt = False, 0
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.snapshot)
        self.tail_commands(pipe, "0-0")
        snapshot, *first = pipe.execute()
        self._load_snapshot(snapshot)
        self.catch_up(first=first if self.version == "0-0" and not snapshot else None)
        return self

    def evict(self) -> None:
        """Drop the statistics (:attr:`version` stays, as the last one held); until
        :meth:`load`, :meth:`catch_up` and :meth:`apply_own` do nothing. Loaded again,
        the replica is the snapshot plus the log after it, as any replica."""
        self.model, self.sources = None, SourceParts()
        if self.challenger is not None:  # (reset from the snapshot at the load)
            self.challenger.model = None
        self.evicted = True

    def _load_snapshot(self, h: dict | None = None) -> None:
        """The snapshot (``h``: its hash, read by the caller) loaded, or an empty model."""
        h = self.client.hgetall(self.keys.snapshot) if h is None else h
        if not h:
            self.model = self.config.make_model()
            self.sources = SourceParts()
            self.scores = score_window_for(self.config)
            self.version = "0-0"
            if self.challenger is not None:
                self.challenger.reset()
            self._changed()
            return
        h = {as_str(k): v for k, v in h.items()}
        try:
            model, version, sources = decode_snapshot(self.config, h)
        except FormatError as exc:
            self._snapshot_unreadable(h, exc)
            return
        self.model = model
        self.sources = sources
        if self.challenger is not None:
            self.challenger.reset(h.get("challenger"), sources.epochs)
        self.scores = self._decode_scores(h.get("scores"))
        self.version = version
        self.snapshot_version = self.version
        self._ignored_trim = None
        self.reloads += 1
        self._changed()
        log.info("model %s: loaded snapshot at log id %s", self.keys.name, self.version)

    def _decode_scores(self, data: bytes | None) -> ScoreWindow | None:
        """The score window of a snapshot (empty if it holds none, or one that does not
        fit: every replica that loads this snapshot makes the same choice)."""
        window = score_window_for(self.config)
        if window is None or data is None:
            return window
        try:
            return window.load_bytes(data)
        except (FormatError, ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
            log.error("model %s: the snapshot's score window is unreadable (%s); starting an "
                      "empty one", self.keys.name, exc)
            return score_window_for(self.config)

    def _snapshot_unreadable(self, h: dict[str, Any], exc: FormatError) -> None:
        """Ignore a corrupt snapshot if the whole log is there, else refuse with one line."""
        self.snapshot_errors += 1
        if self.on_corrupt is not None:
            self.on_corrupt("snapshot", str(exc))
        if log_complete(self.client, self.keys):
            log.error("model %s: the snapshot in %s is unreadable (%s); ignoring it and rebuilding "
                      "the model from %s, which was never trimmed", self.keys.name,
                      self.keys.snapshot, exc, self.keys.log)
            self.model = self.config.make_model()
            self.sources = SourceParts()
            if self.challenger is not None:  # rebuilt from the whole log with the model
                self.challenger.reset()
            self.scores = score_window_for(self.config)
            self.version = "0-0"
            self.snapshot_version = "0-0"
            self._ignored_trim = h.get("trimmed")
            self._changed()
            return
        raise FormatError(
            f"model {self.keys.name!r}: the snapshot in {self.keys.snapshot} is unreadable ({exc}) "
            f"and {self.keys.log} was trimmed, so the model cannot be rebuilt; restore the key "
            f"from a backup, or delete it to restart the model from zero (losing what it learnt)")

    # ------------------------------------------------------------------ tailing
    def tail_commands(self, pipe: Any, version: str | None = None) -> None:
        """The first read of :meth:`catch_up` from :attr:`version` (or ``version``: three
        commands) added to ``pipe``; their replies, given to :meth:`catch_up` as
        ``first``, save its round trip (a worker tails many replicas in one:
        workers/worker/housekeeping.py ``tail_many``)."""
        v = self.version if version is None else version
        pipe.hmget(self.keys.snapshot, ["trimmed", "log_id"])
        pipe.xrange(self.keys.log, min=f"({v}", max="+", count=TAIL_CHUNK)
        pipe.xrange(self.keys.log, min=v, max=v, count=1)

    def catch_up(self, limit: int | None = None, batches: set[str] | None = None,
                 block_ms: int | None = None, first: list | None = None) -> int:
        """Apply every log entry after ``version``; return how many were applied.

        ``batches``: gets the ``:inflight`` field of every announced batch whose commit was
        applied (the log entry names it; workers/replication/ordering.py). ``block_ms``: wait that long
        at most for a first entry (``XREAD BLOCK``, with the checks behind it in the same
        round trip: Redis answers them once the entry is there); 0 if none came, and
        :attr:`waited_s` is how long that round trip took. ``first``: the replies of
        :meth:`tail_commands`, sent by the caller, as the first read."""
        self.waited_s = 0.0
        if self.evicted:
            return 0
        done = 0
        checked = False
        while limit is None or done < limit:
            if first is not None and block_ms is None:
                replies, first = first, None
            else:
                pipe = self.client.pipeline(transaction=False)
                if block_ms is not None:
                    pipe.xread({self.keys.log: self.version}, count=TAIL_CHUNK, block=block_ms)
                pipe.hmget(self.keys.snapshot, ["trimmed", "log_id"])
                if block_ms is None:
                    pipe.xrange(self.keys.log, min=f"({self.version}", max="+", count=TAIL_CHUNK)
                if not checked:
                    pipe.xrange(self.keys.log, min=self.version, max=self.version, count=1)
                t0 = time.perf_counter()
                replies = pipe.execute()
            if block_ms is None:
                (trimmed, snap_id), entries, *own = replies
            else:  # a trim before the read shows in the checks behind it
                read, (trimmed, snap_id), *own = replies
                entries = read[0][1] if read else []
                block_ms, self.waited_s = None, time.perf_counter() - t0
            if trimmed is not None and trimmed != self._ignored_trim and \
                    parse_id(self.version) < self._trim_mark(trimmed):
                log.warning("model %s: log trimmed past version %s; reloading the snapshot",
                            self.keys.name, self.version)
                self._load_snapshot()
                continue
            if not checked:
                checked = True
                if self._went_backwards(own[0], snap_id):
                    self.rewinds += 1
                    log.warning("model %s: log entry %s applied here is no longer in Redis (Redis "
                                "lost writes: a crash with appendfsync everysec, or a failover to a "
                                "replica that lagged); reloading the snapshot and the log",
                                self.keys.name, self.version)
                    self._load_snapshot()
                    continue
            for entry_id, fields in entries:
                self.apply(as_str(entry_id), fields)
                done += 1
                if batches is not None and (name := entry_field(fields, "inflight")) is not None:
                    batches.add(as_str(name))
            if len(entries) < TAIL_CHUNK:
                break
        return done

    def _went_backwards(self, own: list, snap_id: Any) -> bool:
        """True if the log entry this replica applied last is gone although nothing trimmed
        it: Redis restarted without its last writes, so this model is ahead of the log and
        must reload, or it would count the redelivered messages twice."""
        if self.version == "0-0" or own:
            return False
        return snap_id is None or as_str(snap_id) != self.version

    @staticmethod
    def _trim_mark(trimmed: Any) -> tuple[int, int]:
        try:
            return parse_id(trimmed)
        except (ValueError, UnicodeDecodeError):
            return (0, 0)  # a garbled mark: decided by _load_snapshot, never a reload loop

    def apply_own(self, entry_id: str, data: bytes, prev_id: str | None) -> bool:
        """Apply the log entry ``entry_id`` that this worker's commit just wrote with
        ``data``, without reading it back, if it follows this replica's version directly:
        the log's last entry before it (``prev_id``, the commit script's reply) is the one
        applied last here. That is what the next :meth:`catch_up` would read and apply (the
        same bytes, so the same model); False, and nothing done, otherwise (a
        :meth:`catch_up` applies it with the entries before it).

        >>> import fakeredis
        >>> import numpy as np
        >>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
        >>> r = fakeredis.FakeRedis()
        >>> cfg = ensure_config(r, ModelSpec("own", kind="multinomial", featurizer_config={"bits": 4}))
        >>> rep = Replica(r, ModelKeys("own"), cfg).load()
        >>> delta = rep.model.batch_stats(np.array([[1.0] * 16]), ["ham"])
        >>> data = encode_delta(delta, None, 1, "w1", "b1")
        >>> rep.apply_own("5-0", data, prev_id="4-0"), rep.version  # 4-0 not applied here
        (False, '0-0')
        >>> rep.apply_own("5-0", data, prev_id=""), rep.version     # an empty log: tail it
        (False, '0-0')
        >>> first = r.xadd(ModelKeys("own").log, {"data": data}).decode()
        >>> rep.catch_up(), rep.version == first, rep.learnt
        (1, True, 1)
        >>> rep.apply_own("9999999999999-0", data, prev_id=first), rep.version, rep.learnt
        (True, '9999999999999-0', 2)
        """
        if self.evicted or not prev_id or prev_id != self.version:
            return False
        self.apply(entry_id, {"data": data})
        return True

    def apply(self, entry_id: str, fields: dict) -> None:
        """Apply one log entry (called in log order only), validated whole before any change."""
        data = entry_field(fields, "data")
        try:
            if data is None:
                raise FormatError("log entry has no 'data' field")
            entry = decode_log_entry(data)
            if entry["t"] == "decay":
                g = entry.get("g")
                if not isinstance(g, (int, float)) or isinstance(g, bool) or not 0.0 < g <= 1.0:
                    raise FormatError(f"decay factor must be a number in (0, 1], got {g!r}")
                self.model = self.sources.decay(self.config, self.model, float(g))
                if self.challenger is not None:
                    self.challenger.decay(float(g))
                self._changed()
            elif entry["t"] == "forget":  # (since a time: checked whole before any change)
                name, (since, taught, ch_taught) = check_source(entry.get("s")), \
                    forgotten_since(entry)
                taught = self.sources.since_part(self.model, name, taught)
                ch = self.challenger
                ch_taught = ch.sources.since_part(ch.model, name, ch_taught) if ch else None
                self.model = self.sources.forget(self.config, self.model, name, taught, since)
                if ch is not None:
                    ch.forget(name, ch_taught, since)
                self._changed()
            elif entry["t"] == "promote":  # the challenger becomes the model
                if promoted(self.challenger, entry.get("s"), self.keys.name, entry_id):
                    self.model, self.config = self.challenger.model, self.challenger.config
                    self.sources.promoted(self.challenger.sources.parts)
                    self.challenger, self.scores = None, score_window_for(self.config)
                self._changed()
            elif entry["t"] == "drop":
                label = entry.get("c")
                if not isinstance(label, (str, int)) or isinstance(label, bool):
                    raise FormatError(f"a class to remove must be a str or an int, got {label!r}")
                if self.sources.drop(self.model, label):
                    log.info("model %s: class %r removed (log entry %s)", self.keys.name,
                             label, entry_id)
                if self.challenger is not None:
                    self.challenger.drop(label)
                self._changed()
            else:
                n = entry.get("n", 0)
                if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                    raise FormatError(f"learnt count must be an int >= 0, got {n!r}")
                add = StatsBundle.from_bytes(entry["add"]) if entry.get("add") is not None else None
                sub = StatsBundle.from_bytes(entry["sub"]) if entry.get("sub") is not None else None
                codes = score_codes_of(entry)
                contributions = decode_sources(entry, add, sub)
                ch = self.challenger.check(entry) if self.challenger is not None else None
                if contributions is not None:  # with sources: the parts and their sum
                    self.model = self.sources.apply(self.config, self.model, contributions)
                    plain = False
                else:
                    plain = self._apply_default(add, sub)
                if ch is not None:
                    self.challenger.apply(ch)
                self.learnt += n
                if self.scores is not None and codes:
                    self.scores.add(codes)
                self._changed(*((add, sub) if plain else ()))
        except (FormatError, ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
            # Every replica skips the same entry, so they stay equal; say so loudly.
            self.corrupt_entries += 1
            if self.on_corrupt is not None:
                self.on_corrupt("log", str(exc))
            log.error("model %s: skipping unreadable log entry %s: %s", self.keys.name, entry_id, exc)
            self._changed()
        self.version = entry_id
        self.applied += 1

    def _apply_default(self, add: StatsBundle | None, sub: StatsBundle | None) -> bool:
        """A delta of the default source's first epoch; True if applied as merges of the
        model alone (no sources about: the plain case)."""
        if self.sources.parts or self.sources.epochs:
            self.model = self.sources.apply(self.config, self.model,
                                            [(DEFAULT_SOURCE, 0, add, sub)])
            return False
        for delta in (add, sub):
            if delta is not None:
                self.model.stats.check_mergeable(delta)
        if add is not None:
            self.model.merge_stats(add)
        if sub is not None:
            self.model.subtract_stats(without_removed(self.model, sub))
        return True

    @property
    def epochs(self) -> dict[str, int]:
        """The current epoch of each source (workers/wire/learn_sources.py)."""
        return self.sources.epochs

    def _changed(self, add: StatsBundle | None = None, sub: StatsBundle | None = None) -> None:
        if self.on_change is not None:
            self.on_change(add, sub)

    @property
    def version_time(self) -> float:
        """Unix time of the version's log entry (0 before any)."""
        return entry_time(self.version)


def snapshot_age(client: Any, keys: ModelKeys) -> float | None:
    """Seconds since the stored snapshot was written (None if there is none)."""
    ts = client.hget(keys.snapshot, "ts")
    return None if ts is None else max(0.0, time.time() - float(as_str(ts)))
