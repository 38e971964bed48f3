"""Take out what one source taught a model since a time (``streamnb forget --source NAME
--since TIME``), exactly, once, and alike on every replica.

The model's parts hold no time and a learn-once key's record holds no row, but the log
holds every contribution with its time: a delta entry's id is the time of its commit, and
it names each source's rows (workers/replication/source_parts.py). So, per shard:

1. sum the contributions of the source's current epoch in every delta since the time
   (the log must still hold them all: ``:log`` is trimmed ``--log-keep`` behind the
   snapshots, ``trim_margin_ms``; a trim point after the time is refused);
2. in one script (workers/store/scripts/forget_since.lua), if the log holds nothing newer
   than what was summed (else the new entries are summed and the script sent again):
   start the source's next epoch, release its learn-once keys learnt since the time
   (``{M}:keyorder`` scores a key by the time of the delta that learnt or relearnt it),
   move those learnt before to the new epoch, and append ``{"t": "forget", "s": NAME,
   "since": ms, "a": <the sum>}``, which every replica applies at the same place: the
   source's part less the sum, in the new epoch (workers/replication/replica.py).

Step 1 runs for every shard before step 2 runs for any. A commit in flight that teaches
under the old epoch lands applied nowhere, as for a whole source forgotten. Refused, as
not exact (one line, nothing written): a decay, a class removal, a promotion, or a forget
of the same source since a later time, in the log since the time, and a contribution of
the source since then that subtracts (a forget or a correction of what it taught: its
key's record would then disagree with the statistics).

>>> since_ms("2026-12-07T10:00:00Z"), since_ms("2026-12-07"), since_ms("1796637600")
(1796637600000, 1796601600000, 1796637600000)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgpack

from streamnb.exceptions import SettingsError
from streamnb.stats.bundle import StatsBundle
from streamnb_workers.client.shard_streams import shard_keys
from streamnb_workers.replication.log_entries import decode_log_entry, encode_forget_source
from streamnb_workers.replication.source_parts import decode_sources
from streamnb_workers.store.keys import ModelKeys, source_epochs_key
from streamnb_workers.store.lua import packaged_script
from streamnb_workers.wire.learn_sources import DEFAULT_SOURCE, check_source
from streamnb_workers.wire.replies import as_str, entry_field
from streamnb_workers.wire.stream_ids import parse_id

__all__ = ["SinceForget", "forget_source_since", "since_ms"]

SCRIPT = packaged_script("forget_since.lua")
#: Log entries read per XRANGE.
CHUNK = 500
#: Times the script is sent again while the log grows meanwhile.
ATTEMPTS = 50


def since_ms(text: str) -> int:
    """A TIME of ``--since`` in ms since the epoch: an ISO 8601 date or time (UTC unless
    it names its offset) or seconds since the epoch; ValueError (one line) else."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ValueError(f"expected an ISO 8601 time (2026-12-07T10:00:00Z) or seconds "
                             f"since the epoch, got {text!r}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp()
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a time after 1970, got {text!r}")
    return int(round(seconds * 1000))


@dataclass(slots=True)
class SinceForget:
    """What one shard's forget took out: the log entry (None: the source taught it
    nothing since the time), the weight taken out per class, the learn-once keys
    released (learnt since the time) and kept (learnt before)."""

    shard: str
    entry: str | None = None
    weight: dict[Any, float] = field(default_factory=dict)
    released: int = 0
    kept: int = 0


def _packed(*values: Any) -> bytes:
    return b"".join(msgpack.packb(v, use_bin_type=True) for v in values)


def _refusal(model: str, entry_id: str, source: str, since: int,
             entry: dict[str, Any]) -> str | None:
    """Why a non-delta log entry since the time makes the forget inexact (None: it does
    not). A forget of the source took out what it taught before it under older epochs,
    which the sum leaves out, unless it kept some of what it taught after ``since``."""
    kind = entry["t"]
    if kind == "forget" and (entry.get("s") != source or entry.get("since") is None or
                             entry["since"] <= since):
        return None
    what = {"decay": "a decay (--half-life)", "drop": "a class removal",
            "promote": "a challenger's promotion",
            "forget": f"a forget of what source {source!r} taught since a later time"}[kind]
    return (f"model {model!r}: the log holds {what} at {entry_id}, after the time: what "
            f"{source!r} taught since cannot be taken out exactly; give a later --since")


