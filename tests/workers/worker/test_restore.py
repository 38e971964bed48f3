"""The restore script (workers/worker/restore.py) on fakeredis and a real redis-server: what is
written back, by whom, and when the group is made."""

from __future__ import annotations

from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config, read_config
from streamnb_workers.worker.restore import missing_keys, restore_model_keys

K = ModelKeys("doc")


def _config(r):
    cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 4}))
    r.flushall()
    return cfg


def _groups(r) -> list[str]:
    try:
        return [g["name"].decode() for g in r.xinfo_groups(K.input)]
    except Exception:  # noqa: BLE001 - no stream
        return []


def test_the_most_advanced_replica_becomes_the_snapshot_while_the_group_settles(r):
    cfg = _config(r)
    assert missing_keys(r, K, "5-0") == ["config", "group", "snapshot"]
    assert missing_keys(r, K, "0-0") == ["config", "group"]
    wait = 60_000
    assert restore_model_keys(r, cfg, "w1", "5-0", b"five", 1000, wait) == \
        ["config", "snapshot", "settling"]
    assert _groups(r) == [] and read_config(r, "doc") == cfg
    # a worker that had applied more offers its replica: it replaces the first
    assert "snapshot" in missing_keys(r, K, "7-0")
    assert restore_model_keys(r, cfg, "w2", "7-0", b"seven", 1000, wait) == ["snapshot", "settling"]
    # one that had applied less does not
    assert missing_keys(r, K, "6-0") == ["group"]
    assert restore_model_keys(r, cfg, "w3", "6-0", b"six", 1000, wait) == ["settling"]
    snap = r.hgetall(K.snapshot)
    assert (snap[b"log_id"], snap[b"data"], snap[b"trimmed"]) == (b"7-0", b"seven", b"7-0")
    assert r.get(K.lease) == b"w2"
    # the settling time over, the group is made (read from 0: what was produced meanwhile)
    r.xadd(K.input, {"data": b"x"})
    assert restore_model_keys(r, cfg, "w3", "0-0", b"", 1000, 0) == ["group"]
    assert _groups(r) == [GROUP]
    assert r.xinfo_groups(K.input)[0]["last-delivered-id"] == b"0-0"
    assert missing_keys(r, K, "7-0") == []


def test_nothing_replaces_a_snapshot_once_the_log_moved_on(r):
    cfg = _config(r)
    restore_model_keys(r, cfg, "w1", "5-0", b"five", 1000, 0)
    r.xadd(K.log, {"data": b"delta"})  # a commit after the restore
    assert missing_keys(r, K, "9-0") == []
    assert restore_model_keys(r, cfg, "w2", "9-0", b"nine", 1000, 0) == []
    assert r.hget(K.snapshot, "log_id") == b"5-0"


def test_a_regular_snapshot_is_never_replaced(r):
    cfg = ensure_config(r, ModelSpec("doc", kind="multinomial", featurizer_config={"bits": 4}))
    r.hset(K.snapshot, mapping={"log_id": "5-0", "data": b"real", "trimmed": "5-0"})
    assert restore_model_keys(r, cfg, "w2", "9-0", b"nine", 1000, 0) == ["group"]
    assert r.hget(K.snapshot, "data") == b"real"


def test_the_score_window_goes_back_with_the_snapshot_it_belongs_to(r):
    cfg = _config(r)
    wait = 60_000
    restore_model_keys(r, cfg, "w1", "5-0", b"five", 1000, wait, scores=b"window at 5")
    assert r.hget(K.snapshot, "scores") == b"window at 5"
    # a more advanced replica without a window replaces both
    restore_model_keys(r, cfg, "w2", "7-0", b"seven", 1000, wait)
    assert r.hget(K.snapshot, "data") == b"seven" and r.hget(K.snapshot, "scores") is None
