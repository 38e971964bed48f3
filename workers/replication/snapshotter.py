"""Lease-holder duties: snapshots, log trimming, stream gauges, removing dead consumers.

One worker per model holds the lease ``:lease`` (``SET NX PX``, renewed by a
compare-and-set script while it runs). Every ``every_n`` applied log entries or
``interval_s`` seconds it writes ``:snapshot`` from its replica (statistics as of its
version L) and trims ``:log`` with ``XTRIM MINID`` to ``min(L, L - margin_ms)``: never an
entry the snapshot does not include. The write script checks, atomically, that the writer
still holds the lease, that the snapshot moves forward (a paused former holder cannot
write an older one) and that its log id is still in the log (a replica that applied entries
Redis then lost in a crash cannot store them); it records the trim point so lagging replicas know to reload.

>>> import fakeredis
>>> from streamnb_workers.store.keys import ModelKeys
>>> r, k = fakeredis.FakeRedis(), ModelKeys("doc")
>>> a, b = Snapshotter(r, k, "w1"), Snapshotter(r, k, "w2")
>>> a.hold_lease(), b.hold_lease(), a.hold_lease()
(True, False, True)
>>> a.release(); b.hold_lease()
True
"""

from __future__ import annotations

import logging
import time
from typing import Any

from streamnb.encoding import loads
from streamnb_workers.replication.replica import Replica
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.lua import LuaScript
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import parse_id

log = logging.getLogger(__name__)

_ACQUIRE = LuaScript("""
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
""")

_RELEASE = LuaScript("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")

# KEYS: lease, snapshot, log. ARGV: consumer, log id, data, ts, minid, sources ('': none),
# score window ('': none), challenger ('': none).
_WRITE = LuaScript("""
local function id(s)
  local ms, seq = string.match(s, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'not_holder' end
local cur = redis.call('HGET', KEYS[2], 'log_id')
if cur then
  local cm, cs = id(cur)
  local nm, ns = id(ARGV[2])
  -- a garbled stored log_id (a corrupt snapshot) is overwritten, never compared
  if cm and (nm < cm or (nm == cm and ns <= cs)) then return 'stale' end
end
if #redis.call('XRANGE', KEYS[3], ARGV[2], ARGV[2]) == 0 then return 'missing' end
redis.call('HSET', KEYS[2], 'log_id', ARGV[2], 'data', ARGV[3], 'ts', ARGV[4], 'trimmed', ARGV[5])
redis.call('HDEL', KEYS[2], 'restored_at')
if ARGV[6] == '' then redis.call('HDEL', KEYS[2], 'sources')
else redis.call('HSET', KEYS[2], 'sources', ARGV[6]) end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[2], 'scores', ARGV[7])
else redis.call('HDEL', KEYS[2], 'scores') end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[2], 'challenger', ARGV[8])
else redis.call('HDEL', KEYS[2], 'challenger') end
redis.call('XTRIM', KEYS[3], 'MINID', ARGV[5])
return 'ok'
""")


# KEYS: :in. ARGV: group, consumer. Deletes the consumer only if nothing is pending for it,
# in one step: checked first and deleted after, a batch read in between would be dropped
# from the group's pending list with the consumer, never processed.
_DELETE_IDLE_CONSUMER = LuaScript("""
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
""")


def trim_point(log_id: str, margin_ms: int) -> str:
    """The MINID to trim to: ``margin_ms`` before ``log_id``, never after it.

    >>> trim_point("5000-7", 1000), trim_point("5000-7", 0)
    ('4000-0', '5000-7')
    """
    ms, seq = parse_id(log_id)
    if margin_ms <= 0:
        return f"{ms}-{seq}"
    return f"{max(0, ms - margin_ms)}-0"