class _Sum:
    """The contributions of one source's epoch read so far from one shard's log."""

    def __init__(self, model: str, source: str, epoch: int, since: int) -> None:
        self.model, self.source, self.epoch, self.since = model, source, epoch, since
        self.taught: Any = None
        #: What the source taught the challenger (workers/replication/challenger.py).
        self.challenger: Any = None
        self.subtractions = 0

    def add_entries(self, entries: list[tuple[Any, Any]]) -> None:
        for entry_id, fields in entries:
            data = entry_field(fields, "data")
            entry = decode_log_entry(data)
            if entry["t"] != "delta":
                why = _refusal(self.model, as_str(entry_id), self.source, self.since, entry)
                if why is not None:
                    raise SettingsError(why)
                continue
            self.taught = self._add(self.taught, entry, entry.get("add"), entry.get("sub"),
                                    entry.get("src"))
            if any(entry.get(f) is not None for f in ("c", "cs", "csrc")):
                self.challenger = self._add(self.challenger, entry, entry.get("c"),
                                            entry.get("cs"), entry.get("csrc"))

    def _add(self, total: Any, entry: dict[str, Any], add: Any, sub: Any, src: Any) -> Any:
        """``total`` plus the source's rows of one delta's ``add``/``sub``/``src``."""
        add, sub = _bundle(add), _bundle(sub)
        for name, e, a, s in decode_sources({"e": entry.get("e", 0), "src": src}, add, sub) \
                or [(DEFAULT_SOURCE, 0, add, sub)]:
            if name != self.source or e != self.epoch:
                continue
            if s is not None and not s.is_empty():
                self.subtractions += 1
            if a is not None:
                total = a if total is None else total.merge(a)
        return total


def _bundle(data: bytes | None) -> Any:
    return None if data is None else StatsBundle.from_bytes(data)


def _read_range(client: Any, keys: ModelKeys, start: str, end: str) -> list[tuple[Any, Any]]:
    """The log entries from ``start`` (an XRANGE bound) to ``end`` included."""
    out: list[tuple[Any, Any]] = []
    while True:
        got = client.xrange(keys.log, start, end, count=CHUNK)
        out += got
        if len(got) < CHUNK:
            return out
        start = "(" + as_str(got[-1][0])


class _Shard:
    """One shard's forget: what is summed so far (up to the log entry ``summed``)."""

    def __init__(self, client: Any, model: str, keys: ModelKeys, source: str, since: int) -> None:
        self.client, self.keys, self.source, self.since = client, keys, source, since
        self.epoch = int(as_str(client.hget(source_epochs_key(keys), source) or b"0"))
        self.total = _Sum(model, source, self.epoch, since)
        self.summed: str | None = None
        self.end = ""

    def read_on(self) -> None:
        """Sum the log entries since the last read; SettingsError where not exact."""
        trimmed = self.client.hget(self.keys.snapshot, "trimmed")
        if trimmed is not None and parse_id(as_str(trimmed)) > (self.since, 0):
            raise SettingsError(
                f"model {self.keys.name!r}: its log reaches back to {as_str(trimmed)} only "
                "(kept --log-keep behind the snapshots): give a later --since")
        newest = self.client.xrevrange(self.keys.log, "+", "-", count=1)
        self.end = as_str(newest[0][0]) if newest else ""
        if self.end and parse_id(self.end) >= (self.since, 0) and self.end != self.summed:
            self.total.add_entries(_read_range(self.client, self.keys, f"({self.summed}"
                                               if self.summed else f"{self.since}-0", self.end))
            self.summed = self.end
        if self.total.subtractions:
            raise SettingsError(
                f"model {self.keys.name!r}: {self.total.subtractions} log entries since the "
                f"time take off rows {self.source!r} taught (forgets or corrections): --since "
                "would leave their keys' records wrong; forget the whole source, or give a "
                "later --since")

    def apply(self) -> SinceForget:
        """Send the script until the log holds nothing newer than what was summed."""
        keys, source, epoch, total = self.keys, self.source, self.epoch, self.total
        for attempt in range(ATTEMPTS):
            if attempt:
                self.read_on()
            if total.taught is None:
                return SinceForget(keys.name)
            reply = SCRIPT(self.client, [keys.log, source_epochs_key(keys), keys.learnt_keys,
                                         keys.key_order, keys.snapshot],
                           [source, epoch, self.since, self.end,
                            encode_forget_source(source, self.since, total.taught,
                                                 total.challenger),
                            _packed(source, epoch), _packed(source, epoch + 1),
                            "1" if (source, epoch) == (DEFAULT_SOURCE, 0) else "0"])
            status = as_str(reply[0])
            if status == "ok":
                return SinceForget(keys.name, as_str(reply[1]), total.taught["classes"].as_dict(),
                                   int(reply[2]), int(reply[3]))
            if status == "trimmed":
                raise SettingsError(
                    f"model {keys.name!r}: its log reaches back to {as_str(reply[1])} only "
                    "(kept --log-keep behind the snapshots): give a later --since")
            if status == "epoch":
                raise SettingsError(f"source {source!r} of model {keys.name!r} was forgotten "
                                    "meanwhile: run the command again")
        raise SettingsError(f"model {keys.name!r}: the log kept growing past "
                            f"{self.end or 'its start'} over {ATTEMPTS} tries; run the command "
                            "again")


def forget_source_since(client: Any, model: str, source: str, since: int) -> list[SinceForget]:
    """Take out what ``source`` taught ``model`` (each of its shards) since ``since`` (ms
    since the epoch); SettingsError (one line) where that cannot be done exactly (module
    docstring): every shard's log is read and checked before any is written."""
    check_source(source)
    shards = [_Shard(client, model, keys, source, int(since)) for keys in shard_keys(client, model)]
    for shard in shards:
        shard.read_on()
    return [shard.apply() for shard in shards]
