"""Corrupted snapshots and :log entries: validated before use, rejected with a clear
message, never a crash loop (behaviour documented in docs/reliability.md).

- Unreadable snapshot, log never trimmed: logged, counted, ignored; the model is rebuilt
  from the whole log (equal to an offline fit) and the next snapshot overwrites it.
- Unreadable snapshot, log trimmed: the worker refuses to start with one line naming the
  key and what to do; ``streamnb worker`` exits 2, which the supervisor does not restart.
- Unreadable log entry: skipped whole (never half-applied), logged and counted; every
  replica skips the same entries, so all stay equal.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamnb.exceptions import FormatError
from streamnb.models import dumps as dump_model
from streamnb.models import make_model
from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.replication.replica import Replica, encode_decay, encode_delta
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import read_config
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    ROOT,
    assert_same_stats,
    count_spec,
    fast_options,
    offline_model,
    produce,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis

K = ModelKeys("mail")


def _first_array(obj):
    """The first encoded array map inside a decoded msgpack tree."""
    if isinstance(obj, dict):
        if set(obj) == {"dtype", "shape", "data"}:
            return obj
        for v in obj.values():
            found = _first_array(v)
            if found is not None:
                return found
    if isinstance(obj, list):
        for v in obj:
            found = _first_array(v)
            if found is not None:
                return found
    return None


def _edit(data: bytes, fn) -> bytes:
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    fn(obj)
    return msgpack.packb(obj, use_bin_type=True)


def _wrong_shape(obj) -> None:
    arr = _first_array(obj)
    arr["shape"] = [*arr["shape"][:-1], arr["shape"][-1] + 1]


def _nan_counts(obj) -> None:
    arr = _first_array(obj)
    arr["data"] = np.full(len(arr["data"]) // 8, np.nan).tobytes()


SNAPSHOT_CORRUPTIONS = {
    "garbage": lambda d: b"\x00\xffgarbage" * 10,
    "truncated": lambda d: d[: len(d) // 2],
    "empty": lambda d: b"",
    "wrong_type_tag": lambda d: _edit(d, lambda o: o.update(type="row")),
    "newer_version": lambda d: _edit(d, lambda o: o.update(v=99)),
    "wrong_shape": lambda d: _edit(d, _wrong_shape),
    "nan_counts": lambda d: _edit(d, _nan_counts),
    "other_width": lambda d: dump_model(make_model("multinomial", n_features=16).fit(
        np.eye(2, 16), ["spam", "ham"])),
    "other_kind": lambda d: dump_model(make_model("gaussian").fit(np.eye(2), ["spam", "ham"])),
}


def _snapshot(w) -> None:
    rt = w.models["mail"]
    assert rt.snapshotter.hold_lease() and rt.snapshotter.write(rt.replica)


def _learn(url: str, r, msgs, **kw):
    w = url_worker(url, [count_spec()], fast_options("w1", batch=10, **kw))
    produce(r, "mail", msgs)
    w.run_until_idle()
    _snapshot(w)
    w.shutdown()
    assert r.hget(K.snapshot, "data") is not None
    return w


def _replica(r) -> Replica:
    return Replica(r, K, read_config(r, "mail"))


@pytest.mark.parametrize("corruption", list(SNAPSHOT_CORRUPTIONS))
def test_corrupt_snapshot_with_whole_log_is_ignored_and_rebuilt(redis_server, corruption, caplog):
    r = redis_server.client()
    msgs = token_messages(60, seed=11)
    _learn(redis_server.url, r, msgs)
    good = r.hget(K.snapshot, "data")
    r.hset(K.snapshot, "data", SNAPSHOT_CORRUPTIONS[corruption](good))
    caplog.set_level(logging.ERROR, logger="streamnb_workers.replication.replica")

    rep = _replica(r).load()
    assert rep.snapshot_errors == 1 and rep.corrupt_entries == 0
    assert_same_stats(rep.model, offline_model("multinomial", PARAMS, FCFG, msgs))
    lines = [rec.getMessage() for rec in caplog.records
             if rec.name == "streamnb_workers.replication.replica"]
    assert len(lines) == 1 and "snapshot" in lines[0] and "unreadable" in lines[0]
    assert "rebuilding" in lines[0] and K.snapshot in lines[0]


def test_worker_serves_through_a_corrupt_snapshot_and_overwrites_it(redis_server):
    r = redis_server.client()
    msgs = token_messages(60, seed=12)
    _learn(redis_server.url, r, msgs)
    r.hset(K.snapshot, mapping={"data": b"junk", "log_id": b"not-an-id", "trimmed": b"??"})

    more = token_messages(40, seed=13)
    for m in more:
        m["id"] = "n" + m["id"]
    produce(r, "mail", more)
    metrics = Metrics(CollectorRegistry())
    w = url_worker(redis_server.url, [count_spec()], fast_options("w2", batch=10), metrics)
    w.run_until_idle()
    assert w.models["mail"].replica.snapshot_errors == 1
    assert metrics.corrupt_records.labels(model="mail", worker="w2", kind="snapshot")._value.get() == 1
    expected = offline_model("multinomial", PARAMS, FCFG, msgs + more)
    assert_same_stats(w.models["mail"].replica.model, expected)
    _snapshot(w)  # the lease holder's next snapshot replaces the garbled one
    w.shutdown()
    fresh = _replica(r).load()
    assert fresh.snapshot_errors == 0 and fresh.snapshot_version != "0-0"
    assert_same_stats(fresh.model, expected)


def test_corrupt_snapshot_with_trimmed_log_refuses_with_one_line(redis_server):
    r = redis_server.client()
    _learn(redis_server.url, r, token_messages(60, seed=14), trim_margin_ms=0)
    info = r.xinfo_stream(K.log)
    assert info["entries-added"] > info["length"]  # the snapshot made trimming possible
    r.hset(K.snapshot, "data", b"\x93garbage")

    with pytest.raises(FormatError) as exc:
        _replica(r).load()
    text = str(exc.value)
    assert K.snapshot in text and "trimmed" in text and "cannot be rebuilt" in text
    assert "backup" in text

    # the real command: one line on stderr, exit 2 (the supervisor never restarts code 2)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "streamnb_workers", "worker", "--redis", redis_server.url,
                           "--model", "mail", "--metrics-port", "0", "--log-level", "ERROR"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr
    assert any("cannot be rebuilt" in ln and K.snapshot in ln for ln in err), proc.stderr
    assert time.monotonic() - t0 < 30


# ------------------------------------------------------------------------------- :log
def _delta(msgs, **kw) -> bytes:
    model = offline_model("multinomial", PARAMS, FCFG, msgs)
    return encode_delta(model.stats, None, len(msgs), "evil", "b0", **kw)


def _bundle(msgs) -> bytes:
    return offline_model("multinomial", PARAMS, FCFG, msgs).stats.to_bytes()


def test_corrupt_log_entries_are_skipped_whole(redis_server, caplog):
    r = redis_server.client()
    good = token_messages(40, seed=15)
    w = _learn(redis_server.url, r, good[:20])
    extra = token_messages(5, seed=16)
    narrow = make_model("multinomial", n_features=16).fit(np.eye(2, 16), ["spam", "ham"])
    nan_bundle = _edit(_bundle(extra), _nan_counts)
    corrupt = [
        b"\x00garbage",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"t": "unknown"}),
        msgpack.packb({"t": "delta", "add": b"\x01\x02", "n": 5}),
        msgpack.packb({"t": "delta", "add": narrow.stats.to_bytes(), "n": 2}),
        msgpack.packb({"t": "delta", "add": nan_bundle, "n": 5}),
        # a valid add with a corrupt sub must not be half-applied
        msgpack.packb({"t": "delta", "add": _bundle(extra), "sub": b"junk", "n": 5}),
        msgpack.packb({"t": "delta", "add": _bundle(extra), "n": -5}),
        msgpack.packb({"t": "delta", "add": _bundle(extra), "n": "5"}),
        msgpack.packb({"t": "decay", "g": 2.0}),
        msgpack.packb({"t": "decay", "g": "half"}),
        msgpack.packb({"t": "decay", "g": float("nan")}),
        msgpack.packb({"t": "decay"}),
        msgpack.packb({"t": "drop", "c": [1]}),
        msgpack.packb({"t": "drop"}),
    ]
    for data in corrupt:
        r.xadd(K.log, {"data": data})
    r.xadd(K.log, {"nodata": b"x"})
    caplog.set_level(logging.ERROR, logger="streamnb_workers.replication.replica")
    produce(r, "mail", good[20:])
    metrics = Metrics(CollectorRegistry())
    w2 = url_worker(redis_server.url, [count_spec()], fast_options("w2"), metrics)
    w2.run_until_idle()
    assert metrics.corrupt_records.labels(model="mail", worker="w2", kind="log")._value.get() \
        == len(corrupt) + 1

    rep = w2.models["mail"].replica
    assert rep.corrupt_entries == len(corrupt) + 1
    assert rep.learnt == 20  # learnt since the snapshot (which holds the first 20)
    expected = offline_model("multinomial", PARAMS, FCFG, good)
    assert_same_stats(rep.model, expected)
    skipped = [rec.getMessage() for rec in caplog.records if "skipping" in rec.getMessage()]
    assert len(skipped) == len(corrupt) + 1
    # a replica built from the snapshot + log agrees with the one that tailed it
    other = _replica(r).load()
    assert other.corrupt_entries == len(corrupt) + 1
    assert_same_stats(other.model, expected)
    assert w.models["mail"].replica.version <= rep.version


def test_log_entry_validation_unit(redis_server):
    """A valid delta applies; the same delta behind a bad header does not."""
    r = redis_server.client()
    _learn(redis_server.url, r, token_messages(10, seed=17))
    rep = _replica(r).load()
    before = rep.model.stats.copy()
    extra = token_messages(3, seed=18)
    rep.apply("9999999999999-0", {b"data": _delta(extra)})
    assert rep.corrupt_entries == 0
    rep.apply("9999999999999-1", {b"data": encode_decay(0.5)})
    rep.apply("9999999999999-2", {b"data": _edit(_delta(extra), lambda o: o.update(n=None))})
    assert rep.corrupt_entries == 1
    want = offline_model("multinomial", PARAMS, FCFG, extra).stats
    before.merge(want).scale(0.5)
    for name, part in before.parts.items():
        got = rep.model.stats.parts[name]
        np.testing.assert_allclose(np.asarray(getattr(got, "values", getattr(got, "counts", None))),
                                   np.asarray(getattr(part, "values", getattr(part, "counts", None))))
