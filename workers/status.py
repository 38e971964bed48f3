"""``streamnb status``: what a model knows and how its streams are doing.

:func:`collect` returns a JSON-friendly map; ``--json`` prints it as is. Keys (also in
docs/cli.md):

- ``model`` (str), ``exists`` (bool: the model has a stored config), ``redis`` (URL,
  password redacted);
- ``kind`` (str | null), ``config`` (``model_params``, ``featurizer``, ``decision``,
  ``half_life``, ``error_weight``; null when absent);
- ``classes`` (label -> learnt weight; labels as strings), ``learnt_total`` (float),
  ``version`` (last ``:log`` id applied, ``"0-0"`` before any);
- ``streams``: ``in``, ``out``, ``dead``, ``log`` (XLEN of each);
- ``lag`` (entries not yet delivered to the group), ``lag_exact`` (false when Redis reports
  no lag after trimming and ``lag`` is the XLEN upper bound), ``pending`` (delivered, not
  acknowledged), ``dead_letters`` (XLEN of ``:dead``);
- ``snapshot``: ``log_id``, ``age_s`` (null when there is no snapshot);
- ``workers``: list of ``{"name", "host", "pid", "age_s"}`` with a fresh heartbeat.

>>> import fakeredis
>>> info = collect(fakeredis.FakeRedis(), "nothing")
>>> info["exists"], info["streams"]["in"], info["workers"]
(False, 0, [])
"""

from __future__ import annotations

import time
from typing import Any

from streamnb_workers.keys import GROUP, ModelKeys
from streamnb_workers.redaction import redact_url
from streamnb_workers.replies import as_str

__all__ = ["HEARTBEAT_STALE_S", "collect", "format_text"]

#: A worker whose heartbeat is older than this is not listed as live.
HEARTBEAT_STALE_S = 30.0


def _lag_is_reported(client: Any, keys: ModelKeys) -> bool:
    try:
        for g in client.xinfo_groups(keys.input):
            if as_str(g["name"]) == GROUP:
                return g.get("lag") is not None
    except Exception:  # noqa: BLE001 - no stream or no group yet: lag 0 is exact
        return True
    return True


def collect(client: Any, name: str, redis_url: str | None = None,
            stale_s: float = HEARTBEAT_STALE_S) -> dict[str, Any]:
    """Status of model ``name`` as a map (keys in the module docstring)."""
    from streamnb_workers.model_config import read_config
    from streamnb_workers.snapshotter import live_workers, stream_gauges

    keys = ModelKeys(name)
    cfg = read_config(client, name)
    gauges = stream_gauges(client, keys)
    info: dict[str, Any] = {
        "model": name,
        "exists": cfg is not None,
        "redis": redact_url(redis_url) if redis_url else None,
        "kind": cfg.kind if cfg else None,
        "config": None,
        "classes": {},
        "learnt_total": 0.0,
        "version": "0-0",
        "streams": {k: int(gauges[k]) for k in ("in", "out", "dead", "log")},
        "lag": int(gauges["lag"]),
        "lag_exact": _lag_is_reported(client, keys),
        "pending": int(gauges["pending"]),
        "dead_letters": int(gauges["dead"]),
        "snapshot": None,
        "workers": [],
    }
    if cfg is not None:
        from streamnb_workers.replica import load_model, snapshot_age

        info["config"] = {"model_params": cfg.model_params, "featurizer": cfg.featurizer,
                          "decision": cfg.decision, "half_life": cfg.half_life,
                          "error_weight": cfg.error_weight}
        model, version = load_model(client, name)
        counts = model.stats["classes"]
        info["classes"] = {str(k): float(v) for k, v in counts.as_dict().items()}
        info["learnt_total"] = float(counts.total)
        info["version"] = version
        log_id = client.hget(keys.snapshot, "log_id")
        if log_id is not None:
            info["snapshot"] = {"log_id": as_str(log_id), "age_s": snapshot_age(client, keys)}
    now = time.time()
    for worker, hb in sorted(live_workers(client, keys, stale_s).items()):
        info["workers"].append({
            "name": worker, "host": hb.get("host"), "pid": hb.get("pid"),
            "age_s": round(max(0.0, now - float(hb.get("ts", now))), 3),
        })
    return info


def format_text(info: dict[str, Any]) -> str:
    """The status map as a few aligned lines for a terminal."""
    lines = [f"model      {info['model']}" + (f"  ({info['redis']})" if info.get("redis") else "")]
    if not info["exists"]:
        lines.append("           no stored config: no worker has served this model yet")
    else:
        lines.append(f"kind       {info['kind']}")
        lines.append(f"version    {info['version']}")
        lines.append(f"learnt     {info['learnt_total']:g}")
        for label, n in sorted(info["classes"].items(), key=lambda kv: -kv[1]):
            lines.append(f"  {label:<16} {n:g}")
    s = info["streams"]
    lag = f"{info['lag']}" + ("" if info["lag_exact"] else " (upper bound: XLEN)")
    lines.append(f"streams    in {s['in']}  out {s['out']}  dead {s['dead']}  log {s['log']}")
    lines.append(f"group      lag {lag}  pending {info['pending']}")
    lines.append(f"dead       {info['dead_letters']}")
    snap = info.get("snapshot")
    if snap:
        age = snap["age_s"]
        lines.append(f"snapshot   at {snap['log_id']}" + (f", {age:.0f} s old" if age is not None else ""))
    workers = info["workers"]
    lines.append(f"workers    {len(workers)} live")
    for w in workers:
        lines.append(f"  {w['name']:<24} host {w['host']} pid {w['pid']} (seen {w['age_s']:.1f} s ago)")
    return "\n".join(lines)
