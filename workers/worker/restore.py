"""A model's keys written back after Redis came back without them (restarted without
persistence, or its data lost): the stored config, the consumer group and, from the
replica a worker holds in memory, the snapshot.

A worker checks after every reconnect and after a ``NOGROUP`` reply
(:func:`restore_lost_keys`). One round trip says whether anything is missing; only then
does the worker send its replica, to one script that writes, atomically and only what is
still missing: the config (as the worker holds it); if Redis holds no log entry while the
worker's replica is past ``0-0``, the replica as the snapshot, with the worker as lease
holder, unless a snapshot written back by another worker is at the same version or later;
and the consumer group (read from ``0``: entries produced since the restart are served).
The group waits :func:`settle_ms` after the first snapshot written back, so that every
worker that was running offers its replica before anything new is learnt, and the most
advanced one (the one that had applied the most of the log) becomes the snapshot. The
snapshot is marked trimmed at its own version, so every worker whose replica is at
another version reloads it (workers/replication/replica.py): every replica is again the same.

What Redis lost besides is not restored: entries of ``:in`` not yet learnt, ``:out``,
``:dead``, the delayed-label cache (late labels of earlier messages go to ``:dead``), and
the learnt count that paces forgetting (docs/operations.md, "Redis came back empty").

>>> import fakeredis
>>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
>>> r = fakeredis.FakeRedis()
>>> cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 4}))
>>> _ = r.flushall()
>>> restore_model_keys(r, cfg, "w1", "5-0", b"model bytes", lease_ms=1000)
['config', 'snapshot', 'group']
>>> r.hget("streamnb:{doc}:snapshot", "log_id"), r.get("streamnb:{doc}:lease")
(b'5-0', b'w1')
>>> missing_keys(r, ModelKeys("doc"), "5-0")
[]
"""

from __future__ import annotations

import logging
import time
from typing import Any

from streamnb_workers.replication.shards import shard_spec
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.lua import LuaScript
from streamnb_workers.store.model_config import ModelConfig, ensure_config
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import parse_id
from streamnb_workers.worker.runtime import ModelRuntime

__all__ = ["missing_keys", "restore_lost_keys", "restore_model_keys", "restore_models",
           "settle_ms"]

log = logging.getLogger("streamnb.worker")

# KEYS: config, :in, snapshot, :log, lease. ARGV: group, consumer, lease_ms, version
# ("0-0": no snapshot offered), data, settle_ms, now (unix ms), the snapshot's parts by
# source ('': none), its score window ('': none), then the config's
# field/value pairs. Returns what it wrote (config, snapshot, group), and "settling" while
# the group waits for the other workers' replicas.
_RESTORE = LuaScript("""
local function id(s)
  local ms, seq = string.match(s, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local now = tonumber(ARGV[7])
local wrote = {}
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 10))
  wrote[#wrote + 1] = 'config'
end
if ARGV[4] ~= '0-0' and redis.call('XLEN', KEYS[4]) == 0 then
  local snap = redis.call('HMGET', KEYS[3], 'log_id', 'restored_at')
  local newer = false
  if snap[1] and snap[2] then
    local cm, cs = id(snap[1])
    local nm, ns = id(ARGV[4])
    newer = cm ~= nil and (nm > cm or (nm == cm and ns > cs))
  end
  if redis.call('EXISTS', KEYS[3]) == 0 or newer then
    redis.call('HSET', KEYS[3], 'log_id', ARGV[4], 'data', ARGV[5], 'ts', now / 1000,
               'trimmed', ARGV[4], 'restored_at', snap[2] or now)
    if ARGV[8] == '' then redis.call('HDEL', KEYS[3], 'sources')
    else redis.call('HSET', KEYS[3], 'sources', ARGV[8]) end
    if ARGV[9] ~= '' then redis.call('HSET', KEYS[3], 'scores', ARGV[9])
    else redis.call('HDEL', KEYS[3], 'scores') end
    redis.call('SET', KEYS[5], ARGV[2], 'PX', ARGV[3])
    wrote[#wrote + 1] = 'snapshot'
  end
end
local ty = redis.call('TYPE', KEYS[2])['ok']
if ty == 'none' or ty == 'stream' then
  local since = tonumber(redis.call('HGET', KEYS[3], 'restored_at'))
  if since and redis.call('XLEN', KEYS[4]) == 0 and now - since < tonumber(ARGV[6]) then
    wrote[#wrote + 1] = 'settling'
  else
    local r = redis.pcall('XGROUP', 'CREATE', KEYS[2], ARGV[1], '0', 'MKSTREAM')
    if type(r) == 'table' and r['ok'] then wrote[#wrote + 1] = 'group' end
  end
end
return wrote
""")


