"""A model's status (``streamnb status``): what it knows and how its streams are doing.

:func:`collect` returns a JSON-friendly map; ``--json`` prints it as is. Keys (also in
docs/cli.md):

- ``model`` (str), ``exists`` (bool: the model has a stored config), ``redis`` (URL,
  password redacted);
- ``kind`` (str | null), ``config`` (``model_params``, ``featurizer``, ``decision``,
  ``half_life``, ``error_weight``, ``training``; null when absent), ``training_waiting``
  (entries in ``:train`` not yet moved into ``:in``: workers/store/training.py);
- ``classes`` (label -> learnt weight; labels as strings), ``learnt_total`` (float),
  ``sources`` (source -> {label -> weight it taught}; docs/worker.md, "Sources"),
  ``version`` (last ``:log`` id applied, ``"0-0"`` before any);
- ``streams``: ``in``, ``out``, ``dead``, ``log`` (XLEN of each);
- ``lag`` (entries not yet delivered to the group), ``lag_exact`` (false when Redis reports
  no lag after trimming and ``lag`` is the XLEN upper bound), ``pending`` (delivered, not
  acknowledged), ``dead_letters`` (XLEN of ``:dead``);
- ``snapshot``: ``log_id``, ``age_s`` (null when there is no snapshot);
- ``workers``: list of ``{"name", "host", "pid", "age_s", "version"}`` with a fresh
  heartbeat (a worker writes one every few seconds while it reaches Redis);
- ``learnt`` (messages learnt, ``:learnt``), ``received`` and ``predicted`` (entries ever
  added to ``:in`` and ``:out``, trimmed ones included: Redis' ``entries-added``);
- ``model_version``: ``{"learnt", "log_id", "time"}``, the version as the count of
  messages learnt and the time of the last log entry (unix seconds; null before any);
- ``recent``: over the last ``last`` outputs of ``:out``: ``outputs``, ``labelled`` (those
  with a true label, predicted before it was learnt), ``accuracy`` (share of those whose
  decision was the true label; null without any), ``per_second`` (outputs per second over
  the last minute, or over the span of those outputs when they are all younger),
  ``last_age_s`` (seconds since the last output; null without any);
- ``shards``: one map per statistics shard (workers/replication/shards.py; one for a model that is not
  sharded, named as the model) with its ``name``, ``streams``, ``lag``, ``lag_exact``,
  ``pending``, ``learnt``, ``received``, ``predicted``, ``version`` and ``snapshot``. For
  a sharded model the figures above are the shards' sums; ``version`` is the shards'
  versions joined by ``,``, ``model_version.time`` the latest of their times,
  ``snapshot`` the shards' log ids joined and the oldest age (null unless every shard has
  one), ``recent`` is over the last outputs of all shards and ``workers`` those with a
  fresh heartbeat in any shard.

>>> import fakeredis
>>> info = collect(fakeredis.FakeRedis(), "nothing")
>>> info["exists"], info["streams"]["in"], info["workers"]
(False, 0, [])
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from streamnb_workers.client.shard_streams import last_merged
from streamnb_workers.defaults import DEFAULT_STATUS_LAST
from streamnb_workers.replication.replica import snapshot_age
from streamnb_workers.replication.shards import keys_of, load_replicas, source_weights
from streamnb_workers.replication.snapshotter import live_workers, stream_gauges
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.model_config import read_config
from streamnb_workers.store.redaction import redact_url
from streamnb_workers.store.training import train_stream
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import entry_time

__all__ = ["DEFAULT_LAST", "HEARTBEAT_STALE_S", "collect", "format_text", "recent_outputs"]

#: A worker whose heartbeat is older than this is not listed as live.
HEARTBEAT_STALE_S = 30.0
#: Outputs of ``:out`` that ``recent`` looks at by default.
DEFAULT_LAST = DEFAULT_STATUS_LAST
#: Seconds over which ``recent.per_second`` counts outputs.
THROUGHPUT_WINDOW_S = 60.0


def _entries_added(client: Any, key: str) -> int:
    """Entries ever added to stream ``key`` (0 if there is none)."""
    try:
        info = client.xinfo_stream(key)
    except Exception:  # noqa: BLE001 - no such stream yet
        return 0
    added = info.get("entries-added", info.get(b"entries-added"))
    return int(added) if added is not None else int(info.get("length", 0))


def recent_outputs(client: Any, keys: ModelKeys | Sequence[ModelKeys], last: int,
                   now: float | None = None) -> dict[str, Any]:
    """Prequential accuracy and throughput over the last ``last`` outputs of ``:out`` (of
    the ``:out`` of each of ``keys``, when a list: a sharded model's), keys in the module
    docstring.

    >>> import fakeredis, msgpack
    >>> r, k = fakeredis.FakeRedis(), ModelKeys("doc")
    >>> for label, true in [("spam", "spam"), ("ham", "spam"), ("ham", None), ("ham", "ham")]:
    ...     _ = r.xadd(k.out, {"data": msgpack.packb({"label": label, "true_label": true})})
    >>> info = recent_outputs(r, k, last=10)
    >>> info["outputs"], info["labelled"], info["accuracy"]
    (4, 3, 0.6667)
    """
    now = time.time() if now is None else now
    if isinstance(keys, ModelKeys):
        entries = client.xrevrange(keys.out, count=last) if last > 0 else []
    else:
        entries = last_merged(client, [k.out for k in keys], last)[::-1]
    labelled = right = 0
    times = []
    for entry_id, fields in entries:
        times.append(entry_time(as_str(entry_id)))
        try:
            out = decode_output(fields[b"data"] if b"data" in fields else fields["data"])
        except Exception:  # noqa: BLE001 - not an output this package wrote
            continue
        true = out.get("true_label")
        if true is None:
            continue
        labelled += 1
        right += out.get("label") == true
    window = [t for t in times if now - t <= THROUGHPUT_WINDOW_S]
    if times and len(window) == len(times) and len(times) > 1 and times[0] > times[-1]:
        per_second = (len(times) - 1) / (times[0] - times[-1])  # every one is younger
    else:
        per_second = len(window) / THROUGHPUT_WINDOW_S
    return {"outputs": len(entries), "labelled": labelled,
            "accuracy": round(right / labelled, 4) if labelled else None,
            "per_second": round(per_second, 3),
            "last_age_s": round(max(0.0, now - times[0]), 3) if times else None}


def _lag_is_reported(client: Any, keys: ModelKeys) -> bool:
    try:
        for g in client.xinfo_groups(keys.input):
            if as_str(g["name"]) == GROUP:
                return g.get("lag") is not None
    except Exception:  # noqa: BLE001 - no stream or no group yet: lag 0 is exact
        return True
    return True


def _shard_figures(client: Any, keys: ModelKeys) -> dict[str, Any]:
    """One model's (or shard's) streams, group and counters (``version``: filled in by
    the caller, which loads the model)."""
    gauges = stream_gauges(client, keys)
    log_id = client.hget(keys.snapshot, "log_id")
    return {
        "name": keys.name,
        "streams": {k: int(gauges[k]) for k in ("in", "out", "dead", "log")},
        "lag": int(gauges["lag"]),
        "lag_exact": _lag_is_reported(client, keys),
        "pending": int(gauges["pending"]),
        "learnt": int(as_str(client.get(keys.learnt) or b"0")),
        "received": _entries_added(client, keys.input),
        "predicted": _entries_added(client, keys.out),
        "version": "0-0",
        "snapshot": None if log_id is None else {"log_id": as_str(log_id),
                                                 "age_s": snapshot_age(client, keys)},
    }


def _summed_snapshot(shards: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The model's ``snapshot`` from its shards' (module docstring).

    >>> _summed_snapshot([{"snapshot": {"log_id": "5-0", "age_s": 2.0}},
    ...                   {"snapshot": {"log_id": "7-0", "age_s": 9.5}}])
    {'log_id': '5-0,7-0', 'age_s': 9.5}
    >>> _summed_snapshot([{"snapshot": {"log_id": "5-0", "age_s": 2.0}}, {"snapshot": None}])
    """
    snaps = [sh["snapshot"] for sh in shards]
    if len(snaps) == 1 or any(snap is None for snap in snaps):
        return snaps[0] if len(snaps) == 1 else None
    ages = [snap["age_s"] for snap in snaps if snap["age_s"] is not None]
    return {"log_id": ",".join(snap["log_id"] for snap in snaps),
            "age_s": max(ages) if ages else None}