class Snapshotter:
    """Holds (or tries to hold) one model's lease and writes its snapshots."""

    def __init__(self, client: Any, keys: ModelKeys, consumer: str, lease_ms: int = 15000,
                 every_n: int = 1000, interval_s: float = 60.0, margin_ms: int = 60000) -> None:
        self.client = client
        self.keys = keys
        self.consumer = consumer
        self.lease_ms = int(lease_ms)
        self.every_n = int(every_n)
        self.interval_s = float(interval_s)
        self.margin_ms = int(margin_ms)
        self.holder = False
        self._last_write = time.monotonic()
        self.applied_at_last = 0
        self.written = 0

    def hold_lease(self) -> bool:
        """Acquire or renew the lease; True while this worker holds it."""
        self.holder = bool(_ACQUIRE(self.client, [self.keys.lease], [self.consumer, self.lease_ms]))
        return self.holder

    def lease_command(self, pipe: Any) -> None:
        """:meth:`hold_lease`'s script added to ``pipe``; its reply to :meth:`leased`."""
        pipe.evalsha(_ACQUIRE.sha, 1, self.keys.lease, self.consumer, self.lease_ms)

    def leased(self, reply: Any) -> bool:
        """The reply of :meth:`lease_command` (an error, e.g. the script not loaded: the
        lease acquired or renewed alone, as :meth:`hold_lease`)."""
        if isinstance(reply, Exception):
            return self.hold_lease()
        self.holder = bool(reply)
        return self.holder

    def release(self) -> None:
        _RELEASE(self.client, [self.keys.lease], [self.consumer])
        self.holder = False

    def due(self, replica: Replica, final: bool = False) -> bool:
        """A snapshot is due after ``every_n`` new log entries or ``interval_s`` seconds,
        or (``final``, at shutdown) as soon as anything was applied since the last one."""
        new = replica.applied - self.applied_at_last
        if new <= 0 or replica.version == "0-0" or replica.evicted:
            return False
        return final or new >= self.every_n or time.monotonic() - self._last_write >= self.interval_s

    def maybe_write(self, replica: Replica, force: bool = False, final: bool = False) -> bool:
        """Write a snapshot if this worker holds the lease and one is due (or ``force``)."""
        if not self.holder or replica.evicted or not (force or self.due(replica, final)):
            return False
        return self.write(replica)

    def write(self, replica: Replica) -> bool:
        """Write ``replica`` as the snapshot and trim the log; False if refused."""
        # deferred: the model classes (streamnb.models, ~0.8 s) load with the first write
        from streamnb.models import dumps as dump_model

        data = dump_model(replica.model)
        minid = trim_point(replica.version, self.margin_ms)
        res = _WRITE(self.client, [self.keys.lease, self.keys.snapshot, self.keys.log],
                     [self.consumer, replica.version, data, repr(time.time()), minid,
                      replica.sources.encode(),
                      replica.scores.to_bytes() if replica.scores is not None else b"",
                      replica.challenger.to_bytes() if replica.challenger is not None else b""])
        res = as_str(res)
        self._last_write = time.monotonic()
        self.applied_at_last = replica.applied
        if res == "ok":
            self.written += 1
            log.info("model %s: snapshot at %s (%d bytes), log trimmed to %s",
                     self.keys.name, replica.version, len(data), minid)
            return True
        if res == "not_holder":
            self.holder = False
        elif res == "missing":
            log.warning("model %s: not writing a snapshot at %s: that log entry is not in Redis "
                        "(Redis lost writes); the replica reloads", self.keys.name, replica.version)
        return False


# ------------------------------------------------------------------ heartbeats and gauges
def read_heartbeats(client: Any, keys: ModelKeys, listed: dict | None = None,
                    ) -> dict[str, dict[str, Any]]:
    """consumer -> heartbeat map (ts, pid, host, version, models) of every worker listed
    (``listed``: ``:workers`` as read by the caller)."""
    out = {}
    for name, raw in (client.hgetall(keys.workers) if listed is None else listed).items():
        try:
            hb = loads(raw)
        except Exception:  # noqa: BLE001 - a garbled heartbeat is just not live
            continue
        if isinstance(hb, dict):
            out[as_str(name)] = hb
    return out


def live_workers(client: Any, keys: ModelKeys, stale_s: float, listed: dict | None = None,
                 ) -> dict[str, dict[str, Any]]:
    """Workers whose last heartbeat is younger than ``stale_s`` seconds (``listed``: as
    :func:`read_heartbeats`)."""
    now = time.time()
    return {k: v for k, v in read_heartbeats(client, keys, listed).items()
            if now - float(v.get("ts", 0)) <= stale_s}


def delete_consumer_if_idle(client: Any, keys: ModelKeys, consumer: str) -> bool:
    """Delete ``consumer`` from the group if nothing is pending for it (one script, so a
    batch it reads meanwhile is never dropped with it); True if deleted."""
    return bool(_DELETE_IDLE_CONSUMER(client, [keys.input], [GROUP, consumer]))


def remove_dead_consumers(client: Any, keys: ModelKeys, stale_s: float, me: str) -> list[str]:
    """Delete group consumers with no fresh heartbeat and no pending entry; drop stale
    heartbeats. Returns the consumers removed."""
    live = live_workers(client, keys, stale_s)
    removed = []
    for c in client.xinfo_consumers(keys.input, GROUP):
        name = as_str(c["name"])
        if name == me or name in live or int(c.get("pending", 0)) > 0:
            continue
        if float(c.get("idle", 0)) / 1000.0 < stale_s:
            continue
        if delete_consumer_if_idle(client, keys, name):
            removed.append(name)
    stale = [k for k in read_heartbeats(client, keys) if k not in live and k != me]
    if stale:
        client.hdel(keys.workers, *stale)
    return removed


def stream_gauges(client: Any, keys: ModelKeys) -> dict[str, Any]:
    """XLEN of each stream, group lag and pending (lag falls back to XLEN when NULL)."""
    pipe = client.pipeline(transaction=False)
    for k in (keys.input, keys.out, keys.dead, keys.log):
        pipe.xlen(k)
    n_in, n_out, n_dead, n_log = pipe.execute()
    lag = pending = None
    try:
        for g in client.xinfo_groups(keys.input):
            gname = as_str(g["name"])
            if gname == GROUP:
                pending = int(g.get("pending", 0))
                lag = g.get("lag")
    except Exception:  # noqa: BLE001 - no stream or no group yet
        pass
    if lag is None:  # NULL after trimming past unread entries: an upper bound
        lag = n_in
    return {"in": n_in, "out": n_out, "dead": n_dead, "log": n_log,
            "lag": int(lag), "pending": int(pending or 0)}