def settle_ms(backoff_cap_s: float) -> int:
    """How long the group waits after the first snapshot written back: two of the longest
    reconnection waits (and at least a second), so every worker that was running when
    Redis went away is back and can offer its replica.

    >>> settle_ms(5.0), settle_ms(0.1)
    (10000, 1000)
    """
    return int(max(1.0, 2.0 * backoff_cap_s) * 1000)


def missing_keys(client: Any, keys: ModelKeys, version: str) -> list[str]:
    """What of the model Redis lacks, in one round trip: ``config``, ``group`` (the
    consumer group of ``:in``), ``snapshot`` (a replica at ``version`` holds learnt
    statistics while Redis has no log entry and no snapshot, or only one written back at
    an earlier version)."""
    pipe = client.pipeline(transaction=False)
    pipe.exists(keys.config)
    pipe.hmget(keys.snapshot, ["log_id", "restored_at"])
    pipe.xlen(keys.log)
    pipe.xinfo_groups(keys.input)
    has_config, snap, n_log, groups = pipe.execute(raise_on_error=False)
    for reply in (has_config, snap, n_log):  # (groups: an error if :in is gone)
        if isinstance(reply, Exception):
            raise reply  # Redis is away (e.g. CLUSTERDOWN): retried as such
    snap_id, restored_at = snap
    missing = []
    if not has_config:
        missing.append("config")
    if isinstance(groups, Exception) or not any(as_str(g["name"]) == GROUP for g in groups):
        missing.append("group")
    if version != "0-0" and not n_log and (
            snap_id is None or (restored_at is not None
                                and parse_id(as_str(snap_id)) < parse_id(version))):
        missing.append("snapshot")
    return missing


def restore_model_keys(client: Any, config: ModelConfig, consumer: str, version: str,
                       data: bytes, lease_ms: int, settle_ms: int = 0,
                       sources: bytes = b"", scores: bytes = b"") -> list[str]:
    """Write what of the model is still missing (see the module docstring); returns what
    was written (``config``, ``snapshot``, ``group``), and ``settling`` while the group
    waits ``settle_ms`` after the first snapshot written back for more advanced ones.
    ``scores``: the replica's score window, written with the snapshot (b"": none)."""
    keys = ModelKeys(config.name)
    flat: list[str] = []
    for k, v in config.to_hash().items():
        flat += [k, v]
    wrote = _RESTORE(client, [keys.config, keys.input, keys.snapshot, keys.log, keys.lease],
                     [GROUP, consumer, int(lease_ms), version, data, int(settle_ms),
                      int(time.time() * 1000), sources, scores, *flat])
    return [as_str(w) for w in wrote or []]


def restore_lost_keys(rt: ModelRuntime) -> list[str]:
    """Check model ``rt`` and write back what Redis lost; returns what this worker wrote
    (empty when nothing was missing or another worker restored it first), ``settling``
    among them while the group is not made yet (call again soon)."""
    # deferred: the model classes (streamnb.models, ~0.8 s) load with the first restore
    from streamnb.models import dumps as dump_model

    replica = rt.replica
    missing = missing_keys(rt.client, rt.keys, replica.version)
    if not missing:
        return []
    # else the model is not sent (megabytes, every 0.25 s); an evicted replica has none
    offer = "snapshot" in missing and not replica.evicted
    wrote = restore_model_keys(rt.client, rt.config, rt.consumer,
                               replica.version if offer else "0-0",
                               dump_model(replica.model) if offer else b"",
                               rt.options.lease_ms, settle_ms(rt.options.backoff_cap_s),
                               replica.sources.encode() if offer else b"",
                               replica.scores.to_bytes()
                               if offer and replica.scores is not None else b"")
    if "snapshot" in wrote:
        # this worker now holds the lease; its replica is the snapshot
        rt.snapshotter.holder = True
        rt.snapshotter.written += 1
        rt.snapshotter.applied_at_last = replica.applied
        replica.snapshot_version = replica.version
    done = [w for w in wrote if w != "settling"]
    if done:
        rt.series(rt.metrics.redis_restores).inc()
        log.warning("model %s: Redis came back without the model's keys; wrote back its %s "
                    "from this worker%s", rt.name, ", ".join(done),
                    f" (the snapshot: this worker's replica at {replica.version})"
                    if "snapshot" in wrote else "")
    return wrote


def restore_models(client: Any, sharded: list[ModelConfig], models: list[ModelRuntime]) -> bool:
    """What Redis lost of every model a worker serves written back (:func:`restore_lost_keys`;
    ``sharded``: the configs that record shards, written back first); True while a
    model's group waits for the other workers' replicas ("settling")."""
    for cfg in sharded:
        ensure_config(client, shard_spec(cfg))
    settling = False
    for rt in models:
        settling |= "settling" in restore_lost_keys(rt)
        rt.timers.gauges.due_at_once()
    return settling