def _live_workers(client: Any, shards: list[ModelKeys], stale_s: float) -> dict[str, dict]:
    """The workers with a fresh heartbeat in any of ``shards`` (the freshest of each)."""

    live: dict[str, dict] = {}
    for keys in shards:
        for name, hb in live_workers(client, keys, stale_s).items():
            if name not in live or float(hb.get("ts", 0)) > float(live[name].get("ts", 0)):
                live[name] = hb
    return live


def collect(client: Any, name: str, redis_url: str | None = None,
            stale_s: float = HEARTBEAT_STALE_S, last: int = DEFAULT_LAST) -> dict[str, Any]:
    """Status of model ``name`` as a map (keys in the module docstring); ``last``: outputs
    that ``recent`` looks at."""

    cfg = read_config(client, name)
    shard_keys = keys_of(name, 1 if cfg is None else cfg.shards)
    shards = [_shard_figures(client, keys) for keys in shard_keys]
    info: dict[str, Any] = {
        "model": name,
        "exists": cfg is not None,
        "redis": redact_url(redis_url) if redis_url else None,
        "kind": cfg.kind if cfg else None,
        "config": None,
        "classes": {},
        "sources": {},
        "learnt_total": 0.0,
        "version": "0-0",
        "streams": {k: sum(sh["streams"][k] for sh in shards)
                    for k in ("in", "out", "dead", "log")},
        "lag": sum(sh["lag"] for sh in shards),
        "lag_exact": all(sh["lag_exact"] for sh in shards),
        "pending": sum(sh["pending"] for sh in shards),
        "dead_letters": sum(sh["streams"]["dead"] for sh in shards),
        "snapshot": _summed_snapshot(shards),
        "workers": [],
        "learnt": sum(sh["learnt"] for sh in shards),
        "received": sum(sh["received"] for sh in shards),
        "predicted": sum(sh["predicted"] for sh in shards),
        "model_version": None,
        "recent": recent_outputs(client, shard_keys[0] if len(shard_keys) == 1 else shard_keys,
                                 last),
        "shards": shards,
        "training_waiting": sum(int(client.xlen(train_stream(keys))) for keys in shard_keys)
        if cfg is not None and cfg.training == "train" else 0,
    }
    if cfg is not None:
        info["config"] = {"model_params": cfg.model_params, "featurizer": cfg.featurizer,
                          "decision": cfg.decision, "half_life": cfg.half_life,
                          "error_weight": cfg.error_weight, "training": cfg.training}
        model, version, replicas = load_replicas(client, name)
        info["sources"] = source_weights(replicas)
        counts = model.stats["classes"]
        info["classes"] = {str(k): float(v) for k, v in counts.as_dict().items()}
        info["learnt_total"] = float(counts.total)
        info["version"] = version
        for shard, shard_version in zip(shards, version.split(","), strict=True):
            shard["version"] = shard_version
        times = [entry_time(sh["version"]) for sh in shards if sh["version"] != "0-0"]
        info["model_version"] = {"learnt": info["learnt"], "log_id": version,
                                 "time": max(times) if times else None}
    now = time.time()
    for worker, hb in sorted(_live_workers(client, shard_keys, stale_s).items()):
        info["workers"].append({
            "name": worker, "host": hb.get("host"), "pid": hb.get("pid"),
            "age_s": round(max(0.0, now - float(hb.get("ts", now))), 3),
            "version": hb.get("version"),
        })
    return info


def format_text(info: dict[str, Any]) -> str:
    """The status map as a few aligned lines for a terminal."""
    lines = [f"model      {info['model']}" + (f"  ({info['redis']})" if info.get("redis") else "")]
    if not info["exists"]:
        lines.append("           no stored config: no worker has served this model yet")
    else:
        lines.append(f"kind       {info['kind']}")
        mv = info.get("model_version") or {}
        when = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(mv["time"]))
                if mv.get("time") else "never")
        lines.append(f"version    {mv.get('learnt', 0)} learnt, last at {when} (log {info['version']})")
        lines.append(f"messages   received {info['received']}  predicted {info['predicted']}  "
                     f"learnt {info['learnt']}")
        lines.append(f"classes    weight {info['learnt_total']:g}")
        for label, n in sorted(info["classes"].items(), key=lambda kv: -kv[1]):
            lines.append(f"  {label:<16} {n:g}")
        lines.append(f"sources    {len(info.get('sources') or {})}")
        for source, weights in (info.get("sources") or {}).items():
            by_class = "  ".join(f"{k} {v:g}" for k, v in sorted(weights.items()))
            lines.append(f"  {source:<16} weight {sum(weights.values()):g}  ({by_class})")
        rec = info.get("recent") or {}
        acc = (f"{100 * rec['accuracy']:.1f}% of {rec['labelled']} labelled"
               if rec.get("accuracy") is not None else "no labelled message")
        lines.append(f"recent     last {rec.get('outputs', 0)} outputs: accuracy {acc}; "
                     f"{rec.get('per_second', 0):g}/s"
                     + (f"; last {rec['last_age_s']:.0f} s ago" if rec.get("last_age_s") is not None
                        else ""))
    s = info["streams"]
    lag = f"{info['lag']}" + ("" if info["lag_exact"] else " (upper bound: XLEN)")
    lines.append(f"streams    in {s['in']}  out {s['out']}  dead {s['dead']}  log {s['log']}")
    lines.append(f"group      lag {lag}  pending {info['pending']}")
    lines.append(f"dead       {info['dead_letters']}")
    if (info.get("config") or {}).get("training") == "train":
        lines.append(f"training   from :train, {info['training_waiting']} waiting")
    if len(info.get("shards") or []) > 1:
        lines.append(f"shards     {len(info['shards'])} (figures above: their sums)")
        for sh in info["shards"]:
            st = sh["streams"]
            lines.append(f"  {sh['name']:<16} in {st['in']}  out {st['out']}  dead {st['dead']}  "
                         f"log {st['log']}  lag {sh['lag']}  pending {sh['pending']}  "
                         f"learnt {sh['learnt']}  version {sh['version']}")
    snap = info.get("snapshot")
    if snap:
        age = snap["age_s"]
        lines.append(f"snapshot   at {snap['log_id']}" + (f", {age:.0f} s old" if age is not None else ""))
    workers = info["workers"]
    lines.append(f"workers    {len(workers)} live")
    for w in workers:
        lines.append(f"  {w['name']:<24} host {w['host']} pid {w['pid']} (seen {w['age_s']:.1f} s ago)")
    return "\n".join(lines)
